/* test_wire — proto/wire.h: varints at every boundary, in both directions
 * and against protobuf-c's own encoder; field headers written in front of
 * a payload as fs/download.c and proc/fanout.c do. */
#include "tests/unit/test.h"
#include "proto/wire.h"
#include "proto/agent.pb-c.h"

#include <stdlib.h>

static int get(const uint8_t *b, size_t n, uint64_t *v, size_t *used) {
  const uint8_t *p = b;
  int r = wire_varint_get(&p, b + n, v);
  *used = (size_t)(p - b);
  return r;
}

TEST(varint_boundaries) {
  static const struct {
    uint64_t v;
    size_t len;
    const char *bytes;
  } cases[] = {
      {0, 1, "\x00"},
      {1, 1, "\x01"},
      {127, 1, "\x7f"},
      {128, 2, "\x80\x01"},
      {300, 2, "\xac\x02"},
      {16383, 2, "\xff\x7f"},
      {16384, 3, "\x80\x80\x01"},
      {(1ull << 21) - 1, 3, "\xff\xff\x7f"},
      {1ull << 28, 5, "\x80\x80\x80\x80\x01"},
      {UINT32_MAX, 5, "\xff\xff\xff\xff\x0f"},
      {1ull << 32, 5, "\x80\x80\x80\x80\x10"},
      {1ull << 35, 6, "\x80\x80\x80\x80\x80\x01"},
      {(1ull << 63) - 1, 9, "\xff\xff\xff\xff\xff\xff\xff\xff\x7f"},
      {1ull << 63, 10, "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"},
      {UINT64_MAX, 10, "\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    uint8_t b[WIRE_VARINT_MAX + 1];
    memset(b, 0xAA, sizeof b);
    ASSERT_EQ(wire_varint_len(cases[i].v), cases[i].len);
    ASSERT_EQ(wire_varint_put(b, cases[i].v), cases[i].len);
    ASSERT_MEM_EQ(b, cases[i].bytes, cases[i].len);
    ASSERT_EQ(b[cases[i].len], 0xAA); /* nothing past it */
    uint64_t v = 12345;
    size_t used;
    ASSERT_EQ(get(b, sizeof b, &v, &used), 0);
    ASSERT(v == cases[i].v);
    ASSERT_EQ(used, cases[i].len);
    /* every cut inside it is truncated */
    for (size_t cut = 0; cut < cases[i].len; cut++) ASSERT_EQ(get(b, cut, &v, &used), -1);
  }
}

TEST(varint_overlong_and_lenient_forms) {
  uint64_t v;
  size_t used;
  /* 11 bytes: never a varint */
  const uint8_t eleven[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
  ASSERT_EQ(get(eleven, sizeof eleven, &v, &used), -1);
  const uint8_t ten_open[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
  ASSERT_EQ(get(ten_open, sizeof ten_open, &v, &used), -1);
  /* redundant zero groups are read (as protobuf-c reads them): 0 in 10 bytes */
  const uint8_t zero10[] = {0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00};
  ASSERT_EQ(get(zero10, sizeof zero10, &v, &used), 0);
  ASSERT(v == 0 && used == 10);
  /* a 10th byte above 1: the bits past 64 are dropped, as protobuf-c does */
  const uint8_t big[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f};
  ASSERT_EQ(get(big, sizeof big, &v, &used), 0);
  ASSERT(v == UINT64_MAX && used == 10);
  ASSERT_EQ(get(NULL, 0, &v, &used), -1);
  /* consecutive varints: the pointer moves past each */
  const uint8_t two[] = {0xac, 0x02, 0x05};
  const uint8_t *p = two;
  ASSERT_EQ(wire_varint_get(&p, two + 3, &v), 0);
  ASSERT(v == 300 && p == two + 2);
  ASSERT_EQ(wire_varint_get(&p, two + 3, &v), 0);
  ASSERT(v == 5 && p == two + 3);
}

/* Around every power of two, the writer agrees with protobuf-c's packer:
 * an int64 field is the varint of the value as uint64 (FileEntry.size = 4,
 * after its 1-byte key). */
TEST(varint_matches_protobuf_c) {
  for (int bit = 0; bit < 64; bit++)
    for (int d = -2; d <= 2; d++) {
      uint64_t v = (1ull << bit) + (uint64_t)(int64_t)d;
      Pb__FileEntry e = PB__FILE_ENTRY__INIT;
      e.size = (int64_t)v;
      uint8_t ref[16], mine[16];
      size_t rn = protobuf_c_message_pack(&e.base, ref);
      mine[0] = (uint8_t)wire_key(4, WIRE_T_VARINT);
      size_t mn = v ? 1 + wire_varint_put(mine + 1, v) : 0;
      ASSERT_EQ(rn, mn);
      ASSERT_MEM_EQ(ref, mine, rn);
      const uint8_t *p = ref + 1;
      uint64_t back;
      if (v) ASSERT(wire_varint_get(&p, ref + rn, &back) == 0 && back == v && p == ref + rn);
    }
}

TEST(prepend_len_frames_like_protobuf_c) {
  /* FileChunk{filepath, content} built back to front as fs/download.c does */
  static const size_t sizes[] = {0, 1, 127, 128, 16383, 16384, 1u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    size_t n = sizes[i];
    const char *path = "/tmp/x";
    size_t head = 1 + WIRE_VARINT_MAX + strlen(path) + 1 + WIRE_VARINT_MAX;
    uint8_t *buf = malloc(head + n);
    ASSERT(buf);
    memset(buf + head, 'c', n);
    size_t off = wire_prepend_len(buf, head, 2, n);
    ASSERT_EQ(head - off, wire_len_field_size(2, n) - n);
    off -= strlen(path);
    memcpy(buf + off, path, strlen(path));
    off = wire_prepend_len(buf, off, 1, strlen(path));

    Pb__FileChunk *c = pb__file_chunk__unpack(NULL, head + n - off, buf + off);
    ASSERT(c != NULL);
    ASSERT_STR_EQ(c->filepath, path);
    ASSERT_EQ(c->content.len, n);
    Pb__FileChunk ref = PB__FILE_CHUNK__INIT;
    ref.filepath = (char *)path;
    ref.content.data = buf + head;
    ref.content.len = n;
    ASSERT_EQ(pb__file_chunk__get_packed_size(&ref), head + n - off - (n ? 0 : 2));
    pb__file_chunk__free_unpacked(c, NULL);
    free(buf);
  }
  /* a field number past 15 takes a 2-byte key */
  uint8_t b[32];
  size_t off = wire_prepend_len(b, sizeof b, 16, 3);
  ASSERT_EQ(sizeof b - off, 3);
  ASSERT_MEM_EQ(b + off, "\x82\x01\x03", 3);
  ASSERT_EQ(wire_len_field_size(16, 3), 6);
  ASSERT_EQ(wire_len_field_size(1, 300), 1 + 2 + 300);
}

int main(void) {
  RUN(varint_boundaries);
  RUN(varint_overlong_and_lenient_forms);
  RUN(varint_matches_protobuf_c);
  RUN(prepend_len_frames_like_protobuf_c);
  return test_summary();
}
