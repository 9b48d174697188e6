/* json.c — strict RFC 8259 parser (see json.h). */
#include "proto/json.h"
#include "proto/text.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A document's memory: the root and a first block in one allocation, more
 * blocks as needed, all freed together by json_free(root); at most `budget`
 * bytes in all.  Without the bound a 16 MiB array of empty strings took
 * half a gigabyte (56 bytes of node per 3 bytes of input). */
typedef struct jblk {
  struct jblk *next;
} jblk;
typedef struct jdoc {
  json_value root; /* first: json_free(root) frees the document */
  jblk *more;      /* blocks after the first */
  char *cur;       /* free space in the newest block */
  size_t left, total, budget;
  int borrowed; /* the root and first block are in the caller's buffer */
} jdoc;

typedef struct jp {
  const unsigned char *s, *p, *end;
  char *err;
  size_t errlen;
  int failed;
  int over; /* the memory budget ran out */
  jdoc *doc;
} jp;

static void jp_fail(jp *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jp_fail(jp *j, const char *fmt, ...) {
  if (j->failed) return;
  j->failed = 1;
  if (!j->err || j->errlen == 0) return;
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(j->err, j->errlen, "%s at offset %zu", msg, (size_t)(j->p - j->s));
}

#define JSON_FIRST_BLOCK 512
#define JSON_BLOCK_MAX (1u << 20)

/* n bytes (8-aligned) of the document's memory; NULL (and the parse fails)
 * when out of memory or over the budget. */
static void *jp_alloc(jp *j, size_t n) {
  jdoc *d = j->doc;
  n = (n + 7) & ~(size_t)7;
  if (n > d->left) {
    size_t cap = d->total < JSON_BLOCK_MAX ? d->total : JSON_BLOCK_MAX;
    if (cap < n) cap = n;
    if (cap > d->budget - d->total) cap = n; /* the last room: exactly what is asked */
    if (cap > d->budget - d->total) {
      j->over = 1;
      jp_fail(j, "document needs more than %zu bytes of memory", d->budget);
      return NULL;
    }
    jblk *b = malloc(sizeof(jblk) + cap);
    if (!b) {
      jp_fail(j, "out of memory");
      return NULL;
    }
    b->next = d->more;
    d->more = b;
    d->cur = (char *)(b + 1);
    d->left = cap;
    d->total += cap;
  }
  void *r = d->cur;
  d->cur += n;
  d->left -= n;
  return r;
}

static void jp_ws(jp *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static int hex4(const unsigned char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = p[i], d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return -1;
    v = v << 4 | d;
  }
  *out = v;
  return 0;
}

/* At an opening quote.  Decodes into a NUL-terminated buffer of the document. */
static char *jp_string(jp *j, size_t *lenp) {
  j->p++; /* '"' */
  const unsigned char *q = text_plain_run(j->p, j->end);
  if (q < j->end && *q == '"') { /* no escapes, nothing but ASCII: one copy */
    size_t n = (size_t)(q - j->p);
    unsigned char *out = jp_alloc(j, n + 1);
    if (!out) return NULL;
    memcpy(out, j->p, n);
    out[n] = 0;
    *lenp = n;
    j->p = q + 1;
    return (char *)out;
  }
  /* First pass: find the closing quote, to size the buffer. */
  while (q < j->end && *q != '"') {
    if (*q == '\\') q += (q + 1 < j->end) ? 2 : 1;
    else q++;
  }
  if (q >= j->end) {
    jp_fail(j, "unterminated string");
    return NULL;
  }
  /* Decoded output is never longer than the raw text (\uXXXX = 6 bytes → ≤ 3;
   * a pair = 12 bytes → 4). */
  unsigned char *out = jp_alloc(j, (size_t)(q - j->p) + 1);
  if (!out) return NULL;
  unsigned char *o = out;
  while (j->p < j->end) {
    /* fast path: a run of plain printable ASCII */
    const unsigned char *r = text_plain_run(j->p, q);
    if (r != j->p) {
      memcpy(o, j->p, (size_t)(r - j->p));
      o += r - j->p;
      j->p = r;
    }
    unsigned c = *j->p;
    if (c == '"') {
      j->p++;
      *o = 0;
      *lenp = (size_t)(o - out);
      return (char *)out;
    }
    if (c < 0x20) {
      jp_fail(j, "control character in string");
      break;
    }
    if (c == '\\') {
      if (j->end - j->p < 2) {
        jp_fail(j, "unterminated string");
        break;
      }
      unsigned e = j->p[1];
      switch (e) {
      case '"': *o++ = '"'; j->p += 2; continue;
      case '\\': *o++ = '\\'; j->p += 2; continue;
      case '/': *o++ = '/'; j->p += 2; continue;
      case 'b': *o++ = '\b'; j->p += 2; continue;
      case 'f': *o++ = '\f'; j->p += 2; continue;
      case 'n': *o++ = '\n'; j->p += 2; continue;
      case 'r': *o++ = '\r'; j->p += 2; continue;
      case 't': *o++ = '\t'; j->p += 2; continue;
      case 'u': break;
      default:
        jp_fail(j, "invalid escape in string");
        goto fail;
      }
      unsigned cp;
      if (j->end - j->p < 6 || hex4(j->p + 2, &cp) < 0) {
        jp_fail(j, "invalid \\u escape");
        break;
      }
      if (cp >= 0xDC00 && cp <= 0xDFFF) {
        jp_fail(j, "lone low surrogate in \\u escape");
        break;
      }
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        unsigned lo;
        if (j->end - j->p < 12 || j->p[6] != '\\' || j->p[7] != 'u' || hex4(j->p + 8, &lo) < 0 ||
            lo < 0xDC00 || lo > 0xDFFF) {
          jp_fail(j, "lone high surrogate in \\u escape");
          break;
        }
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        j->p += 12;
      } else {
        j->p += 6;
      }
      o += text_utf8_put(o, cp);
      continue;
    }
    size_t k = c < 0x80 ? 1 : text_utf8_seq(j->p, (size_t)(j->end - j->p));
    if (k == 0) {
      jp_fail(j, "invalid UTF-8 in string");
      break;
    }
    memcpy(o, j->p, k);
    o += k;
    j->p += k;
  }
fail:
  if (!j->failed) jp_fail(j, "unterminated string");
  return NULL;
}

