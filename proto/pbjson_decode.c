/* pbjson_decode.c — proto3 canonical JSON → protobuf-c message (pbjson.h).
 *
 * The document is parsed by proto/json.c into a DOM first (strict RFC 8259,
 * UTF-8, depth <= 64, which also bounds the message recursion here), then
 * walked against the message descriptor.  The message is built with the
 * caller's allocator (malloc without one) exactly as
 * protobuf_c_message_unpack would build it, so that
 * protobuf_c_message_free_unpacked(m, allocator) frees it — also halfway through,
 * which is how every error path cleans up: counters of repeated fields are
 * only advanced after the element is complete, oneof cases only set after
 * the member is stored.  Strings are copied out of the DOM (which is freed
 * as a whole); bytes are decoded straight into their final buffer.  The DOM
 * has a memory budget (JSON_MEM_BUDGET); the message needs less than the
 * DOM it comes from (a string element: 8 + its malloc'd copy, against a
 * 56-byte node + the same bytes), so that budget bounds both.
 */
#include "proto/pbjson.h"
#include "proto/pbjson_int.h"
#include "proto/json.h"
#include "proto/text.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dec {
  pbj_path path;
  char *err;
  size_t errlen;
  int had_nul;
  ProtobufCAllocator *a; /* the message's memory (NULL: malloc) */
} dec;

static void *dec_alloc(dec *d, size_t n) {
  return d->a ? d->a->alloc(d->a->allocator_data, n) : malloc(n);
}

static void *dec_zalloc(dec *d, size_t n, size_t sz) {
  if (sz && n > SIZE_MAX / sz) return NULL;
  void *p = dec_alloc(d, n * sz);
  if (p) memset(p, 0, n * sz);
  return p;
}

static void dec_free(dec *d, void *p) {
  if (!p) return;
  if (d->a) d->a->free(d->a->allocator_data, p);
  else free(p);
}

static int dec_fail(dec *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int dec_fail(dec *d, const char *fmt, ...) {
  if (d->err && d->errlen) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(d->err, d->errlen, "invalid value for field \"%s\": %s", d->path.s, msg);
  }
  return -1;
}

static int dec_oom(dec *d) {
  if (d->err && d->errlen) snprintf(d->err, d->errlen, "out of memory");
  return -1;
}

static const char *type_name(ProtobufCType t) {
  switch (t) {
  case PROTOBUF_C_TYPE_INT32: return "int32";
  case PROTOBUF_C_TYPE_SINT32: return "sint32";
  case PROTOBUF_C_TYPE_SFIXED32: return "sfixed32";
  case PROTOBUF_C_TYPE_INT64: return "int64";
  case PROTOBUF_C_TYPE_SINT64: return "sint64";
  case PROTOBUF_C_TYPE_SFIXED64: return "sfixed64";
  case PROTOBUF_C_TYPE_UINT32: return "uint32";
  case PROTOBUF_C_TYPE_FIXED32: return "fixed32";
  case PROTOBUF_C_TYPE_UINT64: return "uint64";
  case PROTOBUF_C_TYPE_FIXED64: return "fixed64";
  case PROTOBUF_C_TYPE_FLOAT: return "float";
  case PROTOBUF_C_TYPE_DOUBLE: return "double";
  case PROTOBUF_C_TYPE_BOOL: return "bool";
  case PROTOBUF_C_TYPE_ENUM: return "enum";
  case PROTOBUF_C_TYPE_STRING: return "string";
  case PROTOBUF_C_TYPE_BYTES: return "bytes";
  case PROTOBUF_C_TYPE_MESSAGE: return "message";
  }
  return "?";
}

/* ------------------------------------------------------------ numbers */

/* The parts of a number in RFC 8259 grammar: -? int (. frac)? ([eE] [+-]? exp)?
 * Returns 0 when s[0..n) is exactly such a number. */
typedef struct numparts {
  int neg;
  size_t ib, ie, fb, fe; /* integer and fraction digit ranges */
  long exp;              /* saturated at +-1e8 */
} numparts;

static int is_dig(char c) { return c >= '0' && c <= '9'; }

