/* text — UTF-8, JSON string literals, Go quoting; see text.h (base64:
 * text_b64.c). */
#include "proto/text.h"

#include <stdlib.h>
#include <string.h>

static const char text_hex[] = "0123456789abcdef";

/* ---------------------------------------------------------------- UTF-8 */

size_t text_utf8_seq(const unsigned char *p, size_t avail) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    if (avail < 2 || (p[1] & 0xC0) != 0x80) return 0;
    return 2;
  }
  if (c >= 0xE0 && c <= 0xEF) {
    if (avail < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && p[1] < 0xA0) return 0;  /* overlong */
    if (c == 0xED && p[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (avail < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
      return 0;
    if (c == 0xF0 && p[1] < 0x90) return 0;  /* overlong */
    if (c == 0xF4 && p[1] >= 0x90) return 0; /* > U+10FFFF */
    return 4;
  }
  return 0; /* continuation byte, C0/C1 (always overlong), F5..FF */
}

uint32_t text_utf8_rune(const unsigned char *s, size_t n, size_t *w) {
  if (n == 0) {
    *w = 0;
    return TEXT_RUNE_ERROR;
  }
  size_t k = text_utf8_seq(s, n);
  if (k == 0) {
    *w = 1;
    return TEXT_RUNE_ERROR;
  }
  *w = k;
  switch (k) {
  case 1: return s[0];
  case 2: return (uint32_t)(s[0] & 0x1F) << 6 | (s[1] & 0x3F);
  case 3: return (uint32_t)(s[0] & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
  default:
    return (uint32_t)(s[0] & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 |
           (s[3] & 0x3F);
  }
}

int text_utf8_valid(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s, *end = p + n;
  while (p < end) {
    if (*p < 0x80) {
      p++;
      continue;
    }
    size_t k = text_utf8_seq(p, (size_t)(end - p));
    if (k == 0) return 0;
    p += k;
  }
  return 1;
}

size_t text_utf8_put(unsigned char *o, uint32_t cp) {
  if (cp < 0x80) {
    o[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (unsigned char)(0xC0 | cp >> 6);
    o[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (unsigned char)(0xE0 | cp >> 12);
    o[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    o[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (unsigned char)(0xF0 | cp >> 18);
  o[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  o[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  o[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* Bytes that stand for themselves in a JSON string. */
static const unsigned char text_plain[256] = {[0x20 ... 0x21] = 1, [0x23 ... 0x5b] = 1, [0x5d ... 0x7f] = 1};

const unsigned char *text_plain_run(const unsigned char *s, const unsigned char *end) {
  const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  while (end - s >= 8) {
    uint64_t x, q, b;
    memcpy(&x, s, 8);
    q = x ^ (ones * '"');
    b = x ^ (ones * '\\');
    /* a byte < 0x20, == '"' or == '\\' (zero after the xor), or >= 0x80 */
    if ((((x - ones * 0x20) & ~x) | ((q - ones) & ~q) | ((b - ones) & ~b) | x) & highs) break;
    s += 8;
  }
  while (s < end && text_plain[*s]) s++;
  return s;
}

int text_is_space(uint32_t r) {
  switch (r) {
  case '\t': case '\n': case '\v': case '\f': case '\r': case ' ':
  case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
  case 0x205F: case 0x3000:
    return 1;
  }
  return r >= 0x2000 && r <= 0x200A;
}

int text_is_control(uint32_t r) { return r < 0x20 || (r >= 0x7F && r < 0xA0); }

static int is_format(uint32_t r) {
  return r == 0xAD || (r >= 0x600 && r <= 0x605) || r == 0x61C || r == 0x6DD || r == 0x70F ||
         r == 0x180E || (r >= 0x200B && r <= 0x200F) || (r >= 0x202A && r <= 0x202E) ||
         (r >= 0x2060 && r <= 0x206F) || r == 0xFEFF || (r >= 0xFFF9 && r <= 0xFFFB);
}

int text_is_print(uint32_t r) {
  if (r == ' ') return 1;
  if (r > 0x10FFFF || (r >= 0xD800 && r <= 0xDFFF)) return 0;
  if (text_is_control(r) || text_is_space(r) || is_format(r)) return 0;
  if ((r >= 0xE000 && r <= 0xF8FF) || r >= 0xF0000) return 0; /* private use */
  if ((r & 0xFFFE) == 0xFFFE) return 0;                        /* noncharacters */
  if (r >= 0xFDD0 && r <= 0xFDEF) return 0;
  return 1;
}

/* ---------------------------------------------------------------- writers */

/* Both writers append to out at k, or only count when out is NULL. */
#define PUT(p, l)                                \
  do {                                           \
    if (out) memcpy(out + k, (p), (l));          \
    k += (l);                                    \
  } while (0)

size_t text_json_string(char *out, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str, *end = s + n, *run = s;
  size_t k = 0;
  PUT("\"", 1);
  while (s < end) {
    s = text_plain_run(s, end);
    if (s == end) break;
    unsigned c = *s;
    if (c >= 0x80) {
      size_t l = text_utf8_seq(s, (size_t)(end - s));
      if (l) { /* valid UTF-8 stays in the run */
        s += l;
        continue;
      }
    }
    PUT(run, (size_t)(s - run));
    switch (c) {
    case '"': PUT("\\\"", 2); break;
    case '\\': PUT("\\\\", 2); break;
    case '\b': PUT("\\b", 2); break;
    case '\f': PUT("\\f", 2); break;
    case '\n': PUT("\\n", 2); break;
    case '\r': PUT("\\r", 2); break;
    case '\t': PUT("\\t", 2); break;
    default:
      if (c < 0x20) {
        char u[6] = {'\\', 'u', '0', '0', text_hex[c >> 4], text_hex[c & 15]};
        PUT(u, 6);
      } else {
        PUT("\\ufffd", 6); /* not UTF-8 */
      }
    }
    s++;
    run = s;
  }
  PUT(run, (size_t)(s - run));
  PUT("\"", 1);
  return k;
}

size_t text_go_quote(char *out, const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t k = 0, i = 0;
  PUT("\"", 1);
  while (i < n) {
    size_t w;
    uint32_t r = text_utf8_rune(s + i, n - i, &w);
    char e[10];
    if (r == TEXT_RUNE_ERROR && w == 1) {
      e[0] = '\\', e[1] = 'x', e[2] = text_hex[s[i] >> 4], e[3] = text_hex[s[i] & 15];
      PUT(e, 4);
    } else if (r == '"' || r == '\\') {
      e[0] = '\\', e[1] = (char)r;
      PUT(e, 2);
    } else if (text_is_print(r)) {
      PUT(s + i, w);
    } else {
      static const char named[] = "\a\b\f\n\r\t\v", names[] = "abfnrtv";
      const char *c = r && r < 0x20 ? strchr(named, (int)r) : NULL;
      if (c) {
        e[0] = '\\', e[1] = names[c - named];
        PUT(e, 2);
      } else {
        int digits = r < 0x80 ? 2 : r < 0x10000 ? 4 : 8;
        e[0] = '\\', e[1] = digits == 2 ? 'x' : digits == 4 ? 'u' : 'U';
        for (int d = 0; d < digits; d++) e[2 + d] = text_hex[r >> (4 * (digits - 1 - d)) & 15];
        PUT(e, (size_t)digits + 2);
      }
    }
    i += w;
  }
  PUT("\"", 1);
  return k;
}

#undef PUT

/* ---------------------------------------------------------------- small forms */

char *text_u64_dec(char *end, uint64_t v) {
  do {
    *--end = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  return end;
}

static int is_odigit(char c) { return c >= '0' && c <= '7'; }

size_t text_octal_unescape(char *out, const char *s, size_t n) {
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '\\' && n - i > 3 && s[i + 1] >= '0' && s[i + 1] <= '3' && is_odigit(s[i + 2]) &&
        is_odigit(s[i + 3])) {
      out[k++] = (char)((s[i + 1] - '0') << 6 | (s[i + 2] - '0') << 3 | (s[i + 3] - '0'));
      i += 3;
    } else {
      out[k++] = s[i];
    }
  }
  return k;
}

char *text_go_quote_dup(const char *s, size_t n) {
  if (n > (SIZE_MAX - 3) / 4) return NULL;
  size_t len = text_go_quote(NULL, s, n);
  char *out = malloc(len + 1);
  if (!out) return NULL;
  text_go_quote(out, s, n);
  out[len] = 0;
  return out;
}