static int is_digit(unsigned c) { return c >= '0' && c <= '9'; }

static int jp_number(jp *j, json_value *v) {
  const unsigned char *start = j->p;
  if (j->p < j->end && *j->p == '-') j->p++;
  if (j->p >= j->end || !is_digit(*j->p)) {
    jp_fail(j, "invalid number");
    return -1;
  }
  if (*j->p == '0') {
    j->p++;
    if (j->p < j->end && is_digit(*j->p)) {
      jp_fail(j, "leading zero in number");
      return -1;
    }
  } else {
    while (j->p < j->end && is_digit(*j->p)) j->p++;
  }
  if (j->p < j->end && *j->p == '.') {
    j->p++;
    if (j->p >= j->end || !is_digit(*j->p)) {
      jp_fail(j, "invalid number: digit expected after '.'");
      return -1;
    }
    while (j->p < j->end && is_digit(*j->p)) j->p++;
  }
  if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
    j->p++;
    if (j->p < j->end && (*j->p == '+' || *j->p == '-')) j->p++;
    if (j->p >= j->end || !is_digit(*j->p)) {
      jp_fail(j, "invalid number: digit expected in exponent");
      return -1;
    }
    while (j->p < j->end && is_digit(*j->p)) j->p++;
  }
  size_t n = (size_t)(j->p - start);
  v->str = jp_alloc(j, n + 1);
  if (!v->str) return -1;
  memcpy(v->str, start, n);
  v->str[n] = 0;
  v->len = n;
  v->type = JSON_NUMBER;
  return 0;
}

static int jp_value(jp *j, json_value *v, int depth);

/* Room for one more member.  An object's items, keys and key lengths share
 * one block (items first).  Outgrown blocks stay in the document until it
 * is freed (at most as much again as the final block). */