static int num_parse(const char *s, size_t n, numparts *np) {
  size_t i = 0;
  memset(np, 0, sizeof *np);
  if (i < n && s[i] == '-') {
    np->neg = 1;
    i++;
  }
  np->ib = i;
  while (i < n && is_dig(s[i])) i++;
  np->ie = i;
  if (np->ie == np->ib || (s[np->ib] == '0' && np->ie - np->ib > 1)) return -1;
  np->fb = np->fe = i;
  if (i < n && s[i] == '.') {
    i++;
    np->fb = i;
    while (i < n && is_dig(s[i])) i++;
    np->fe = i;
    if (np->fe == np->fb) return -1;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    int eneg = 0;
    if (i < n && (s[i] == '+' || s[i] == '-')) eneg = s[i++] == '-';
    size_t eb = i;
    long e = 0;
    while (i < n && is_dig(s[i])) {
      if (e < 100000000) e = e * 10 + (s[i] - '0');
      i++;
    }
    if (i == eb) return -1;
    np->exp = eneg ? -e : e;
  }
  return i == n ? 0 : -1;
}

/* Exact integer value of a number: magnitude in *mag.  NULL on success, else
 * the reason. */
static const char *num_to_int(const char *s, const numparts *np, uint64_t *mag) {
  size_t ni = np->ie - np->ib, nd = ni + (np->fe - np->fb);
#define DIG(k) ((k) < ni ? s[np->ib + (k)] : s[np->fb + (k) - ni])
  size_t first = 0;
  while (first < nd && DIG(first) == '0') first++;
  if (first == nd) {
    *mag = 0;
    return NULL;
  }
  size_t last = nd;
  while (DIG(last - 1) == '0') last--;
  /* value = digits[first..last) * 10^scale, with a non-zero last digit */
  long scale = np->exp - (long)(np->fe - np->fb) + (long)(nd - last);
  if (scale < 0) return "not an integer";
  if ((long)(last - first) + scale > 20) return "out of range";
  uint64_t v = 0;
  for (size_t k = first; k < last; k++) {
    unsigned dg = (unsigned)(DIG(k) - '0');
    if (v > (UINT64_MAX - dg) / 10) return "out of range";
    v = v * 10 + dg;
  }
  for (long k = 0; k < scale; k++) {
    if (v > UINT64_MAX / 10) return "out of range";
    v *= 10;
  }
#undef DIG
  *mag = v;
  return NULL;
}

/* An integer field value: a JSON number or a string holding one; fraction
 * and exponent allowed when the value is integral. */
static int get_int(dec *d, const json_value *v, ProtobufCType t, int is_signed, uint64_t umax,
                   int64_t smax, uint64_t *u, int64_t *s) {
  if (v->type != JSON_NUMBER && v->type != JSON_STRING)
    return dec_fail(d, "expected %s (a number or a numeric string), got %s", type_name(t),
                    json_type_name(v->type));
  numparts np;
  if (num_parse(v->str, v->len, &np) < 0)
    return dec_fail(d, "expected %s, got a string that is not a number", type_name(t));
  uint64_t mag;
  const char *why = num_to_int(v->str, &np, &mag);
  if (why)
    return dec_fail(d, "%.*s%s is %s for %s", v->len > 40 ? 40 : (int)v->len, v->str,
                    v->len > 40 ? "..." : "", why, type_name(t));
  if (is_signed) {
    if (np.neg) {
      if (mag > (uint64_t)smax + 1) goto range; /* |smin| == smax + 1 */
      *s = mag == 0 ? 0 : -(int64_t)(mag - 1) - 1;
    } else {
      if (mag > (uint64_t)smax) goto range;
      *s = (int64_t)mag;
    }
  } else {
    if ((np.neg && mag) || mag > umax) goto range;
    *u = mag;
  }
  return 0;
range:
  return dec_fail(d, "%.*s%s is out of range for %s", v->len > 40 ? 40 : (int)v->len, v->str,
                  v->len > 40 ? "..." : "", type_name(t));
}

