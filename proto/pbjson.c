/* pbjson.c — proto3 canonical JSON: descriptor helpers, the encoder and the
 * UTF-8 walk of unpacked messages (decoder: pbjson_decode.c; strings, UTF-8
 * and base64: proto/text.h). */
#include "proto/pbjson.h"
#include "proto/pbjson_int.h"
#include "proto/json.h"
#include "proto/text.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ descriptor helpers */

size_t pbj_json_name(const char *name, char *out, size_t cap) {
  size_t n = 0;
  int up = 0;
  for (const char *c = name; *c; c++) {
    if (*c == '_') {
      up = 1;
      continue;
    }
    char ch = *c;
    if (up && ch >= 'a' && ch <= 'z') ch = (char)(ch - 'a' + 'A');
    up = 0;
    if (n + 1 < cap) out[n] = ch;
    n++;
  }
  if (cap) out[n < cap ? n : cap - 1] = 0;
  return n;
}

int pbj_json_name_eq(const char *name, const char *key, size_t klen) {
  char buf[256];
  size_t n = pbj_json_name(name, buf, sizeof buf);
  return n == klen && n < sizeof buf && memcmp(buf, key, klen) == 0;
}

/* protoc's MapEntryName: "exclude_patterns" → "ExcludePatternsEntry". */
static int map_entry_name_eq(const char *field, const char *entry) {
  char buf[256];
  size_t n = pbj_json_name(field, buf, sizeof buf);
  if (n + sizeof "Entry" > sizeof buf) return 0;
  if (buf[0] >= 'a' && buf[0] <= 'z') buf[0] = (char)(buf[0] - 'a' + 'A');
  return strncmp(entry, buf, n) == 0 && strcmp(entry + n, "Entry") == 0;
}

int pbj_is_map(const ProtobufCMessageDescriptor *parent, const ProtobufCFieldDescriptor *f) {
  if (f->label != PROTOBUF_C_LABEL_REPEATED || f->type != PROTOBUF_C_TYPE_MESSAGE) return 0;
  const ProtobufCMessageDescriptor *e = f->descriptor;
  if (!e || e->n_fields != 2 || e->fields[0].id != 1 || e->fields[1].id != 2) return 0;
  if (strcmp(e->fields[0].name, "key") != 0 || strcmp(e->fields[1].name, "value") != 0) return 0;
  if (e->fields[0].label == PROTOBUF_C_LABEL_REPEATED || e->fields[1].label == PROTOBUF_C_LABEL_REPEATED)
    return 0;
  switch (e->fields[0].type) {
  case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE: case PROTOBUF_C_TYPE_BYTES:
  case PROTOBUF_C_TYPE_MESSAGE: case PROTOBUF_C_TYPE_ENUM:
    return 0;
  default:
    break;
  }
  /* The entry type is nested in the parent and named after the field. */
  size_t pl = strlen(parent->name);
  if (strncmp(e->name, parent->name, pl) != 0 || e->name[pl] != '.') return 0;
  return map_entry_name_eq(f->name, e->short_name) && strcmp(e->name + pl + 1, e->short_name) == 0;
}

size_t pbj_elt_size(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    return 4;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    return 8;
  case PROTOBUF_C_TYPE_FLOAT: return sizeof(float);
  case PROTOBUF_C_TYPE_DOUBLE: return sizeof(double);
  case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
  case PROTOBUF_C_TYPE_ENUM: return sizeof(int);
  case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
  case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
  case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
  }
  return 0;
}

int pbj_oneof_selected(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  uint32_t c;
  memcpy(&c, PBJ_QUANT(m, f), sizeof c);
  return c == f->id;
}

static size_t path_append(pbj_path *p, const char *s, size_t n) {
  size_t old = p->len;
  if (p->len + n + 1 > sizeof p->s) {
    /* Keep the path readable when it does not fit: mark it cut. */
    if (p->len + 4 <= sizeof p->s && (p->len < 3 || memcmp(p->s + p->len - 3, "...", 3) != 0)) {
      memcpy(p->s + p->len, "...", 3);
      p->len += 3;
      p->s[p->len] = 0;
    }
    return old;
  }
  memcpy(p->s + p->len, s, n);
  p->len += n;
  p->s[p->len] = 0;
  return old;
}

