/* fs/path — remote path validation; see path.h. */
#include "fs/path.h"

#include <stdio.h>
#include <string.h>

int fs_path_is_clean(const char *p, size_t len) {
  if (len == 0 || p[0] != '/') return 0;
  if (len == 1) return 1; /* "/" */
  if (p[len - 1] == '/') return 0;
  /* Every component between slashes must be non-empty, "." and ".." are
   * not allowed (Clean would remove them; "/.." cleans to "/"). */
  size_t i = 1;
  while (i <= len) {
    size_t j = i;
    while (j < len && p[j] != '/') j++;
    size_t n = j - i;
    if (n == 0) return 0;
    if (n == 1 && p[i] == '.') return 0;
    if (n == 2 && p[i] == '.' && p[i + 1] == '.') return 0;
    i = j + 1;
  }
  return 1;
}

int fs_path_check(const char *p, size_t len, const char *op, char *err, size_t errlen) {
  if (len == 0) {
    snprintf(err, errlen, "filepath is required for %s", op);
    return -1;
  }
  if (memchr(p, 0, len)) {
    snprintf(err, errlen, "filepath contains a NUL byte for %s", op);
    return -1;
  }
  if (!fs_path_is_clean(p, len)) {
    snprintf(err, errlen, "filepath must be a normalized absolute guest path for %s", op);
    return -1;
  }
  return 0;
}

const char *fs_path_base(const char *p) {
  const char *s = strrchr(p, '/');
  if (!s) return p;
  if (s[1] == 0 && s == p) return p; /* "/" */
  return s + 1;
}

size_t fs_path_dir_len(const char *p) {
  const char *s = strrchr(p, '/');
  if (!s || s == p) return 1;
  return (size_t)(s - p);
}
