/* initstr — text helpers of the init protocol; see initstr.h. */
#include "init/initstr.h"
#include "proto/text.h"

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

/* The writers of proto/text.h straight into the buffer. */
void istr_quote(istr *b, const char *s, size_t n) {
  if (istr_grow(b, text_go_quote(NULL, s, n)) != 0) return;
  b->n += text_go_quote(b->p + b->n, s, n);
  b->p[b->n] = 0;
}

void istr_json(istr *b, const char *s, size_t n) {
  if (istr_grow(b, text_json_string(NULL, s, n)) != 0) return;
  b->n += text_json_string(b->p + b->n, s, n);
  b->p[b->n] = 0;
}

void initstr_trim(const char **s, size_t *n) {
  const unsigned char *u = (const unsigned char *)*s;
  size_t a = 0, e = *n;
  while (a < e) {
    size_t w;
    uint32_t r = text_utf8_rune(u + a, e - a, &w);
    if (!text_is_space(r)) break; /* TEXT_RUNE_ERROR is no space */
    a += w;
  }
  while (e > a) {
    /* step back to the start of the last rune */
    size_t st = e - 1;
    while (st > a && (u[st] & 0xc0) == 0x80 && e - st < 4) st--;
    size_t w;
    uint32_t r = text_utf8_rune(u + st, e - st, &w);
    if (st + w != e || !text_is_space(r)) break;
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
    uint32_t r = text_utf8_rune(u + i, n - i, &w);
    if ((r == TEXT_RUNE_ERROR && w == 1) || text_is_space(r) || text_is_control(r)) return 1;
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