size_t pbj_path_field(pbj_path *p, const char *name) {
  size_t old = p->len;
  if (p->len) path_append(p, ".", 1);
  path_append(p, name, strlen(name));
  return old;
}

size_t pbj_path_index(pbj_path *p, size_t i) {
  char b[32];
  int n = snprintf(b, sizeof b, "[%zu]", i);
  return path_append(p, b, (size_t)n);
}

size_t pbj_path_key(pbj_path *p, const char *key, size_t klen) {
  char b[40];
  size_t n = 0;
  b[n++] = '[';
  for (size_t i = 0; i < klen && n < 34; i++) {
    unsigned char c = (unsigned char)key[i];
    b[n++] = (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') ? (char)c : '?';
  }
  if (klen > 32) {
    memcpy(b + n, "...", 3);
    n += 3;
  }
  b[n++] = ']';
  return path_append(p, b, n);
}

void pbj_path_pop(pbj_path *p, size_t len) {
  p->len = len;
  p->s[len] = 0;
}

/* ------------------------------------------------------------ encoder */

/* Output sink: one growing buffer, written in a single pass.  On a failed
 * allocation it stops writing and remembers (oom); the caller then gets
 * NULL. */
typedef struct wbuf {
  char *buf;
  size_t len, cap;
  int oom;
  int fixed; /* buf is the caller's: never reallocated or freed here */
} wbuf;

/* Room for n more bytes (and the final NUL).  0 ok, -1 out of memory. */
static int w_grow(wbuf *w, size_t n) {
  if (w->oom) return -1;
  size_t need = w->len + n + 1, cap = w->cap ? w->cap : 256;
  while (cap < need) cap *= 2;
  char *nb = w->fixed ? malloc(cap) : realloc(w->buf, cap);
  if (!nb) {
    w->oom = 1;
    return -1;
  }
  if (w->fixed) { /* the caller's buffer stays as it is */
    memcpy(nb, w->buf, w->len);
    w->fixed = 0;
  }
  w->buf = nb;
  w->cap = cap;
  return 0;
}

static inline int w_room(wbuf *w, size_t n) {
  return w->len + n < w->cap ? 0 : w_grow(w, n);
}

static inline void w_mem(wbuf *w, const void *s, size_t n) {
  if (w_room(w, n) < 0) return;
  memcpy(w->buf + w->len, s, n);
  w->len += n;
}
static inline void w_ch(wbuf *w, char c) {
  if (w_room(w, 1) < 0) return;
  w->buf[w->len++] = c;
}
static void w_cstr(wbuf *w, const char *s) { w_mem(w, s, strlen(s)); }

/* A JSON string literal, escaped as text.h says (the one form every JSON
 * writer of conch-init uses), written in place: at once when even the
 * worst case fits, else sized first (never growing the buffer, or leaving
 * the caller's, for room the string does not need). */
static void w_string(wbuf *w, const char *str, size_t n) {
  if (w->oom || n > (w->cap - w->len) / 6 || w->len + TEXT_JSON_MAX(n) >= w->cap) {
    if (w_room(w, text_json_string(NULL, str, n)) < 0) return;
  }
  w->len += text_json_string(w->buf + w->len, str, n);
}

static void w_bytes(wbuf *w, const ProtobufCBinaryData *b) {
  w_ch(w, '"');
  if (b->len && b->data) {
    size_t n = text_b64_encoded_len(b->len);
    if (w_room(w, n) < 0) return;
    text_b64_encode(b->data, b->len, w->buf + w->len);
    w->len += n;
  }
  w_ch(w, '"');
}

static void w_double(wbuf *w, double d, int is_float) {
  if (isnan(d)) {
    w_cstr(w, "\"NaN\"");
    return;
  }
  if (isinf(d)) {
    w_cstr(w, d > 0 ? "\"Infinity\"" : "\"-Infinity\"");
    return;
  }
  /* Shortest %g that reads back as the same value. */
  char b[48];
  for (int prec = is_float ? 6 : 15; prec <= 17; prec++) {
    snprintf(b, sizeof b, "%.*g", prec, d);
    double r = strtod(b, NULL);
    if (is_float ? (float)r == (float)d : r == d) break;
  }
  w_cstr(w, b);
}

static void enc_msg(wbuf *w, const ProtobufCMessage *m);

/* Decimal digits of u, optionally negative and/or quoted (64-bit
 * integers are JSON strings). */
static void w_uint(wbuf *w, uint64_t u, int neg, int quoted) {
  char b[24];
  int n = (int)sizeof b;
  if (quoted) b[--n] = '"';
  n = (int)(text_u64_dec(b + n, u) - b);
  if (neg) b[--n] = '-';
  if (quoted) b[--n] = '"';
  w_mem(w, b + n, sizeof b - (size_t)n);
}

static void w_int(wbuf *w, int64_t v, int quoted) {
  w_uint(w, v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v, v < 0, quoted);
}

/* One value of field f's type stored at p (for strings/messages p points to
 * the pointer). */
static void enc_value(wbuf *w, const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    w_int(w, *(const int32_t *)p, 0);
    break;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    w_uint(w, *(const uint32_t *)p, 0, 0);
    break;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    w_int(w, *(const int64_t *)p, 1);
    break;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    w_uint(w, *(const uint64_t *)p, 0, 1);
    break;
  case PROTOBUF_C_TYPE_FLOAT:
    w_double(w, *(const float *)p, 1);
    break;
  case PROTOBUF_C_TYPE_DOUBLE:
    w_double(w, *(const double *)p, 0);
    break;
  case PROTOBUF_C_TYPE_BOOL:
    w_cstr(w, *(const protobuf_c_boolean *)p ? "true" : "false");
    break;
  case PROTOBUF_C_TYPE_ENUM: {
    int v = *(const int *)p;
    const ProtobufCEnumValue *ev =
        f->descriptor ? protobuf_c_enum_descriptor_get_value(f->descriptor, v) : NULL;
    if (ev) {
      w_string(w, ev->name, strlen(ev->name));
    } else {
      w_int(w, v, 0);
    }
    break;
  }
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    w_string(w, s ? s : "", s ? strlen(s) : 0);
    break;
  }
  case PROTOBUF_C_TYPE_BYTES:
    w_bytes(w, p);
    break;
  case PROTOBUF_C_TYPE_MESSAGE:
    enc_msg(w, *(ProtobufCMessage *const *)p);
    break;
  }
}

