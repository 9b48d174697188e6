/* wire — protobuf varints and field headers; see wire.h. */
#include "proto/wire.h"

#include <string.h>

size_t wire_varint_len(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

size_t wire_varint_put(uint8_t *out, uint64_t v) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

int wire_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  const uint8_t *q = *p;
  uint64_t r = 0;
  for (int i = 0; i < WIRE_VARINT_MAX && q < end; i++) {
    uint8_t b = *q++;
    r |= (uint64_t)(b & 0x7f) << (7 * i); /* the 10th byte's bits past 64 fall off */
    if (!(b & 0x80)) {
      *v = r;
      *p = q;
      return 0;
    }
  }
  return -1;
}

size_t wire_len_field_size(uint32_t field, uint64_t len) {
  return wire_varint_len(wire_key(field, WIRE_T_LEN)) + wire_varint_len(len) + len;
}

size_t wire_prepend_len(uint8_t *buf, size_t off, uint32_t field, uint64_t len) {
  uint8_t v[2 * WIRE_VARINT_MAX];
  size_t n = wire_varint_put(v, wire_key(field, WIRE_T_LEN));
  n += wire_varint_put(v + n, len);
  off -= n;
  memcpy(buf + off, v, n);
  return off;
}