static int get_double(dec *d, const json_value *v, int is_float, double *out) {
  if (v->type == JSON_STRING) {
    if (strcmp(v->str, "NaN") == 0 && v->len == 3) {
      *out = NAN;
      return 0;
    }
    if (strcmp(v->str, "Infinity") == 0 && v->len == 8) {
      *out = INFINITY;
      return 0;
    }
    if (strcmp(v->str, "-Infinity") == 0 && v->len == 9) {
      *out = -INFINITY;
      return 0;
    }
  } else if (v->type != JSON_NUMBER) {
    return dec_fail(d, "expected a number, got %s", json_type_name(v->type));
  }
  numparts np;
  if (num_parse(v->str, v->len, &np) < 0 || strlen(v->str) != v->len)
    return dec_fail(d, "expected a number, got a string that is not a number");
  double x = strtod(v->str, NULL);
  if (isinf(x) || (is_float && fabs(x) > FLT_MAX))
    return dec_fail(d, "number out of range for %s", is_float ? "float" : "double");
  *out = x;
  return 0;
}

/* ------------------------------------------------------------ values */

static ProtobufCMessage *dec_msg(dec *d, const ProtobufCMessageDescriptor *md, json_value *obj);

/* A malloc'd copy of a decoded JSON string (NUL-terminated); NULL when out
 * of memory. */
static char *copy_str(dec *d, const char *s, size_t len) {
  char *c = dec_alloc(d, len + 1);
  if (!c) return NULL;
  memcpy(c, s, len + 1);
  if (memchr(s, 0, len)) d->had_nul = 1;
  return c;
}

/* One value of field f's type into dst (the storage of one element). On
 * failure dst is untouched and nothing is left allocated. */
static int dec_value(dec *d, const ProtobufCFieldDescriptor *f, json_value *v, void *dst) {
  uint64_t u = 0;
  int64_t s = 0;
  switch (f->type) {
  case PROTOBUF_C_TYPE_INT32: case PROTOBUF_C_TYPE_SINT32: case PROTOBUF_C_TYPE_SFIXED32:
    if (get_int(d, v, f->type, 1, 0, INT32_MAX, &u, &s) < 0) return -1;
    *(int32_t *)dst = (int32_t)s;
    return 0;
  case PROTOBUF_C_TYPE_INT64: case PROTOBUF_C_TYPE_SINT64: case PROTOBUF_C_TYPE_SFIXED64:
    if (get_int(d, v, f->type, 1, 0, INT64_MAX, &u, &s) < 0) return -1;
    *(int64_t *)dst = s;
    return 0;
  case PROTOBUF_C_TYPE_UINT32: case PROTOBUF_C_TYPE_FIXED32:
    if (get_int(d, v, f->type, 0, UINT32_MAX, 0, &u, &s) < 0) return -1;
    *(uint32_t *)dst = (uint32_t)u;
    return 0;
  case PROTOBUF_C_TYPE_UINT64: case PROTOBUF_C_TYPE_FIXED64:
    if (get_int(d, v, f->type, 0, UINT64_MAX, 0, &u, &s) < 0) return -1;
    *(uint64_t *)dst = u;
    return 0;
  case PROTOBUF_C_TYPE_FLOAT: case PROTOBUF_C_TYPE_DOUBLE: {
    double x = 0;
    if (get_double(d, v, f->type == PROTOBUF_C_TYPE_FLOAT, &x) < 0) return -1;
    if (f->type == PROTOBUF_C_TYPE_FLOAT) *(float *)dst = (float)x;
    else *(double *)dst = x;
    return 0;
  }
  case PROTOBUF_C_TYPE_BOOL:
    if (v->type != JSON_TRUE && v->type != JSON_FALSE)
      return dec_fail(d, "expected true or false, got %s", json_type_name(v->type));
    *(protobuf_c_boolean *)dst = v->type == JSON_TRUE;
    return 0;
  case PROTOBUF_C_TYPE_ENUM: {
    if (v->type == JSON_STRING) {
      const ProtobufCEnumValue *ev =
          f->descriptor ? protobuf_c_enum_descriptor_get_value_by_name(f->descriptor, v->str) : NULL;
      if (!ev || strlen(v->str) != v->len) return dec_fail(d, "unknown enum value name");
      *(int *)dst = ev->value;
      return 0;
    }
    if (v->type != JSON_NUMBER)
      return dec_fail(d, "expected an enum name or number, got %s", json_type_name(v->type));
    if (get_int(d, v, f->type, 1, 0, INT32_MAX, &u, &s) < 0) return -1;
    *(int *)dst = (int)s;
    return 0;
  }
  case PROTOBUF_C_TYPE_STRING:
    if (v->type != JSON_STRING) return dec_fail(d, "expected a string, got %s", json_type_name(v->type));
    if (!(*(char **)dst = copy_str(d, v->str, v->len))) return dec_oom(d);
    return 0;
  case PROTOBUF_C_TYPE_BYTES: {
    if (v->type != JSON_STRING)
      return dec_fail(d, "expected a base64 string, got %s", json_type_name(v->type));
    unsigned char *buf = dec_alloc(d, TEXT_B64_DECODED_MAX(v->len));
    if (!buf) return dec_oom(d);
    long n = text_b64_decode(v->str, v->len, buf);
    if (n < 0) {
      dec_free(d, buf);
      return dec_fail(d, "invalid base64");
    }
    ProtobufCBinaryData *b = dst;
    if (n == 0) {
      dec_free(d, buf);
      buf = NULL;
    }
    b->data = buf;
    b->len = (size_t)n;
    return 0;
  }
  case PROTOBUF_C_TYPE_MESSAGE: {
    if (v->type != JSON_OBJECT) return dec_fail(d, "expected an object, got %s", json_type_name(v->type));
    ProtobufCMessage *sm = dec_msg(d, f->descriptor, v);
    if (!sm) return -1;
    *(ProtobufCMessage **)dst = sm;
    return 0;
  }
  }
  return dec_fail(d, "unsupported field type");
}