/* A map key: always a JSON string. */
static void enc_map_key(wbuf *w, const ProtobufCFieldDescriptor *kf, const void *p) {
  if (kf->type == PROTOBUF_C_TYPE_STRING) {
    enc_value(w, kf, p);
    return;
  }
  char b[32];
  switch (kf->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    snprintf(b, sizeof b, "\"%" PRId32 "\"", *(const int32_t *)p);
    break;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    snprintf(b, sizeof b, "\"%" PRIu32 "\"", *(const uint32_t *)p);
    break;
  case PROTOBUF_C_TYPE_BOOL:
    snprintf(b, sizeof b, "\"%s\"", *(const protobuf_c_boolean *)p ? "true" : "false");
    break;
  default: /* 64-bit integers are already strings */
    enc_value(w, kf, p);
    return;
  }
  w_cstr(w, b);
}

static int zeroish(const ProtobufCFieldDescriptor *f, const void *p) {
  switch (f->type) {
  case PROTOBUF_C_TYPE_BOOL: return *(const protobuf_c_boolean *)p == 0;
  case PROTOBUF_C_TYPE_ENUM: return *(const int *)p == 0;
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    return *(const uint32_t *)p == 0;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    return *(const uint64_t *)p == 0;
  case PROTOBUF_C_TYPE_FLOAT: return *(const float *)p == 0;
  case PROTOBUF_C_TYPE_DOUBLE: return *(const double *)p == 0;
  case PROTOBUF_C_TYPE_STRING: {
    const char *s = *(char *const *)p;
    return s == NULL || s[0] == 0;
  }
  case PROTOBUF_C_TYPE_BYTES: return ((const ProtobufCBinaryData *)p)->len == 0;
  case PROTOBUF_C_TYPE_MESSAGE: return *(ProtobufCMessage *const *)p == NULL;
  }
  return 1;
}

/* Whether field f of m appears in the output (mirrors what protobuf-c packs,
 * except that a selected oneof member is always emitted). */
