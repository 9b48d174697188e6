/* h2check — malformed HTTP/2 requests; see h2check.h. */
#include "server/h2check.h"

#include <string.h>
#include <strings.h>

enum {
  CK_METHOD = 1, CK_SCHEME = 2, CK_AUTHORITY = 4, CK_PATH = 8, CK_HOST = 16,
  CK_REGULAR = 32,   /* a regular field was seen: no more pseudo-headers */
  CK_OPTIONS = 64,   /* :method OPTIONS */
  CK_ASTERISK = 128, /* :path "*" */
  CK_CLEN = 256,     /* h2check_kind only: content-length */
};

/* field names: lower-case tchar (RFC 9110 §5.6.2) */
static const unsigned char ck_name[256] = {
    ['!'] = 1, ['#' ... '\''] = 1, ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['0' ... '9'] = 1,
    ['^'] = 1, ['_'] = 1, ['`'] = 1, ['a' ... 'z'] = 1, ['|'] = 1, ['~'] = 1};
/* :method: tchar of either case */
static const unsigned char ck_method[256] = {
    ['!'] = 1, ['#' ... '\''] = 1, ['*'] = 1, ['+'] = 1, ['-'] = 1, ['.'] = 1, ['0' ... '9'] = 1,
    ['A' ... 'Z'] = 1, ['^'] = 1, ['_'] = 1, ['`'] = 1, ['a' ... 'z'] = 1, ['|'] = 1, ['~'] = 1};
/* field values: HTAB, SP, visible ASCII, obs-text */
static const unsigned char ck_value[256] = {['\t'] = 1, [0x20 ... 0x7e] = 1, [0x80 ... 0xff] = 1};
/* :path: visible ASCII and obs-text */
static const unsigned char ck_path[256] = {[0x21 ... 0x7e] = 1, [0x80 ... 0xff] = 1};
/* :authority: unreserved, sub-delims, '%', ':', '@', '[', ']' */
static const unsigned char ck_authority[256] = {
    ['!'] = 1, ['$'] = 1, ['%'] = 1, ['&' ... '.'] = 1, ['0' ... ';'] = 1, ['='] = 1, ['@' ... '['] = 1,
    [']'] = 1, ['_'] = 1, ['a' ... 'z'] = 1, ['~'] = 1};
/* :scheme after its first letter */
static const unsigned char ck_scheme[256] = {
    ['+'] = 1, ['-'] = 1, ['.'] = 1, ['0' ... '9'] = 1, ['A' ... 'Z'] = 1, ['a' ... 'z'] = 1};

/* Every byte of s[0..n) in the table (four lookups per test). */
static int ck_all(const unsigned char *tab, const uint8_t *s, size_t n) {
  unsigned ok = 1;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) ok &= tab[s[i]] & tab[s[i + 1]] & tab[s[i + 2]] & tab[s[i + 3]];
  for (; i < n; i++) ok &= tab[s[i]];
  return ok;
}

/* A field value: 8 bytes at a time while none is a control character or
 * DEL (the usual case), the table for the rest. */
static int ck_value_ok(const uint8_t *s, size_t n) {
  const uint64_t ones = 0x0101010101010101ull, highs = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, d;
    memcpy(&x, s + i, 8);
    d = x ^ (ones * 0x7f);
    if (((x - ones * 0x20) & ~x & highs) | ((d - ones) & ~d & highs)) break; /* a byte < 0x20 or 0x7f */
  }
  return ck_all(ck_value, s + i, n - i);
}

static int ck_is(const uint8_t *s, size_t n, const char *lit) {
  return n == strlen(lit) && memcmp(s, lit, n) == 0;
}

void h2check_init(h2check *k) {
  k->seen = 0;
  k->content_length = -1;
  k->body = 0;
}

/* A pseudo-header's bytes: which one, and a valid value. */
static int ck_pseudo(const uint8_t *name, size_t nlen, const uint8_t *v, size_t vlen, h2check_kind *f) {
  int ok;
  f->flags = 0;
  if (ck_is(name, nlen, ":method")) {
    f->kind = CK_METHOD;
    ok = vlen > 0 && ck_all(ck_method, v, vlen);
    if (ck_is(v, vlen, "OPTIONS")) f->flags = CK_OPTIONS;
  } else if (ck_is(name, nlen, ":path")) {
    f->kind = CK_PATH;
    ok = vlen > 0 && ck_all(ck_path, v, vlen) && (v[0] == '/' || (vlen == 1 && v[0] == '*'));
    if (vlen == 1 && v[0] == '*') f->flags = CK_ASTERISK;
  } else if (ck_is(name, nlen, ":scheme")) {
    f->kind = CK_SCHEME;
    ok = vlen > 0 && ((v[0] | 0x20) >= 'a' && (v[0] | 0x20) <= 'z') && ck_all(ck_scheme, v, vlen);
  } else if (ck_is(name, nlen, ":authority")) {
    f->kind = CK_AUTHORITY;
    ok = vlen > 0 && ck_all(ck_authority, v, vlen);
  } else {
    return -1; /* unknown, or :protocol (extended CONNECT is not enabled) */
  }
  return ok ? 0 : -1;
}

