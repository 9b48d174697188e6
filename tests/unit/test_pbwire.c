/* test_pbwire — proto/pbwire.h: a message's big bytes field found while the
 * message arrives (every cut point, resumed walks, the refusals), and the
 * rest decoded with the field attached giving the same message as
 * unpacking the whole; the NUL scan of string fields. */
#include "tests/unit/test.h"
#include "proto/pbwire.h"
#include "proto/wire.h"
#include "proto/agent.pb-c.h"

#include <stdlib.h>
#include <string.h>

typedef struct buf {
  uint8_t *p;
  size_t len;
} buf;

static void put(buf *b, const void *d, size_t n) {
  b->p = realloc(b->p, b->len + n + 1);
  if (!b->p) abort();
  memcpy(b->p + b->len, d, n);
  b->len += n;
}
static void put_varint(buf *b, uint64_t v) {
  uint8_t t[WIRE_VARINT_MAX];
  put(b, t, wire_varint_put(t, v));
}
static void put_len(buf *b, uint32_t field, const void *d, size_t n) {
  put_varint(b, wire_key(field, WIRE_T_LEN));
  put_varint(b, n);
  put(b, d, n);
}
static uint8_t *pattern(size_t n) {
  uint8_t *d = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i * 31 + 7);
  return d;
}

/* Walk p[0, total) as it arrives, n bytes at a time growing by step;
 * returns the final status and the n at which it was given. */
static pbwire_big_status walk(const ProtobufCMessageDescriptor *d, const buf *m, size_t step, size_t min,
                              size_t within, pbwire_big *b, size_t *at) {
  memset(b, 0, sizeof *b);
  for (size_t n = 0;; n = n + step < m->len ? n + step : m->len) {
    pbwire_big_status st = pbwire_find_big(d, m->p, n, m->len, min, within, b);
    if (st != PBWIRE_BIG_NEED || n == m->len) {
      *at = n;
      return st;
    }
  }
}

/* The message decoded the split way: the rest, then the field attached. */
static ProtobufCMessage *split_unpack(const ProtobufCMessageDescriptor *d, const buf *m, const pbwire_big *b) {
  buf rest = {0};
  put(&rest, m->p, b->key);
  put(&rest, m->p + b->val + b->len, m->len - b->val - b->len);
  ProtobufCMessage *r = protobuf_c_message_unpack(d, NULL, rest.len, rest.p);
  if (r) {
    uint8_t *blk = malloc(b->len);
    memcpy(blk, m->p + b->val, b->len);
    if (!pbwire_attach_big(r, b->f, rest.p + b->key, rest.len - b->key, blk, b->len)) free(blk);
  }
  free(rest.p);
  return r;
}

/* Both decodes pack to the same bytes. */
static void same_message(const ProtobufCMessageDescriptor *d, const buf *m, const pbwire_big *b) {
  ProtobufCMessage *whole = protobuf_c_message_unpack(d, NULL, m->len, m->p);
  ProtobufCMessage *split = split_unpack(d, m, b);
  ASSERT(whole && split);
  size_t a = protobuf_c_message_get_packed_size(whole), s = protobuf_c_message_get_packed_size(split);
  ASSERT_EQ(a, s);
  uint8_t *pa = malloc(a + 1), *ps = malloc(s + 1);
  protobuf_c_message_pack(whole, pa);
  protobuf_c_message_pack(split, ps);
  ASSERT_MEM_EQ(pa, ps, a);
  free(pa);
  free(ps);
  protobuf_c_message_free_unpacked(whole, NULL);
  protobuf_c_message_free_unpacked(split, NULL);
}

