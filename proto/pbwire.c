/* pbwire — see pbwire.h. */
#include "proto/pbwire.h"
#include "proto/wire.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static int pbwire_scan(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth) {
  const uint8_t *end = p + n;
  if (depth > 64) return 0;
  while (p < end) {
    uint64_t key, len;
    if (wire_varint_get(&p, end, &key)) return 0;
    unsigned wt = (unsigned)(key & 7);
    uint32_t num = (uint32_t)(key >> 3);
    switch (wt) {
      case WIRE_T_VARINT:
        if (wire_varint_get(&p, end, &len)) return 0;
        break;
      case WIRE_T_I64:
        if ((size_t)(end - p) < 8) return 0;
        p += 8;
        break;
      case WIRE_T_I32:
        if ((size_t)(end - p) < 4) return 0;
        p += 4;
        break;
      case WIRE_T_LEN: {
        if (wire_varint_get(&p, end, &len) || len > (uint64_t)(end - p)) return 0;
        const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, num);
        if (f && f->type == PROTOBUF_C_TYPE_STRING && memchr(p, 0, (size_t)len)) return 1;
        if (f && f->type == PROTOBUF_C_TYPE_MESSAGE &&
            pbwire_scan(f->descriptor, p, (size_t)len, depth + 1))
          return 1;
        p += len;
        break;
      }
      default:
        return 0;
    }
  }
  return 0;
}

int pbwire_has_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n) {
  return pbwire_scan(d, p, n, 0);
}

ProtobufCMessage *pbwire_unpack_mem(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                    pbmem *m) {
  return protobuf_c_message_unpack(d, &m->a, n, p);
}

/* Keys and length prefixes are read exactly as protobuf-c 1.4 reads them
 * (parse_tag_and_wiretype, scan_length_prefixed_data): at most 5 bytes
 * each, a key refused only when its first byte has no field bits (so
 * "80 00" is field 0, an unknown field), a length over INT_MAX refused.  A
 * walk that split fields differently could miss the field set again after
 * the big one, or take a key protobuf-c refuses (test_pbwire, fuzz_pbwire). */
#define PB_HEAD_MAX 5

/* 0 and *v, 1 not all here yet, -1 invalid.  key: the key's rules. */
static int head_get(const uint8_t **q, const uint8_t *end, int more, int key, uint64_t *v) {
  const uint8_t *a = *q;
  if (a >= end) return more ? 1 : -1;
  if (key && (a[0] & 0xf8) == 0) return -1;
  uint64_t r = 0;
  for (unsigned i = 0; i < PB_HEAD_MAX; i++) {
    if (a + i >= end) return more ? 1 : -1;
    r |= (uint64_t)(a[i] & 0x7f) << (7 * i);
    if (!(a[i] & 0x80)) {
      *q = a + i + 1;
      *v = r;
      return 0;
    }
  }
  return -1;
}

/* The field at p[*s]: 0 walked past it (*s moved on, *num and *wt set,
 * for a length-delimited one *val and *len too without walking its bytes),
 * 1 not all here yet, -1 invalid.  `more`: bytes may still come after n. */
static int field_head(const uint8_t *p, size_t n, int more, size_t *s, uint32_t *num, unsigned *wt,
                      size_t *val, uint64_t *len) {
  const uint8_t *q = p + *s, *end = p + n;
  uint64_t key, v;
  int r = head_get(&q, end, more, 1, &key);
  if (r) return r;
  *wt = (unsigned)(key & 7);
  *num = (uint32_t)(key >> 3); /* bits past 32 fall off, as in protobuf-c */
  const uint8_t *a = q;
  switch (*wt) {
    case WIRE_T_VARINT:
      if (wire_varint_get(&q, end, &v) != 0) return more && (size_t)(end - a) < WIRE_VARINT_MAX ? 1 : -1;
      break;
    case WIRE_T_I64:
    case WIRE_T_I32: {
      size_t w = *wt == WIRE_T_I64 ? 8 : 4;
      if ((size_t)(end - q) < w) return more ? 1 : -1;
      q += w;
      break;
    }
    case WIRE_T_LEN:
      if ((r = head_get(&q, end, more, 0, len)) != 0) return r;
      if (*len > INT_MAX) return -1;
      *val = (size_t)(q - p);
      break;
    default:
      return -1;
  }
  *s = (size_t)(q - p);
  return 0;
}

/* 1 when a top-level field numbered num is in p[0, n) (valid wire bytes). */
static int has_field(const uint8_t *p, size_t n, uint32_t num) {
  size_t s = 0, val;
  uint64_t len;
  uint32_t k;
  unsigned wt;
  while (s < n) {
    if (field_head(p, n, 0, &s, &k, &wt, &val, &len) != 0) return 0;
    if (k == num) return 1;
    if (wt == WIRE_T_LEN) {
      if (len > (uint64_t)(n - val)) return 0;
      s = val + (size_t)len;
    }
  }
  return 0;
}

pbwire_big_status pbwire_find_big(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                  size_t total, size_t min, size_t within, pbwire_big *b) {
  while (b->scan < n) {
    if (b->scan >= within) return PBWIRE_BIG_NONE;
    size_t s = b->scan, val = 0;
    uint64_t len = 0;
    uint32_t num;
    unsigned wt;
    int r = field_head(p, n, n < total, &s, &num, &wt, &val, &len);
    if (r < 0 || s > total) return PBWIRE_BIG_NONE;
    if (r > 0) return PBWIRE_BIG_NEED;
    if (wt == WIRE_T_LEN) {
      if (len > (uint64_t)(total - val)) return PBWIRE_BIG_NONE;
      const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field(d, num);
      if (f && f->type == PROTOBUF_C_TYPE_BYTES && len >= min && !f->default_value &&
          !(f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
          (f->label == PROTOBUF_C_LABEL_NONE || f->label == PROTOBUF_C_LABEL_OPTIONAL)) {
        if (has_field(p, b->scan, num)) return PBWIRE_BIG_NONE;
        b->key = b->scan;
        b->val = val;
        b->len = (size_t)len;
        b->f = f;
        return PBWIRE_BIG_FOUND;
      }
      if (len > (uint64_t)(n - val)) return PBWIRE_BIG_NEED; /* walked again once it is all here */
      s = val + (size_t)len;
    }
    b->scan = s;
  }
  return b->scan < total ? PBWIRE_BIG_NEED : PBWIRE_BIG_NONE;
}

int pbwire_attach_big(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, const uint8_t *after,
                      size_t after_len, uint8_t *data, size_t len) {
  if (has_field(after, after_len, f->id)) return 0;
  ProtobufCBinaryData *bd = (ProtobufCBinaryData *)((char *)m + f->offset);
  bd->data = data;
  bd->len = len;
  if (f->label == PROTOBUF_C_LABEL_OPTIONAL)
    *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
  return 1;
}