static int field_present(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  const void *p = PBJ_MEMBER(m, f);
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) return pbj_oneof_selected(m, f);
  switch (f->label) {
  case PROTOBUF_C_LABEL_REPEATED:
    return *(const size_t *)PBJ_QUANT(m, f) > 0 && *(void *const *)p != NULL;
  case PROTOBUF_C_LABEL_REQUIRED:
    return 1;
  case PROTOBUF_C_LABEL_OPTIONAL:
    if (f->type == PROTOBUF_C_TYPE_MESSAGE || f->type == PROTOBUF_C_TYPE_STRING) {
      const void *ptr = *(void *const *)p;
      return ptr != NULL && ptr != f->default_value;
    }
    return *(const protobuf_c_boolean *)PBJ_QUANT(m, f) != 0;
  case PROTOBUF_C_LABEL_NONE:
    return !zeroish(f, p);
  }
  return 0;
}

/* "jsonName": — the lowerCamelCase name written in one pass (protoc's
 * rule: drop '_', upper-case the letter after it). */
static void enc_name(wbuf *w, const char *name) {
  size_t nl = strlen(name);
  if (w_room(w, nl + 3) < 0) return; /* at most the name + 3 */
  size_t o = w->len;
  char *b = w->buf;
  b[o++] = '"';
  if (!memchr(name, '_', nl)) { /* already its JSON name */
    memcpy(b + o, name, nl);
    b[o + nl] = '"';
    b[o + nl + 1] = ':';
    w->len = o + nl + 2;
    return;
  }
  int up = 0;
  for (size_t i = 0; name[i]; i++) {
    char c = name[i];
    if (c == '_') {
      up = 1;
      continue;
    }
    b[o++] = up && c >= 'a' && c <= 'z' ? (char)(c - 'a' + 'A') : c;
    up = 0;
  }
  b[o++] = '"';
  b[o++] = ':';
  w->len = o;
}

static void enc_msg(wbuf *w, const ProtobufCMessage *m) {
  w_ch(w, '{');
  if (!m) {
    w_ch(w, '}');
    return;
  }
  const ProtobufCMessageDescriptor *d = m->descriptor;
  int first = 1;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (!field_present(m, f)) continue;
    if (!first) w_ch(w, ',');
    first = 0;
    enc_name(w, f->name);
    const void *p = PBJ_MEMBER(m, f);
    if (f->label != PROTOBUF_C_LABEL_REPEATED) {
      enc_value(w, f, p);
      continue;
    }
    size_t n = *(const size_t *)PBJ_QUANT(m, f);
    const char *arr = *(const char *const *)p;
    if (pbj_is_map(d, f)) {
      const ProtobufCMessageDescriptor *ed = f->descriptor;
      const ProtobufCFieldDescriptor *kf = &ed->fields[0], *vf = &ed->fields[1];
      int efirst = 1;
      w_ch(w, '{');
      for (size_t j = 0; j < n; j++) {
        const ProtobufCMessage *e = ((ProtobufCMessage *const *)arr)[j];
        if (!e) continue;
        if (!efirst) w_ch(w, ',');
        efirst = 0;
        enc_map_key(w, kf, PBJ_MEMBER(e, kf));
        w_ch(w, ':');
        enc_value(w, vf, PBJ_MEMBER(e, vf));
      }
      w_ch(w, '}');
      continue;
    }
    size_t sz = pbj_elt_size(f->type);
    w_ch(w, '[');
    for (size_t j = 0; j < n; j++) {
      if (j) w_ch(w, ',');
      enc_value(w, f, arr + j * sz);
    }
    w_ch(w, ']');
  }
  w_ch(w, '}');
}

char *pbjson_encode_fixed(const ProtobufCMessage *msg, size_t headroom, char *buf, size_t cap,
                          size_t *len) {
  wbuf w = {buf, 0, buf ? cap : 0, 0, buf != NULL};
  if (w_room(&w, headroom + (w.cap ? 1 : 255)) < 0) { /* a first block when none was given */
    if (!w.fixed) free(w.buf);
    return NULL;
  }
  w.len = headroom;
  enc_msg(&w, msg);
  if (w.oom) {
    if (!w.fixed) free(w.buf);
    return NULL;
  }
  w.buf[w.len] = 0;
  if (len) *len = w.len - headroom;
  return w.buf;
}

char *pbjson_encode_at(const ProtobufCMessage *msg, size_t headroom, size_t *len) {
  return pbjson_encode_fixed(msg, headroom, NULL, 0, len);
}

char *pbjson_encode(const ProtobufCMessage *msg, size_t *len) {
  return pbjson_encode_at(msg, 0, len);
}

