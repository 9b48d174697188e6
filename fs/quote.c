/* fs/quote — Go strconv.Quote; see quote.h. */
#include "fs/quote.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Decode one UTF-8 rune; invalid → -1 with width 1. */
static int32_t quote_rune(const unsigned char *s, size_t n, size_t *w) {
  unsigned c = s[0];
  *w = 1;
  if (c < 0x80) return (int32_t)c;
  uint32_t r, min;
  size_t need;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2; r = c & 0x1F; min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3; r = c & 0x0F; min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4; r = c & 0x07; min = 0x10000;
  } else {
    return -1;
  }
  if (n < need) return -1;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80) return -1;
    r = (r << 6) | (s[i] & 0x3F);
  }
  if (r < min || r > 0x10FFFF || (r >= 0xD800 && r <= 0xDFFF)) return -1;
  *w = need;
  return (int32_t)r;
}

static int quote_printable(uint32_t r) {
  if (r < 0x20 || r == 0x7F) return 0;
  if (r < 0x7F) return 1;
  if (r <= 0xA0 || r == 0xAD) return 0;               /* C1 controls, NBSP, soft hyphen */
  if (r == 0x1680 || (r >= 0x2000 && r <= 0x200F)) return 0; /* spaces, ZW*, marks */
  if (r >= 0x2028 && r <= 0x202F) return 0;
  if (r >= 0x205F && r <= 0x206F) return 0;
  if (r == 0x3000 || r == 0xFEFF) return 0;
  if (r >= 0xE000 && r <= 0xF8FF) return 0;            /* private use */
  if (r >= 0xFFF9 && r <= 0xFFFB) return 0;
  if (r == 0xFFFE || r == 0xFFFF) return 0;
  if (r >= 0xF0000) return 0;                          /* private use planes */
  return 1;
}

char *fs_go_quote(const char *s, size_t len) {
  /* Worst case: every byte → \xNN (4), or a rune → \UNNNNNNNN (10 for
   * >= 4 bytes, i.e. <= 2.5 per byte); so 4 per byte + quotes + NUL. */
  if (len > (SIZE_MAX - 3) / 4) return NULL;
  char *out = malloc(len * 4 + 3);
  if (!out) return NULL;
  size_t k = 0;
  out[k++] = '"';
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  while (i < len) {
    size_t w;
    int32_t r = quote_rune(p + i, len - i, &w);
    if (r < 0) {
      k += (size_t)sprintf(out + k, "\\x%02x", p[i]);
    } else if (r == '"' || r == '\\') {
      out[k++] = '\\';
      out[k++] = (char)r;
    } else if (quote_printable((uint32_t)r)) {
      for (size_t j = 0; j < w; j++) out[k++] = (char)p[i + j];
    } else {
      switch (r) {
        case '\a': out[k++] = '\\'; out[k++] = 'a'; break;
        case '\b': out[k++] = '\\'; out[k++] = 'b'; break;
        case '\f': out[k++] = '\\'; out[k++] = 'f'; break;
        case '\n': out[k++] = '\\'; out[k++] = 'n'; break;
        case '\r': out[k++] = '\\'; out[k++] = 'r'; break;
        case '\t': out[k++] = '\\'; out[k++] = 't'; break;
        case '\v': out[k++] = '\\'; out[k++] = 'v'; break;
        default:
          if (r < 0x20 || r == 0x7F)
            k += (size_t)sprintf(out + k, "\\x%02x", (unsigned)r);
          else if (r < 0x10000)
            k += (size_t)sprintf(out + k, "\\u%04x", (unsigned)r);
          else
            k += (size_t)sprintf(out + k, "\\U%08x", (unsigned)r);
      }
    }
    i += w;
  }
  out[k++] = '"';
  out[k] = 0;
  return out;
}