static int grow(jp *j, json_value *v, size_t *cap, int with_keys) {
  if (v->n < *cap) return 0;
  size_t nc = *cap ? *cap * 2 : 4;
  size_t isz = nc * sizeof(json_value), ksz = with_keys ? nc * (sizeof(char *) + sizeof(size_t)) : 0;
  char *blk = jp_alloc(j, isz + ksz);
  if (!blk) return -1;
  json_value *ni = (json_value *)blk;
  if (v->n) memcpy(ni, v->items, v->n * sizeof *ni);
  v->items = ni;
  if (with_keys) {
    char **nk = (char **)(blk + isz);
    size_t *nl = (size_t *)(blk + isz + nc * sizeof(char *));
    if (v->n) {
      memcpy(nk, v->keys, v->n * sizeof *nk);
      memcpy(nl, v->key_lens, v->n * sizeof *nl);
    }
    v->keys = nk;
    v->key_lens = nl;
  }
  *cap = nc;
  return 0;
}

static int jp_array(jp *j, json_value *v, int depth) {
  v->type = JSON_ARRAY;
  j->p++; /* '[' */
  size_t cap = 0;
  jp_ws(j);
  if (j->p < j->end && *j->p == ']') {
    j->p++;
    return 0;
  }
  for (;;) {
    if (grow(j, v, &cap, 0) < 0) return -1;
    json_value *it = &v->items[v->n];
    memset(it, 0, sizeof *it);
    if (jp_value(j, it, depth) < 0) return -1;
    v->n++;
    jp_ws(j);
    if (j->p >= j->end) {
      jp_fail(j, "unterminated array");
      return -1;
    }
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p == ']') {
      j->p++;
      return 0;
    }
    jp_fail(j, "expected ',' or ']' in array");
    return -1;
  }
}

static int jp_object(jp *j, json_value *v, int depth) {
  v->type = JSON_OBJECT;
  j->p++; /* '{' */
  size_t cap = 0;
  jp_ws(j);
  if (j->p < j->end && *j->p == '}') {
    j->p++;
    return 0;
  }
  for (;;) {
    jp_ws(j);
    if (j->p >= j->end) {
      jp_fail(j, "unterminated object");
      return -1;
    }
    if (*j->p != '"') {
      jp_fail(j, "expected string key in object");
      return -1;
    }
    if (grow(j, v, &cap, 1) < 0) return -1;
    size_t klen = 0;
    char *key = jp_string(j, &klen);
    if (!key) return -1;
    jp_ws(j);
    if (j->p >= j->end || *j->p != ':') {
      jp_fail(j, j->p >= j->end ? "unterminated object" : "expected ':' after object key");
      return -1;
    }
    j->p++;
    json_value *it = &v->items[v->n];
    memset(it, 0, sizeof *it);
    if (jp_value(j, it, depth) < 0) return -1;
    v->keys[v->n] = key;
    v->key_lens[v->n] = klen;
    v->n++;
    jp_ws(j);
    if (j->p >= j->end) {
      jp_fail(j, "unterminated object");
      return -1;
    }
    if (*j->p == ',') {
      j->p++;
      continue;
    }
    if (*j->p == '}') {
      j->p++;
      return 0;
    }
    jp_fail(j, "expected ',' or '}' in object");
    return -1;
  }
}

static int jp_lit(jp *j, const char *lit, size_t n) {
  if ((size_t)(j->end - j->p) < n || memcmp(j->p, lit, n) != 0) {
    jp_fail(j, "invalid literal");
    return -1;
  }
  j->p += n;
  return 0;
}