TEST(file_chunk_found_at_every_cut) {
  const ProtobufCMessageDescriptor *d = &pb__file_chunk__descriptor;
  size_t n = 100000;
  uint8_t *content = pattern(n);
  buf m = {0};
  put_len(&m, 1, "/home/user/a.bin", 16);
  size_t key = m.len;
  put_len(&m, 2, content, n);
  size_t val = key + 1 + wire_varint_len(n);
  /* asked once per byte, the walk resumed each time: FOUND exactly when
   * the field's length is all here */
  pbwire_big b;
  size_t at;
  ASSERT_EQ(walk(d, &m, 1, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  ASSERT_EQ(at, val);
  ASSERT_EQ(b.key, key);
  ASSERT_EQ(b.val, val);
  ASSERT_EQ(b.len, n);
  ASSERT(b.f && b.f->id == 2);
  same_message(d, &m, &b);
  /* asked from scratch at every cut: the same answer */
  for (size_t cut = 0; cut <= val + 3; cut++) {
    pbwire_big f;
    memset(&f, 0, sizeof f);
    pbwire_big_status st = pbwire_find_big(d, m.p, cut, m.len, 65536, 8192, &f);
    ASSERT_EQ(st, cut < val ? PBWIRE_BIG_NEED : PBWIRE_BIG_FOUND);
  }
  /* fields after it: kept; the same field again after it: that one wins */
  put_len(&m, 15, "unknown", 7);
  ASSERT_EQ(walk(d, &m, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  same_message(d, &m, &b);
  put_len(&m, 1, "/other", 6);
  ASSERT_EQ(walk(d, &m, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  same_message(d, &m, &b);
  put_len(&m, 2, "xy", 2);
  ASSERT_EQ(walk(d, &m, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  same_message(d, &m, &b);
  Pb__FileChunk *s = (Pb__FileChunk *)split_unpack(d, &m, &b);
  ASSERT(s && s->content.len == 2 && memcmp(s->content.data, "xy", 2) == 0);
  ASSERT_STR_EQ(s->filepath, "/other");
  pb__file_chunk__free_unpacked(s, NULL);
  /* a 2-byte key of field 0 (protobuf-c keeps it as an unknown field)
   * before the field set again: still seen, still the last one */
  buf z = {0};
  put_len(&z, 1, "B", 1);
  put_len(&z, 2, content, n);
  put(&z, "\x80\x00\x00", 3);
  put_len(&z, 2, "xy", 2);
  ASSERT_EQ(walk(d, &z, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  same_message(d, &z, &b);
  s = (Pb__FileChunk *)split_unpack(d, &z, &b);
  ASSERT(s && s->content.len == 2);
  pb__file_chunk__free_unpacked(s, NULL);
  /* and before the big field: walked past like any unknown field */
  buf z2 = {0};
  put(&z2, "\x80\x00\x00", 3);
  put_len(&z2, 2, content, n);
  ASSERT_EQ(walk(d, &z2, 1, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  ASSERT_EQ(b.key, 3);
  same_message(d, &z2, &b);
  free(z.p);
  free(z2.p);
  free(m.p);
  free(content);
}

TEST(refused) {
  const ProtobufCMessageDescriptor *d = &pb__file_chunk__descriptor;
  size_t n = 70000;
  uint8_t *content = pattern(n);
  pbwire_big b;
  size_t at;
  /* too small: NONE once the message is all here */
  buf m = {0};
  put_len(&m, 2, content, n);
  ASSERT_EQ(walk(d, &m, 1000, n + 1, 8192, &b, &at), PBWIRE_BIG_NONE);
  ASSERT_EQ(at, m.len);
  /* the key past `within` */
  buf far = {0};
  char *path = malloc(9000);
  memset(path, 'p', 9000);
  put_len(&far, 1, path, 9000);
  put_len(&far, 2, content, n);
  ASSERT_EQ(walk(d, &far, 100, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  ASSERT(at < far.len); /* said as soon as the walk reached it */
  /* the same field before it: the later (big) one would win, but the
   * first is not undone by attaching — assembled whole instead */
  buf dup = {0};
  put_len(&dup, 2, "ab", 2);
  put_len(&dup, 2, content, n);
  ASSERT_EQ(walk(d, &dup, 1, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  /* a field that reaches past the message */
  buf over = {0};
  put_len(&over, 2, content, n);
  ASSERT_EQ(pbwire_find_big(d, over.p, 10, over.len - 1, 65536, 8192, &(pbwire_big){0}), PBWIRE_BIG_NONE);
  /* invalid wire bytes: a group, an 11-byte varint, field number 0 */
  static const uint8_t group[] = {0x0b, 0x0c}, overlong[] = {0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
                       zero[] = {0x02, 0x00};
  ASSERT_EQ(pbwire_find_big(d, group, 2, 100000, 65536, 8192, &(pbwire_big){0}), PBWIRE_BIG_NONE);
  ASSERT_EQ(pbwire_find_big(d, overlong, 12, 100000, 65536, 8192, &(pbwire_big){0}), PBWIRE_BIG_NONE);
  ASSERT_EQ(pbwire_find_big(d, overlong, 5, 100000, 65536, 8192, &(pbwire_big){0}), PBWIRE_BIG_NEED);
  ASSERT_EQ(pbwire_find_big(d, zero, 2, 100000, 65536, 8192, &(pbwire_big){0}), PBWIRE_BIG_NONE);
  /* a key or a length of more than 5 bytes: protobuf-c refuses them, so
   * the message is left whole for it to refuse */
  buf k6 = {0}, l6 = {0};
  put(&k6, "\x92\x80\x80\x80\x80\x00", 6); /* field 2, length-delimited, in 6 bytes */
  put_varint(&k6, n);
  put(&k6, content, n);
  put(&l6, "\x12\x80\x80\x84\x80\x80\x00", 7); /* 65536 in 6 bytes */
  put(&l6, content, 65536);
  ASSERT_EQ(walk(d, &k6, 1, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  ASSERT_EQ(walk(d, &l6, 1, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  ASSERT(protobuf_c_message_unpack(d, NULL, k6.len, k6.p) == NULL);
  ASSERT(protobuf_c_message_unpack(d, NULL, l6.len, l6.p) == NULL);
  /* 5 bytes is still protobuf-c's: found */
  buf l5 = {0};
  put(&l5, "\x12\x80\x80\x84\x80\x00", 6);
  put(&l5, content, 65536);
  ASSERT_EQ(walk(d, &l5, 1, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
  same_message(d, &l5, &b);
  free(k6.p);
  free(l6.p);
  free(l5.p);
  /* a string field, however long, is not a bytes field */
  buf str = {0};
  put_len(&str, 1, content, n);
  ASSERT_EQ(walk(d, &str, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  /* bytes inside a oneof (ProcessInput.stdin) are not split */
  buf one = {0};
  put_len(&one, 1, content, n);
  ASSERT_EQ(walk(&pb__process_input__descriptor, &one, 4096, 65536, 8192, &b, &at), PBWIRE_BIG_NONE);
  free(m.p);
  free(far.p);
  free(dup.p);
  free(over.p);
  free(str.p);
  free(one.p);
  free(path);
  free(content);
}

TEST(start_process_stdin) {
  /* StartProcessRequest.stdin (field 9) after other fields of every wire type */
  const ProtobufCMessageDescriptor *d = &pb__start_process_request__descriptor;
  Pb__StartProcessRequest r = PB__START_PROCESS_REQUEST__INIT;
  char *argv[] = {"cat", "-n"};
  r.cmd = "cat";
  r.n_args = 2;
  r.args = argv;
  r.background = 1;
  size_t n = 300000;
  r.stdin.data = pattern(n);
  r.stdin.len = n;
  buf m = {0};
  m.len = protobuf_c_message_get_packed_size(&r.base);
  m.p = malloc(m.len);
  protobuf_c_message_pack(&r.base, m.p);
  pbwire_big b;
  size_t at;
  for (size_t step = 1; step < 40; step += 13) {
    ASSERT_EQ(walk(d, &m, step, 65536, 8192, &b, &at), PBWIRE_BIG_FOUND);
    ASSERT_EQ(b.len, n);
    ASSERT_EQ(b.f->id, 9);
    ASSERT(at >= b.val && at < b.val + step);
    same_message(d, &m, &b);
  }
  free(m.p);
  free(r.stdin.data);
}

TEST(nul_in_strings) {
  buf m = {0};
  put_len(&m, 1, "a\0b", 3);
  ASSERT_EQ(pbwire_has_nul_string(&pb__file_chunk__descriptor, m.p, m.len), 1);
  buf ok = {0};
  put_len(&ok, 2, "a\0b", 3); /* bytes may hold NUL */
  ASSERT_EQ(pbwire_has_nul_string(&pb__file_chunk__descriptor, ok.p, ok.len), 0);
  free(m.p);
  free(ok.p);
}

int main(void) {
  RUN(file_chunk_found_at_every_cut);
  RUN(refused);
  RUN(start_process_stdin);
  RUN(nul_in_strings);
  return test_summary();
}
