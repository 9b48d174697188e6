/* upgrade_run — the pure checks of an Upgrade; see upgrade.h.  (Its trial
 * child is proc_spawn's, agent/upgrade.c.) */
#include "agent/upgrade.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__)
#define UP_MACHINE EM_X86_64
#define UP_ARCH "x86-64"
#elif defined(__aarch64__)
#define UP_MACHINE EM_AARCH64
#define UP_ARCH "arm64"
#else
#define UP_MACHINE EM_NONE /* not checked */
#define UP_ARCH "other"
#endif
#if __SIZEOF_POINTER__ == 8
#define UP_CLASS ELFCLASS64
#else
#define UP_CLASS ELFCLASS32
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define UP_DATA ELFDATA2LSB
#else
#define UP_DATA ELFDATA2MSB
#endif

int upgrade_elf_check(const uint8_t *h, size_t n, char *why, size_t whylen) {
  if (n < 20 || memcmp(h, ELFMAG, SELFMAG) != 0 ||
      (h[EI_DATA] != ELFDATA2LSB && h[EI_DATA] != ELFDATA2MSB)) {
    snprintf(why, whylen, "not an ELF executable");
    return -1;
  }
  /* e_type at 16, e_machine at 18 in both classes, in the file's byte order */
  int le = h[EI_DATA] == ELFDATA2LSB;
  unsigned type = le ? (unsigned)(h[16] | h[17] << 8) : (unsigned)(h[16] << 8 | h[17]);
  unsigned machine = le ? (unsigned)(h[18] | h[19] << 8) : (unsigned)(h[18] << 8 | h[19]);
  if (type != ET_EXEC && type != ET_DYN) {
    snprintf(why, whylen, "not an ELF executable");
    return -1;
  }
  if (UP_MACHINE != EM_NONE && machine != UP_MACHINE) {
    snprintf(why, whylen, "not an %s executable (ELF machine %u)", UP_ARCH, machine);
    return -1;
  }
  if (h[EI_CLASS] != UP_CLASS || h[EI_DATA] != UP_DATA) {
    snprintf(why, whylen, "not an %s executable (%s ELF)", UP_ARCH,
             h[EI_DATA] != UP_DATA ? "byte order of another" : "word size of another");
    return -1;
  }
  return 0;
}

int upgrade_parse_version(const char *out, size_t n, char *ver) {
  static const char pre[] = "conch-init ";
  size_t pl = sizeof pre - 1;
  if (n < pl || memcmp(out, pre, pl) != 0) return -1;
  size_t i = pl;
  while (i < n && i - pl <= UPGRADE_VERSION_MAX) {
    char ch = out[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '.' ||
          ch == '+' || ch == '~' || ch == '_' || ch == '-'))
      break;
    i++;
  }
  size_t vl = i - pl;
  if (vl == 0 || vl > UPGRADE_VERSION_MAX) return -1;
  /* the line ends here */
  if (i < n && out[i] != '\n' && !(out[i] == '\r' && i + 1 < n && out[i + 1] == '\n')) return -1;
  memcpy(ver, out + pl, vl);
  ver[vl] = 0;
  return 0;
}