static int jp_value(jp *j, json_value *v, int depth) {
  jp_ws(j);
  if (j->p >= j->end) {
    jp_fail(j, "unexpected end of input");
    return -1;
  }
  switch (*j->p) {
  case '{':
  case '[':
    if (depth >= JSON_MAX_DEPTH) {
      jp_fail(j, "nesting deeper than %d", JSON_MAX_DEPTH);
      return -1;
    }
    return *j->p == '{' ? jp_object(j, v, depth + 1) : jp_array(j, v, depth + 1);
  case '"':
    v->type = JSON_STRING;
    v->str = jp_string(j, &v->len);
    return v->str ? 0 : -1;
  case 't':
    v->type = JSON_TRUE;
    return jp_lit(j, "true", 4);
  case 'f':
    v->type = JSON_FALSE;
    return jp_lit(j, "false", 5);
  case 'n':
    v->type = JSON_NULL;
    return jp_lit(j, "null", 4);
  default:
    if (*j->p == '-' || is_digit(*j->p)) return jp_number(j, v);
    jp_fail(j, "unexpected character");
    return -1;
  }
}

json_value *json_parse_in(const char *s, size_t n, size_t budget, void *buf, size_t bufsz, char *err,
                          size_t errlen, int *over) {
  if (err && errlen) err[0] = 0;
  if (over) *over = 0;
  jp j = {(const unsigned char *)s, (const unsigned char *)s, (const unsigned char *)s + n, err,
          errlen, 0, 0, NULL};
  if (!s || n == 0) {
    jp_fail(&j, "empty input");
    return NULL;
  }
  /* the root and a first block sized for a small document, in one piece */
  size_t first = n * 8 + JSON_FIRST_BLOCK;
  if (first > 4096) first = 4096;
  if (budget < JSON_FIRST_BLOCK) budget = JSON_FIRST_BLOCK;
  if (first > budget) first = budget;
  jdoc *d;
  uintptr_t b = (uintptr_t)buf, al = (b + 15) & ~(uintptr_t)15;
  int borrowed = buf && bufsz > al - b + sizeof *d + JSON_FIRST_BLOCK;
  if (borrowed) { /* the caller's buffer: as much of it as the budget allows */
    d = (jdoc *)al;
    first = bufsz - (al - b) - sizeof *d;
    if (first > budget) first = budget;
  } else if (!(d = malloc(sizeof *d + first))) {
    jp_fail(&j, "out of memory");
    return NULL;
  }
  d->borrowed = borrowed;
  memset(&d->root, 0, sizeof d->root);
  d->more = NULL;
  d->cur = (char *)(d + 1);
  d->left = first;
  d->total = first;
  d->budget = budget;
  j.doc = d;
  if (jp_value(&j, &d->root, 0) == 0) {
    jp_ws(&j);
    if (j.p == j.end) return &d->root;
    jp_fail(&j, "trailing data after JSON value");
  }
  if (over) *over = j.over;
  json_free(&d->root);
  return NULL;
}

json_value *json_parse_ex(const char *s, size_t n, size_t budget, char *err, size_t errlen,
                          int *over) {
  return json_parse_in(s, n, budget, NULL, 0, err, errlen, over);
}

json_value *json_parse(const char *s, size_t n, char *err, size_t errlen) {
  return json_parse_ex(s, n, JSON_MEM_BUDGET(n), err, errlen, NULL);
}

void json_free(json_value *v) {
  if (!v) return;
  jdoc *d = (jdoc *)v;
  for (jblk *b = d->more, *nb; b; b = nb) {
    nb = b->next;
    free(b);
  }
  if (!d->borrowed) free(d);
}

const json_value *json_get_n(const json_value *obj, const char *key, size_t keylen) {
  if (!obj || obj->type != JSON_OBJECT) return NULL;
  for (size_t i = 0; i < obj->n; i++)
    if (obj->key_lens[i] == keylen && memcmp(obj->keys[i], key, keylen) == 0) return &obj->items[i];
  return NULL;
}

const json_value *json_get(const json_value *obj, const char *key) {
  return json_get_n(obj, key, strlen(key));
}

const char *json_type_name(json_type t) {
  switch (t) {
  case JSON_NULL: return "null";
  case JSON_FALSE: return "false";
  case JSON_TRUE: return "true";
  case JSON_NUMBER: return "number";
  case JSON_STRING: return "string";
  case JSON_ARRAY: return "array";
  case JSON_OBJECT: return "object";
  }
  return "?";
}
