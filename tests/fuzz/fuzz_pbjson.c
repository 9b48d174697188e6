/* fuzz_pbjson — proto3 JSON decoding of every request message (the first
 * input byte picks the message type).  Property: what decodes encodes, and
 * decoding that encoding gives the same message (compared as packed wire
 * bytes). */
#include <string.h>

#include "proto/agent.pb-c.h"
#include "proto/pbjson.h"
#include "fuzz.h"
#include "fuzz_msgs.h"

static int round_trip(const ProtobufCMessage *m) {
  size_t jl;
  char *j = pbjson_encode(m, &jl);
  FUZZ_CHECK(j != NULL);
  char err[256];
  ProtobufCMessage *back = pbjson_decode(m->descriptor, j, jl, err, sizeof err);
  if (!back) fprintf(stderr, "re-decode of %.*s failed: %s\n", (int)jl, j, err);
  FUZZ_CHECK(back != NULL);
  size_t a = protobuf_c_message_get_packed_size(m), b = protobuf_c_message_get_packed_size(back);
  FUZZ_CHECK(a == b);
  uint8_t *pa = malloc(a + 1), *pb = malloc(b + 1);
  protobuf_c_message_pack(m, pa);
  protobuf_c_message_pack(back, pb);
  FUZZ_CHECK(memcmp(pa, pb, a) == 0);
  free(pa);
  free(pb);
  free(j);
  protobuf_c_message_free_unpacked(back, NULL);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const ProtobufCMessageDescriptor *d = fuzz_msgs[data[0] % FUZZ_NMSGS];
  char err[256];
  ProtobufCMessage *m = pbjson_decode(d, (const char *)data + 1, size - 1, err, sizeof err);
  if (!m) {
    FUZZ_CHECK(err[0] != 0); /* every failure says why */
    return 0;
  }
  round_trip(m);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
