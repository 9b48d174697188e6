/* fuzz_pbwire — protobuf decoding as the server does it (protobuf-c
 * unpack, then the UTF-8 and NUL checks), the first byte picking the
 * message type.  Property: a message that passes the checks survives
 * proto → JSON → proto → JSON unchanged (JSON compared, not wire bytes:
 * protobuf-c keeps unknown fields, which JSON rightly drops).  And the
 * varint reader of proto/wire.h, over the same bytes: a varint it takes is
 * never shorter than the writer's form of its value, and is exactly that
 * form when it has no redundant trailing zero groups.  And the big-field
 * split of connect.c: where pbwire_find_big finds one (walked byte by
 * byte as the bytes would arrive, any size), the rest decodes exactly when
 * the whole does, and with the field attached packs to the same bytes. */
#include <string.h>

#include "proto/pbjson.h"
#include "proto/pbwire.h"
#include "proto/wire.h"
#include "fuzz.h"
#include "fuzz_msgs.h"

static void varints(const uint8_t *p, const uint8_t *end) {
  while (p < end) {
    const uint8_t *q = p;
    uint64_t v;
    if (wire_varint_get(&q, end, &v) != 0) {
      FUZZ_CHECK(end - p < WIRE_VARINT_MAX || (p[9] & 0x80)); /* truncated or 11+ bytes */
      return;
    }
    size_t c = (size_t)(q - p), l = wire_varint_len(v);
    FUZZ_CHECK(c >= 1 && c <= WIRE_VARINT_MAX && l <= c);
    if (c == 1 || (q[-1] != 0 && (c < WIRE_VARINT_MAX || q[-1] == 1))) {
      uint8_t b[WIRE_VARINT_MAX];
      FUZZ_CHECK(wire_varint_put(b, v) == c && memcmp(b, p, c) == 0);
    }
    p = q;
  }
}

static void same_split(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                       const ProtobufCMessage *whole) {
  pbwire_big b;
  memset(&b, 0, sizeof b);
  pbwire_big_status st = PBWIRE_BIG_NEED;
  for (size_t k = 0; k <= n && st == PBWIRE_BIG_NEED; k++) st = pbwire_find_big(d, p, k, n, 1, n, &b);
  if (st != PBWIRE_BIG_FOUND) return;
  FUZZ_CHECK(b.key < b.val && b.val + b.len <= n && b.f != NULL);
  size_t rl = b.key + (n - b.val - b.len);
  uint8_t *rest = malloc(rl + 1), *blk = malloc(b.len + 1);
  FUZZ_CHECK(rest && blk);
  memcpy(rest, p, b.key);
  memcpy(rest + b.key, p + b.val + b.len, n - b.val - b.len);
  memcpy(blk, p + b.val, b.len);
  ProtobufCMessage *s = protobuf_c_message_unpack(d, NULL, rl, rest);
  FUZZ_CHECK((s != NULL) == (whole != NULL)); /* refused whole, refused split */
  if (!s) {
    free(rest);
    free(blk);
    return;
  }
  if (!pbwire_attach_big(s, b.f, rest + b.key, rl - b.key, blk, b.len)) free(blk);
  size_t a = protobuf_c_message_get_packed_size(whole), sl = protobuf_c_message_get_packed_size(s);
  FUZZ_CHECK(a == sl);
  uint8_t *pa = malloc(a + 1), *ps = malloc(sl + 1);
  FUZZ_CHECK(pa && ps);
  protobuf_c_message_pack(whole, pa);
  protobuf_c_message_pack(s, ps);
  FUZZ_CHECK(memcmp(pa, ps, a) == 0);
  free(pa);
  free(ps);
  free(rest);
  protobuf_c_message_free_unpacked(s, NULL);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  varints(data, data + size);
  if (size < 1) return 0;
  const ProtobufCMessageDescriptor *d = fuzz_msgs[data[0] % FUZZ_NMSGS];
  ProtobufCMessage *m = protobuf_c_message_unpack(d, NULL, size - 1, data + 1);
  int nul = pbwire_has_nul_string(d, data + 1, size - 1);
  same_split(d, data + 1, size - 1, m);
  if (!m) return 0;
  char err[256];
  if (pbjson_check_decoded(m, err, sizeof err) != 0 || nul) {
    protobuf_c_message_free_unpacked(m, NULL);
    return 0;
  }
  size_t jl;
  char *j = pbjson_encode(m, &jl);
  FUZZ_CHECK(j != NULL);
  ProtobufCMessage *back = pbjson_decode(d, j, jl, err, sizeof err);
  if (!back) fprintf(stderr, "decode of our own JSON %.*s failed: %s\n", (int)jl, j, err);
  FUZZ_CHECK(back != NULL);
  size_t jl2;
  char *j2 = pbjson_encode(back, &jl2);
  FUZZ_CHECK(j2 != NULL && jl2 == jl && memcmp(j, j2, jl) == 0);
  free(j2);
  free(j);
  protobuf_c_message_free_unpacked(back, NULL);
  protobuf_c_message_free_unpacked(m, NULL);
  return 0;
}