/* content-length: decimal digits, no more than fits in int64_t. */
static int ck_content_length(const uint8_t *v, size_t vlen, h2check_kind *f) {
  if (vlen == 0) return -1;
  int64_t n = 0;
  for (size_t i = 0; i < vlen; i++) {
    if (v[i] < '0' || v[i] > '9' || n > (INT64_MAX - (v[i] - '0')) / 10) return -1;
    n = n * 10 + (v[i] - '0');
  }
  f->kind = CK_CLEN;
  f->num = n;
  return 0;
}

int h2check_classify(const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen, h2check_kind *f) {
  f->kind = CK_REGULAR;
  f->flags = 0;
  f->num = 0;
  if (nlen == 0) return -1;
  if (name[0] == ':') return ck_pseudo(name, nlen, value, vlen, f);
  if (!ck_all(ck_name, name, nlen) || !ck_value_ok(value, vlen)) return -1;
  if (vlen && (value[0] == ' ' || value[0] == '\t' || value[vlen - 1] == ' ' || value[vlen - 1] == '\t'))
    return -1;
  switch (nlen) { /* the few names with rules of their own */
  case 2:
    if (ck_is(name, nlen, "te") && !(vlen == 8 && strncasecmp((const char *)value, "trailers", 8) == 0))
      return -1;
    break;
  case 4: /* host: once, not empty (like a pseudo-header) */
    if (ck_is(name, nlen, "host")) {
      if (vlen == 0) return -1;
      f->kind = CK_HOST;
    }
    break;
  case 7:
    if (ck_is(name, nlen, "upgrade")) return -1;
    break;
  case 10:
    if (ck_is(name, nlen, "connection") || ck_is(name, nlen, "keep-alive")) return -1;
    break;
  case 14:
    if (ck_is(name, nlen, "content-length")) return ck_content_length(value, vlen, f);
    break;
  case 16:
    if (ck_is(name, nlen, "proxy-connection")) return -1;
    break;
  case 17:
    if (ck_is(name, nlen, "transfer-encoding")) return -1;
    break;
  }
  return 0;
}

int h2check_apply(h2check *k, const h2check_kind *f) {
  unsigned bit = f->kind;
  switch (bit) {
  case CK_METHOD:
  case CK_PATH:
  case CK_SCHEME:
  case CK_AUTHORITY: /* once, and before every regular field */
    if (k->seen & (bit | CK_REGULAR)) return -1;
    k->seen |= bit | f->flags;
    return 0;
  case CK_HOST:
    if (k->seen & CK_HOST) return -1;
    k->seen |= CK_HOST | CK_REGULAR;
    return 0;
  case CK_CLEN:
    if (k->content_length >= 0) return -1;
    k->content_length = f->num;
    k->seen |= CK_REGULAR;
    return 0;
  default:
    k->seen |= CK_REGULAR;
    return 0;
  }
}

int h2check_field(h2check *k, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen) {
  h2check_kind f; /* after a -1 the block is malformed: k no longer matters */
  return h2check_classify(name, nlen, value, vlen, &f) != 0 ? -1 : h2check_apply(k, &f);
}

int h2check_trailer_field(const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen) {
  h2check k = {CK_REGULAR, -1, 0}; /* pseudo-headers are malformed here */
  return h2check_field(&k, name, nlen, value, vlen);
}

int h2check_end_headers(const h2check *k) {
  unsigned need = CK_METHOD | CK_SCHEME | CK_PATH;
  if ((k->seen & need) != need || !(k->seen & (CK_AUTHORITY | CK_HOST))) return -1;
  if ((k->seen & CK_ASTERISK) && !(k->seen & CK_OPTIONS)) return -1;
  return 0;
}

int h2check_data(h2check *k, size_t n) {
  k->body += n;
  return k->content_length >= 0 && k->body > (uint64_t)k->content_length ? -1 : 0;
}

int h2check_end_stream(const h2check *k) {
  return k->content_length >= 0 && k->body != (uint64_t)k->content_length ? -1 : 0;
}
