/* pbwire — see pbwire.h. */
#include "proto/pbwire.h"

#include <stdlib.h>
#include <string.h>

static int pbwire_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

static int pbwire_scan(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n, int depth) {
  const uint8_t *end = p + n;
  if (depth > 64) return 0;
  while (p < end) {
    uint64_t key, len;
    if (pbwire_varint(&p, end, &key)) return 0;
    unsigned wt = (unsigned)(key & 7);
    uint32_t num = (uint32_t)(key >> 3);
    switch (wt) {
      case 0:
        if (pbwire_varint(&p, end, &len)) return 0;
        break;
      case 1:
        if ((size_t)(end - p) < 8) return 0;
        p += 8;
        break;
      case 5:
        if ((size_t)(end - p) < 4) return 0;
        p += 4;
        break;
      case 2: {
        if (pbwire_varint(&p, end, &len) || len > (uint64_t)(end - p)) return 0;
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