/* ------------------------------------------------------------ UTF-8 walk */

static int chk_msg(const ProtobufCMessage *m, pbj_path *path, char *err, size_t errlen);

static int chk_value(const ProtobufCFieldDescriptor *f, const void *p, pbj_path *path, char *err,
                     size_t errlen) {
  if (f->type == PROTOBUF_C_TYPE_STRING) {
    const char *s = *(char *const *)p;
    if (s && !text_utf8_valid(s, strlen(s))) {
      if (err && errlen) snprintf(err, errlen, "invalid UTF-8 in string field \"%s\"", path->s);
      return -1;
    }
    return 0;
  }
  if (f->type == PROTOBUF_C_TYPE_MESSAGE) {
    const ProtobufCMessage *sm = *(ProtobufCMessage *const *)p;
    return sm ? chk_msg(sm, path, err, errlen) : 0;
  }
  return 0;
}

static int cmp_cstr(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A string key twice in the map field f (n entries at arr): -1 and the text. */
static int chk_map_keys(const ProtobufCFieldDescriptor *f, const char *arr, size_t n, pbj_path *path,
                        char *err, size_t errlen) {
  const ProtobufCFieldDescriptor *kf = &((const ProtobufCMessageDescriptor *)f->descriptor)->fields[0];
  if (n < 2 || kf->type != PROTOBUF_C_TYPE_STRING) return 0;
  const char **keys = malloc(n * sizeof *keys);
  if (!keys) {
    if (err && errlen) snprintf(err, errlen, "out of memory checking field \"%s\"", path->s);
    return -1;
  }
  size_t k = 0;
  for (size_t j = 0; j < n; j++) {
    const ProtobufCMessage *e = ((ProtobufCMessage *const *)arr)[j];
    const char *s = e ? *(char *const *)PBJ_MEMBER(e, kf) : NULL;
    keys[k++] = s ? s : "";
  }
  qsort(keys, k, sizeof *keys, cmp_cstr);
  int dup = 0;
  for (size_t j = 1; j < k && !dup; j++) dup = strcmp(keys[j - 1], keys[j]) == 0;
  free(keys);
  if (dup && err && errlen) snprintf(err, errlen, "duplicate map key in field \"%s\"", path->s);
  return dup ? -1 : 0;
}

static int chk_msg(const ProtobufCMessage *m, pbj_path *path, char *err, size_t errlen) {
  const ProtobufCMessageDescriptor *d = m->descriptor;
  for (unsigned i = 0; i < d->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &d->fields[i];
    if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE) continue;
    if ((f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) && !pbj_oneof_selected(m, f)) continue;
    const void *p = PBJ_MEMBER(m, f);
    size_t mark = pbj_path_field(path, f->name);
    if (f->label != PROTOBUF_C_LABEL_REPEATED) {
      if (chk_value(f, p, path, err, errlen) < 0) return -1;
    } else {
      size_t n = *(const size_t *)PBJ_QUANT(m, f);
      const char *arr = *(const char *const *)p;
      size_t sz = pbj_elt_size(f->type);
      int map = pbj_is_map(d, f);
      if (map && arr && chk_map_keys(f, arr, n, path, err, errlen) < 0) return -1;
      for (size_t j = 0; arr && j < n; j++) {
        size_t mk = pbj_path_index(path, j);
        if (map) {
          /* name map entries by their key when it is printable */
          const ProtobufCMessage *e = ((ProtobufCMessage *const *)arr)[j];
          const ProtobufCFieldDescriptor *kf =
              &((const ProtobufCMessageDescriptor *)f->descriptor)->fields[0];
          if (e && kf->type == PROTOBUF_C_TYPE_STRING) {
            const char *k = *(char *const *)PBJ_MEMBER(e, kf);
            if (k && text_utf8_valid(k, strlen(k))) {
              pbj_path_pop(path, mk);
              pbj_path_key(path, k, strlen(k));
            }
          }
        }
        if (chk_value(f, arr + j * sz, path, err, errlen) < 0) return -1;
        pbj_path_pop(path, mk);
      }
    }
    pbj_path_pop(path, mark);
  }
  return 0;
}

int pbjson_check_decoded(const ProtobufCMessage *msg, char *err, size_t errlen) {
  if (!msg) return 0;
  pbj_path path = {{0}, 0};
  return chk_msg(msg, &path, err, errlen);
}