/* After a singular field was stored: record its presence. */
static void mark_set(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f) {
  if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
    uint32_t c = f->id;
    memcpy(PBJ_QUANT(m, f), &c, sizeof c);
  } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_MESSAGE &&
             f->type != PROTOBUF_C_TYPE_STRING) {
    *(protobuf_c_boolean *)PBJ_QUANT(m, f) = 1;
  }
}

/* A map key (the JSON member name) into the key field of an entry. */
static int dec_map_key(dec *d, const ProtobufCFieldDescriptor *kf, json_value *obj, size_t j,
                       void *dst) {
  const char *k = obj->keys[j];
  size_t kl = obj->key_lens[j];
  if (kf->type == PROTOBUF_C_TYPE_STRING) {
    if (!(*(char **)dst = copy_str(d, k, kl))) return dec_oom(d);
    return 0;
  }
  if (kf->type == PROTOBUF_C_TYPE_BOOL) {
    if (kl == 4 && memcmp(k, "true", 4) == 0) *(protobuf_c_boolean *)dst = 1;
    else if (kl == 5 && memcmp(k, "false", 5) == 0) *(protobuf_c_boolean *)dst = 0;
    else return dec_fail(d, "map key must be \"true\" or \"false\"");
    return 0;
  }
  /* integer keys: plain decimal, no fraction or exponent, no "-0" */
  size_t i = (kl && k[0] == '-') ? 1 : 0;
  int ok = i < kl && !(k[i] == '0' && (kl - i > 1 || i == 1));
  for (size_t q = i; ok && q < kl; q++) ok = is_dig(k[q]);
  if (!ok) return dec_fail(d, "map key is not a decimal %s", type_name(kf->type));
  json_value kv = {.type = JSON_STRING, .str = obj->keys[j], .len = kl};
  return dec_value(d, kf, &kv, dst);
}

typedef struct keyref {
  const char *k;
  size_t len;
} keyref;

static int keyref_cmp(const void *a, const void *b) {
  const keyref *x = a, *y = b;
  size_t n = x->len < y->len ? x->len : y->len;
  int c = memcmp(x->k, y->k, n);
  if (c) return c;
  return x->len < y->len ? -1 : x->len > y->len;
}

