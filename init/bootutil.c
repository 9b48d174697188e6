/* bootutil — passwd fix-up, mountinfo lookup, small-file reads; see bootutil.h. */
#include "init/bootutil.h"
#include "proto/text.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int boot_mountinfo_has(const char *text, size_t n, const char *mountpoint) {
  size_t i = 0;
  while (i < n) {
    size_t e = i;
    while (e < n && text[e] != '\n') e++;
    /* field 5 (index 4) is the mount point */
    size_t f = i;
    for (int k = 0; k < 4 && f < e; k++) {
      while (f < e && text[f] != ' ') f++;
      if (f < e) f++;
    }
    size_t fe = f;
    while (fe < e && text[fe] != ' ') fe++;
    char mp[4096];
    if (fe > f && fe - f < sizeof mp) {
      size_t m = text_octal_unescape(mp, text + f, fe - f);
      mp[m] = 0;
      if (strcmp(mp, mountpoint) == 0) return 1;
    }
    i = e + 1;
  }
  return 0;
}

int boot_passwd_fix(const char *in, size_t n, char **out, size_t *outn) {
  size_t ls = 0;
  while (ls < n) {
    size_t le = ls;
    while (le < n && in[le] != '\n') le++;
    if (le - ls >= 5 && memcmp(in + ls, "root:", 5) == 0) {
      /* find field 6 (index 5): after the 5th ':' up to the next ':' or EOL */
      size_t f = ls;
      int colons = 0;
      while (f < le && colons < 5) {
        if (in[f] == ':') colons++;
        f++;
      }
      if (colons < 5) return 0; /* malformed: leave it */
      size_t fe = f;
      while (fe < le && in[fe] != ':') fe++;
      if (fe - f == 5 && memcmp(in + f, "/root", 5) == 0) return 0;
      size_t nn = n - (fe - f) + 5;
      char *o = malloc(nn + 1);
      if (!o) return -1;
      memcpy(o, in, f);
      memcpy(o + f, "/root", 5);
      memcpy(o + f + 5, in + fe, n - fe);
      o[nn] = 0;
      *out = o;
      *outn = nn;
      return 1;
    }
    ls = le + 1;
  }
  return 0;
}

char *boot_read_file(const char *path, size_t *len) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap + 1);
  while (buf) {
    if (n == cap) {
      if (cap >= BOOT_MAX_TEXT_FILE) {
        free(buf);
        buf = NULL;
        errno = EFBIG;
        break;
      }
      char *nb = realloc(buf, cap * 2 + 1);
      if (!nb) {
        free(buf);
        buf = NULL;
        break;
      }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + n, cap - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      free(buf);
      buf = NULL;
      break;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  int e = errno;
  close(fd);
  errno = e; /* the caller reports why a read failed */
  if (buf) {
    buf[n] = 0;
    *len = n;
  }
  return buf;
}
