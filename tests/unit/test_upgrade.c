/* test_upgrade — the pure checks of the Upgrade RPC (agent/upgrade.h): the
 * ELF header check and the --version line.  The RPC itself:
 * tests/integration/test_upgrade.py. */
#include <elf.h>
#include <fcntl.h>
#include <unistd.h>

#include "agent/upgrade.h"
#include "tests/unit/test.h"

#if defined(__x86_64__)
#define MY_MACHINE EM_X86_64
#define OTHER_MACHINE EM_AARCH64
#else
#define MY_MACHINE EM_AARCH64
#define OTHER_MACHINE EM_X86_64
#endif

/* An ELF header: class, byte order, type, machine. */
static void hdr(uint8_t *h, int cls, int data, unsigned type, unsigned machine) {
  memset(h, 0, 64);
  memcpy(h, ELFMAG, SELFMAG);
  h[EI_CLASS] = (uint8_t)cls;
  h[EI_DATA] = (uint8_t)data;
  h[EI_VERSION] = EV_CURRENT;
  if (data == ELFDATA2LSB) {
    h[16] = (uint8_t)type, h[17] = (uint8_t)(type >> 8);
    h[18] = (uint8_t)machine, h[19] = (uint8_t)(machine >> 8);
  } else {
    h[17] = (uint8_t)type, h[16] = (uint8_t)(type >> 8);
    h[19] = (uint8_t)machine, h[18] = (uint8_t)(machine >> 8);
  }
}

TEST(elf_own_machine) {
  uint8_t h[64];
  char why[128] = "";
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_DYN, MY_MACHINE);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), 0);
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_EXEC, MY_MACHINE);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), 0);
}

TEST(elf_this_binary) { /* the test program itself passes */
  uint8_t h[64];
  char why[128] = "";
  int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT(fd >= 0);
  ASSERT_EQ(read(fd, h, sizeof h), 64);
  close(fd);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), 0);
}

TEST(elf_refusals) {
  uint8_t h[64];
  char why[128];
  memcpy(h, "#!/bin/sh\necho conch-init 1\n", 28);
  ASSERT_EQ(upgrade_elf_check(h, 28, why, sizeof why), -1);
  ASSERT_STR_EQ(why, "not an ELF executable");
  ASSERT_EQ(upgrade_elf_check(h, 0, why, sizeof why), -1);
  ASSERT_STR_EQ(why, "not an ELF executable");
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_DYN, MY_MACHINE);
  ASSERT_EQ(upgrade_elf_check(h, 19, why, sizeof why), -1); /* cut short */
  ASSERT_STR_EQ(why, "not an ELF executable");
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_REL, MY_MACHINE); /* an object file */
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  ASSERT_STR_EQ(why, "not an ELF executable");
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_CORE, MY_MACHINE);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  hdr(h, ELFCLASS64, 7, ET_EXEC, MY_MACHINE); /* no byte order */
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  ASSERT_STR_EQ(why, "not an ELF executable");
}

TEST(elf_foreign) {
  uint8_t h[64];
  char why[128], want[128];
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_EXEC, OTHER_MACHINE);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
#if defined(__x86_64__)
  snprintf(want, sizeof want, "not an x86-64 executable (ELF machine %u)", (unsigned)OTHER_MACHINE);
#else
  snprintf(want, sizeof want, "not an arm64 executable (ELF machine %u)", (unsigned)OTHER_MACHINE);
#endif
  ASSERT_STR_EQ(why, want);
  hdr(h, ELFCLASS64, ELFDATA2LSB, ET_EXEC, EM_RISCV);
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  ASSERT(strstr(why, "(ELF machine 243)") != NULL);
  hdr(h, ELFCLASS32, ELFDATA2LSB, ET_EXEC, MY_MACHINE); /* x32 or ILP32 */
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  ASSERT(strstr(why, "(word size of another ELF)") != NULL);
  hdr(h, ELFCLASS64, ELFDATA2MSB, ET_EXEC, MY_MACHINE); /* big-endian, machine read as such */
  ASSERT_EQ(upgrade_elf_check(h, 64, why, sizeof why), -1);
  ASSERT(strstr(why, "(byte order of another ELF)") != NULL);
}

static int ver(const char *out, char *v) { return upgrade_parse_version(out, strlen(out), v); }

TEST(version_line) {
  char v[UPGRADE_VERSION_MAX + 1];
  ASSERT_EQ(ver("conch-init 0.1.0\n", v), 0);
  ASSERT_STR_EQ(v, "0.1.0");
  ASSERT_EQ(ver("conch-init 0.2.0-rc1+g1234abc\nmore lines\n", v), 0);
  ASSERT_STR_EQ(v, "0.2.0-rc1+g1234abc");
  ASSERT_EQ(ver("conch-init 1.0", v), 0); /* no newline at the end */
  ASSERT_STR_EQ(v, "1.0");
  ASSERT_EQ(ver("conch-init 1.0\r\n", v), 0);
  ASSERT_STR_EQ(v, "1.0");
  char longest[128] = "conch-init ";
  memset(longest + 11, '7', UPGRADE_VERSION_MAX);
  longest[11 + UPGRADE_VERSION_MAX] = 0;
  ASSERT_EQ(ver(longest, v), 0);
  ASSERT_EQ(strlen(v), UPGRADE_VERSION_MAX);
}

TEST(version_refused) {
  char v[UPGRADE_VERSION_MAX + 1];
  ASSERT_EQ(ver("", v), -1);
  ASSERT_EQ(ver("\n", v), -1);
  ASSERT_EQ(ver("conch-init\n", v), -1);
  ASSERT_EQ(ver("conch-init \n", v), -1);
  ASSERT_EQ(ver("conch-init 1.0 extra\n", v), -1);
  ASSERT_EQ(ver("conch-init \"1.0\"\n", v), -1); /* no quotes: it goes into JSON */
  ASSERT_EQ(ver("Conch-init 1.0\n", v), -1);
  ASSERT_EQ(ver("other 1.0\n", v), -1);
  ASSERT_EQ(ver("\nconch-init 1.0\n", v), -1); /* the first line only */
  ASSERT_EQ(ver("conch-init 1.0\rx", v), -1);
  char toolong[128] = "conch-init ";
  memset(toolong + 11, '7', UPGRADE_VERSION_MAX + 1);
  toolong[12 + UPGRADE_VERSION_MAX] = 0;
  ASSERT_EQ(ver(toolong, v), -1);
  ASSERT_EQ(upgrade_parse_version("conch-init 1.0", 12, v), 0); /* n counts, not the NUL */
  ASSERT_STR_EQ(v, "1");
}

int main(void) {
  RUN(elf_own_machine);
  RUN(elf_this_binary);
  RUN(elf_refusals);
  RUN(elf_foreign);
  RUN(version_line);
  RUN(version_refused);
  return test_summary();
}
