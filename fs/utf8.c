/* fs/utf8 — see utf8.h. */
#include "fs/utf8.h"

uint32_t fs_utf8_rune(const unsigned char *s, size_t n, size_t *w) {
  if (n == 0) {
    *w = 0;
    return FS_RUNE_ERROR;
  }
  unsigned c = s[0];
  *w = 1;
  if (c < 0x80) return c;
  uint32_t r, min;
  size_t need;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2; r = c & 0x1F; min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3; r = c & 0x0F; min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4; r = c & 0x07; min = 0x10000;
  } else {
    return FS_RUNE_ERROR;
  }
  if (n < need) return FS_RUNE_ERROR;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80) return FS_RUNE_ERROR;
    r = (r << 6) | (s[i] & 0x3F);
  }
  if (r < min || r > 0x10FFFF || (r >= 0xD800 && r <= 0xDFFF)) return FS_RUNE_ERROR;
  *w = need;
  return r;
}