static int dec_map(dec *d, ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, json_value *v) {
  if (v->type != JSON_OBJECT) return dec_fail(d, "expected an object (map), got %s", json_type_name(v->type));
  if (v->n == 0) return 0;
  /* duplicate keys: sort references, compare neighbours */
  keyref *refs = malloc(v->n * sizeof *refs);
  if (!refs) return dec_oom(d);
  for (size_t j = 0; j < v->n; j++) refs[j] = (keyref){v->keys[j], v->key_lens[j]};
  qsort(refs, v->n, sizeof *refs, keyref_cmp);
  for (size_t j = 1; j < v->n; j++) {
    if (keyref_cmp(&refs[j - 1], &refs[j]) == 0) {
      size_t mk = pbj_path_key(&d->path, refs[j].k, refs[j].len);
      (void)mk;
      free(refs);
      return dec_fail(d, "duplicate map key");
    }
  }
  free(refs);

  const ProtobufCMessageDescriptor *ed = f->descriptor;
  const ProtobufCFieldDescriptor *kf = &ed->fields[0], *vf = &ed->fields[1];
  ProtobufCMessage **arr = dec_zalloc(d, v->n, sizeof *arr);
  if (!arr) return dec_oom(d);
  size_t *np = PBJ_QUANT(m, f);
  *(ProtobufCMessage ***)PBJ_MEMBER(m, f) = arr;
  *np = 0;
  for (size_t j = 0; j < v->n; j++) {
    size_t mk = pbj_path_key(&d->path, v->keys[j], v->key_lens[j]);
    ProtobufCMessage *e = dec_alloc(d, ed->sizeof_message);
    if (!e) return dec_oom(d);
    ed->message_init(e);
    arr[(*np)++] = e;
    if (v->items[j].type == JSON_NULL) return dec_fail(d, "null is not allowed as a map value");
    if (dec_map_key(d, kf, v, j, PBJ_MEMBER(e, kf)) < 0) return -1;
    mark_set(e, kf);
    if (dec_value(d, vf, &v->items[j], PBJ_MEMBER(e, vf)) < 0) return -1;
    mark_set(e, vf);
    pbj_path_pop(&d->path, mk);
  }
  return 0;
}

static int dec_field(dec *d, const ProtobufCMessageDescriptor *md, ProtobufCMessage *m,
                     const ProtobufCFieldDescriptor *f, json_value *v) {
  if (f->label != PROTOBUF_C_LABEL_REPEATED) {
    if (dec_value(d, f, v, PBJ_MEMBER(m, f)) < 0) return -1;
    mark_set(m, f);
    return 0;
  }
  if (pbj_is_map(md, f)) return dec_map(d, m, f, v);
  if (v->type != JSON_ARRAY) return dec_fail(d, "expected an array, got %s", json_type_name(v->type));
  if (v->n == 0) return 0;
  size_t sz = pbj_elt_size(f->type);
  char *arr = dec_zalloc(d, v->n, sz);
  if (!arr) return dec_oom(d);
  size_t *np = PBJ_QUANT(m, f);
  *(char **)PBJ_MEMBER(m, f) = arr;
  *np = 0;
  for (size_t j = 0; j < v->n; j++) {
    size_t mk = pbj_path_index(&d->path, j);
    if (v->items[j].type == JSON_NULL) return dec_fail(d, "null is not allowed in a repeated field");
    if (dec_value(d, f, &v->items[j], arr + j * sz) < 0) return -1;
    (*np)++;
    pbj_path_pop(&d->path, mk);
  }
  return 0;
}

/* The field named key (proto name or lowerCamelCase JSON name), or NULL. */
static const ProtobufCFieldDescriptor *find_field(const ProtobufCMessageDescriptor *md, const char *key,
                                                  size_t klen) {
  for (unsigned i = 0; i < md->n_fields; i++) {
    const ProtobufCFieldDescriptor *f = &md->fields[i];
    if ((strlen(f->name) == klen && memcmp(f->name, key, klen) == 0) ||
        pbj_json_name_eq(f->name, key, klen))
      return f;
  }
  return NULL;
}

