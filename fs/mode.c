/* fs/mode — Go FileMode.String(); see mode.h. */
#include "fs/mode.h"

#include <sys/stat.h>

char *fs_mode_string(mode_t m, char *out) {
  /* Go: "dalTLDpSugct?" — one letter per set bit, in this order. */
  int is_dir = S_ISDIR(m), is_lnk = S_ISLNK(m), is_blk = S_ISBLK(m), is_chr = S_ISCHR(m);
  int is_fifo = S_ISFIFO(m), is_sock = S_ISSOCK(m);
  size_t w = 0;
  if (is_dir) out[w++] = 'd';
  if (is_lnk) out[w++] = 'L';
  if (is_blk || is_chr) out[w++] = 'D';
  if (is_fifo) out[w++] = 'p';
  if (is_sock) out[w++] = 'S';
  if (m & S_ISUID) out[w++] = 'u';
  if (m & S_ISGID) out[w++] = 'g';
  if (is_chr) out[w++] = 'c';
  if (m & S_ISVTX) out[w++] = 't';
  if (w == 0) out[w++] = '-';
  static const char rwx[] = "rwxrwxrwx";
  for (int i = 0; i < 9; i++) out[w++] = (m & (1u << (8 - i))) ? rwx[i] : '-';
  out[w] = 0;
  return out;
}
