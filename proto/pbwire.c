/* pbwire — see pbwire.h. */
#include "proto/pbwire.h"
#include "proto/wire.h"

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