static ProtobufCMessage *dec_msg(dec *d, const ProtobufCMessageDescriptor *md, json_value *obj) {
  ProtobufCMessage *m = dec_alloc(d, md->sizeof_message);
  if (!m) {
    dec_oom(d);
    return NULL;
  }
  md->message_init(m);
  /* per field: 0 not seen, 1 seen as null, 2 seen with a value */
  unsigned char seen_small[64];
  unsigned char *seen = md->n_fields <= sizeof seen_small ? seen_small : calloc(md->n_fields, 1);
  if (!seen) {
    dec_oom(d);
    goto bad;
  }
  memset(seen, 0, md->n_fields);
  for (size_t i = 0; i < obj->n; i++) {
    const ProtobufCFieldDescriptor *f = find_field(md, obj->keys[i], obj->key_lens[i]);
    if (!f) continue; /* unknown field: ignored, whatever its value */
    unsigned fi = (unsigned)(f - md->fields);
    json_value *v = &obj->items[i];
    size_t mark = pbj_path_field(&d->path, f->name);
    if (seen[fi]) {
      if (d->err && d->errlen) snprintf(d->err, d->errlen, "duplicate field \"%s\"", d->path.s);
      goto bad;
    }
    seen[fi] = v->type == JSON_NULL ? 1 : 2;
    if (v->type != JSON_NULL) {
      if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
        for (unsigned g = 0; g < md->n_fields; g++) {
          const ProtobufCFieldDescriptor *o = &md->fields[g];
          if (g != fi && seen[g] == 2 && (o->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
              o->quantifier_offset == f->quantifier_offset) {
            if (d->err && d->errlen)
              snprintf(d->err, d->errlen,
                       "field \"%s\" and field \"%s\" belong to the same oneof; only one may be set",
                       d->path.s, o->name);
            goto bad;
          }
        }
      }
      if (dec_field(d, md, m, f, v) < 0) goto bad;
    }
    pbj_path_pop(&d->path, mark);
  }
  if (seen != seen_small) free(seen);
  return m;
bad:
  if (seen && seen != seen_small) free(seen);
  protobuf_c_message_free_unpacked(m, d->a);
  return NULL;
}

/* ------------------------------------------------------------ entry points */

ProtobufCMessage *pbjson_decode_mem(const ProtobufCMessageDescriptor *desc, const char *json,
                                    size_t len, ProtobufCAllocator *a, int *flags, char *err,
                                    size_t errlen) {
  if (flags) *flags = 0;
  if (err && errlen) err[0] = 0;
  if (!json || len == 0) {
    if (err && errlen) snprintf(err, errlen, "empty JSON body (expected an object)");
    return NULL;
  }
  char perr[160];
  int over = 0;
  /* a small document's tree lives on the stack */
  char dom[2048];
  json_value *root = json_parse_in(json, len, JSON_MEM_BUDGET(len), dom, sizeof dom, perr, sizeof perr, &over);
  if (!root) {
    if (over) {
      if (flags) *flags = PBJSON_TOO_BIG;
      if (err && errlen)
        snprintf(err, errlen, "message needs more than %zu bytes of memory to decode",
                 (size_t)JSON_MEM_BUDGET(len));
    } else if (err && errlen) {
      snprintf(err, errlen, "invalid JSON: %s", perr);
    }
    return NULL;
  }
  if (root->type != JSON_OBJECT) {
    if (err && errlen)
      snprintf(err, errlen, "expected a JSON object for message %s, got %s", desc->name,
               json_type_name(root->type));
    json_free(root);
    return NULL;
  }
  dec d = {.err = err, .errlen = errlen, .a = a};
  ProtobufCMessage *m = dec_msg(&d, desc, root);
  json_free(root);
  if (m && flags && d.had_nul) *flags = PBJSON_HAD_NUL;
  return m;
}

ProtobufCMessage *pbjson_decode_ex(const ProtobufCMessageDescriptor *desc, const char *json,
                                   size_t len, int *flags, char *err, size_t errlen) {
  return pbjson_decode_mem(desc, json, len, NULL, flags, err, errlen);
}

ProtobufCMessage *pbjson_decode(const ProtobufCMessageDescriptor *desc, const char *json, size_t len,
                                char *err, size_t errlen) {
  return pbjson_decode_ex(desc, json, len, NULL, err, errlen);
}
