/* initstr — text helpers of the init protocol; see initstr.h. */
#include "init/initstr.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int istr_grow(istr *b, size_t extra) {
  if (b->oom) return -1;
  if (b->n + extra + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->n + extra + 1) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void istr_add(istr *b, const char *s, size_t n) {
  if (istr_grow(b, n) != 0) return;
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

void istr_adds(istr *b, const char *s) { istr_add(b, s, strlen(s)); }

void istr_addf(istr *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int w = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (w < 0) {
    b->oom = 1;
    return;
  }
  if ((size_t)w < sizeof tmp) {
    istr_add(b, tmp, (size_t)w);
    return;
  }
  if (istr_grow(b, (size_t)w) != 0) return;
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)w + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)w;
}

char *istr_take(istr *b, size_t *len) {
  if (b->oom) {
    istr_free(b);
    return NULL;
  }
  if (!b->p) istr_add(b, "", 0);
  if (b->oom) return NULL;
  char *p = b->p;
  if (len) *len = b->n;
  b->p = NULL;
  b->n = b->cap = 0;
  return p;
}

void istr_free(istr *b) {
  free(b->p);
  b->p = NULL;
  b->n = b->cap = 0;
  b->oom = 0;
}

int32_t initstr_rune(const unsigned char *s, size_t n, size_t *w) {
  unsigned c = s[0];
  *w = 1;
  if (c < 0x80) return (int32_t)c;
  size_t need;
  uint32_t r, min;
  if (c >= 0xc2 && c <= 0xdf) {
    need = 2; r = c & 0x1f; min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    need = 3; r = c & 0x0f; min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 4; r = c & 0x07; min = 0x10000;
  } else {
    return -1;
  }
  if (n < need) return -1;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xc0) != 0x80) return -1;
    r = (r << 6) | (s[i] & 0x3f);
  }
  if (r < min || r > 0x10ffff || (r >= 0xd800 && r <= 0xdfff)) return -1;
  *w = need;
  return (int32_t)r;
}

int initstr_is_space(int32_t r) {
  switch (r) {
    case '\t': case '\n': case '\v': case '\f': case '\r': case ' ':
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f:
    case 0x205f: case 0x3000:
      return 1;
  }
  return r >= 0x2000 && r <= 0x200a;
}

int initstr_is_control(int32_t r) { return (r >= 0 && r < 0x20) || (r >= 0x7f && r < 0xa0); }

static int is_format(int32_t r) {
  return r == 0xad || (r >= 0x600 && r <= 0x605) || r == 0x61c || r == 0x6dd || r == 0x70f ||
         r == 0x180e || (r >= 0x200b && r <= 0x200f) || (r >= 0x202a && r <= 0x202e) ||
         (r >= 0x2060 && r <= 0x206f) || r == 0xfeff || (r >= 0xfff9 && r <= 0xfffb);
}

static int is_printable(int32_t r) {
  if (r == ' ') return 1;
  if (initstr_is_control(r) || initstr_is_space(r) || is_format(r)) return 0;
  if ((r >= 0xe000 && r <= 0xf8ff) || r >= 0xf0000) return 0; /* private use */
  if ((r & 0xfffe) == 0xfffe) return 0;                        /* noncharacters */
  if (r >= 0xfdd0 && r <= 0xfdef) return 0;
  return 1;
}

void istr_quote(istr *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  istr_add(b, "\"", 1);
  size_t i = 0;
  while (i < n) {
    size_t w;
    int32_t r = initstr_rune(u + i, n - i, &w);
    if (r < 0) {
      istr_addf(b, "\\x%02x", u[i]);
    } else if (r == '"' || r == '\\') {
      char e[2] = {'\\', (char)r};
      istr_add(b, e, 2);
    } else if (is_printable(r)) {
      istr_add(b, s + i, w);
    } else {
      switch (r) {
        case '\a': istr_add(b, "\\a", 2); break;
        case '\b': istr_add(b, "\\b", 2); break;
        case '\f': istr_add(b, "\\f", 2); break;
        case '\n': istr_add(b, "\\n", 2); break;
        case '\r': istr_add(b, "\\r", 2); break;
        case '\t': istr_add(b, "\\t", 2); break;
        case '\v': istr_add(b, "\\v", 2); break;
        default:
          if (r < ' ' || r == 0x7f)
            istr_addf(b, "\\x%02x", (unsigned)r);
          else if (r < 0x10000)
            istr_addf(b, "\\u%04x", (unsigned)r);
          else
            istr_addf(b, "\\U%08x", (unsigned)r);
      }
    }
    i += w;
  }
  istr_add(b, "\"", 1);
}

void istr_json(istr *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  istr_add(b, "\"", 1);
  size_t i = 0;
  while (i < n) {
    size_t w;
    int32_t r = initstr_rune(u + i, n - i, &w);
    if (r < 0) {
      istr_add(b, "\\ufffd", 6);
    } else if (r == '"' || r == '\\') {
      char e[2] = {'\\', (char)r};
      istr_add(b, e, 2);
    } else if (r == '\n') {
      istr_add(b, "\\n", 2);
    } else if (r == '\r') {
      istr_add(b, "\\r", 2);
    } else if (r == '\t') {
      istr_add(b, "\\t", 2);
    } else if (r < 0x20 || r == '<' || r == '>' || r == '&' || r == 0x2028 || r == 0x2029) {
      istr_addf(b, "\\u%04x", (unsigned)r);
    } else {
      istr_add(b, s + i, w);
    }
    i += w;
  }
  istr_add(b, "\"", 1);
}

void initstr_trim(const char **s, size_t *n) {
  const unsigned char *u = (const unsigned char *)*s;
  size_t a = 0, e = *n;
  while (a < e) {
    size_t w;
    int32_t r = initstr_rune(u + a, e - a, &w);
    if (r < 0 || !initstr_is_space(r)) break;
    a += w;
  }
  while (e > a) {
    /* step back to the start of the last rune */
    size_t st = e - 1;
    while (st > a && (u[st] & 0xc0) == 0x80 && e - st < 4) st--;
    size_t w;
    int32_t r = initstr_rune(u + st, e - st, &w);
    if (r < 0 || st + w != e || !initstr_is_space(r)) break;
    e = st;
  }
  *s += a;
  *n = e - a;
}

int initstr_has_space_or_control(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    size_t w;
    int32_t r = initstr_rune(u + i, n - i, &w);
    if (r < 0 || initstr_is_space(r) || initstr_is_control(r)) return 1;
    i += w;
  }
  return 0;
}

int initstr_ipv4(const char *s, size_t n, uint32_t *out) {
  uint32_t a = 0;
  size_t i = 0;
  for (int part = 0; part < 4; part++) {
    if (part) {
      if (i >= n || s[i] != '.') return 0;
      i++;
    }
    size_t st = i;
    unsigned v = 0;
    while (i < n && s[i] >= '0' && s[i] <= '9' && i - st < 4) {
      v = v * 10 + (unsigned)(s[i] - '0');
      i++;
    }
    size_t len = i - st;
    if (len == 0 || len > 3 || v > 255 || (len > 1 && s[st] == '0')) return 0;
    a = (a << 8) | v;
  }
  if (i != n) return 0;
  *out = a;
  return 1;
}

void initstr_ipv4_fmt(uint32_t a, char out[16]) {
  snprintf(out, 16, "%u.%u.%u.%u", (a >> 24) & 255, (a >> 16) & 255, (a >> 8) & 255, a & 255);
}
