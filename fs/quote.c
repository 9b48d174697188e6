/* fs/quote — Go strconv.Quote; see quote.h. */
#include "fs/quote.h"

#include "fs/utf8.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

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
    uint32_t r = fs_utf8_rune(p + i, len - i, &w);
    if (r == FS_RUNE_ERROR && w == 1) {
      k += (size_t)sprintf(out + k, "\\x%02x", p[i]);
    } else if (r == '"' || r == '\\') {
      out[k++] = '\\';
      out[k++] = (char)r;
    } else if (quote_printable(r)) {
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
