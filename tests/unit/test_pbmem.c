/* test_pbmem — decoding into a caller's buffer (proto/pbmem.h,
 * json_parse_in, pbjson_decode_mem, pbwire_unpack_mem). */
#include "tests/unit/test.h"
#include "proto/agent.pb-c.h"
#include "proto/json.h"
#include "proto/pbjson.h"
#include "proto/pbmem.h"
#include "proto/pbwire.h"

#include <stdlib.h>

static int in_buf(const pbmem *m, const void *p) {
  return (const uint8_t *)p >= m->buf && (const uint8_t *)p < m->buf + m->cap;
}

TEST(buffer_then_malloc_within_budget) {
  uint8_t buf[100];
  pbmem m;
  pbmem_init(&m, buf + 1, sizeof buf - 1, 1000); /* unaligned on purpose */
  ASSERT_EQ((uintptr_t)m.buf % 16, 0);
  void *a = m.a.alloc(m.a.allocator_data, 40);
  void *b = m.a.alloc(m.a.allocator_data, 40); /* 48 + 48 > the 96 or so left: malloc'd */
  ASSERT_EQ(in_buf(&m, a), 1);
  ASSERT_EQ(in_buf(&m, b), 0);
  ASSERT_EQ(m.left, 1000 - 64);
  void *c = m.a.alloc(m.a.allocator_data, 2000); /* over the budget */
  ASSERT_EQ(c == NULL, 1);
  ASSERT_EQ(m.over, 1);
  m.a.free(m.a.allocator_data, a); /* nothing to do */
  m.a.free(m.a.allocator_data, b); /* free() (ASan checks) */
  /* zero bytes: a real, freeable pointer even when the buffer is full */
  uint8_t full[32];
  pbmem z;
  pbmem_init(&z, full, sizeof full, 1000);
  void *f1 = z.a.alloc(z.a.allocator_data, 16), *f2 = z.a.alloc(z.a.allocator_data, 0);
  void *f3 = z.a.alloc(z.a.allocator_data, 0);
  ASSERT(f1 != NULL && f2 != NULL && f3 != NULL && f2 != f3);
  z.a.free(z.a.allocator_data, f3);
  z.a.free(z.a.allocator_data, f2);
  z.a.free(z.a.allocator_data, f1);
  pbmem n;
  pbmem_init(&n, NULL, 0, 100);
  void *d = n.a.alloc(n.a.allocator_data, 8);
  ASSERT_EQ(d != NULL, 1);
  free(d); /* without a buffer: plain malloc memory */
}

TEST(json_tree_in_a_buffer) {
  char buf[4096], err[160];
  int over = 0;
  const char *small = "{\"path\":\"/tmp\",\"depth\":2}";
  json_value *v = json_parse_in(small, strlen(small), JSON_MEM_BUDGET(strlen(small)), buf, sizeof buf,
                                err, sizeof err, &over);
  ASSERT_EQ(v != NULL, 1);
  ASSERT_EQ((char *)v >= buf && (char *)v < buf + sizeof buf, 1);
  ASSERT_STR_EQ(json_get(v, "depth")->str, "2");
  json_free(v); /* frees nothing of buf (ASan would say) */
  /* a document larger than the buffer: the rest in malloc'd blocks */
  size_t n = 5000;
  char *big = malloc(n * 16 + 3), *q = big;
  *q++ = '[';
  for (size_t i = 0; i < n; i++) q += sprintf(q, "%s\"arg-%zu\"", i ? "," : "", i);
  *q++ = ']';
  v = json_parse_in(big, (size_t)(q - big), JSON_MEM_BUDGET((size_t)(q - big)), buf, sizeof buf, err,
                    sizeof err, &over);
  if (!v) TEST_FAIL_("%s", err);
  if (!v) TEST_FAIL_("%s", err);
  ASSERT_EQ(v->n, n);
  json_free(v);
  /* the budget still holds with a buffer */
  v = json_parse_in(big, (size_t)(q - big), 8192, buf, sizeof buf, err, sizeof err, &over);
  ASSERT_EQ(v == NULL, 1);
  ASSERT_EQ(over, 1);
  /* too small a buffer is not used */
  v = json_parse_in(small, strlen(small), 1 << 20, buf, 16, err, sizeof err, &over);
  ASSERT_EQ(v != NULL, 1);
  ASSERT_EQ((char *)v >= buf && (char *)v < buf + sizeof buf, 0);
  json_free(v);
  free(big);
}

TEST(messages_in_a_buffer) {
  uint8_t buf[1024];
  char err[256];
  pbmem m;
  pbmem_init(&m, buf, sizeof buf, 1 << 20);
  const char *js = "{\"path\":\"/tmp/x\",\"depth\":3}";
  Pb__ListFilesRequest *r = (Pb__ListFilesRequest *)pbjson_decode_mem(
      &pb__list_files_request__descriptor, js, strlen(js), &m.a, NULL, err, sizeof err);
  ASSERT_EQ(r != NULL, 1);
  ASSERT_STR_EQ(r->path, "/tmp/x");
  ASSERT_EQ(r->depth, 3);
  ASSERT_EQ(in_buf(&m, r) && in_buf(&m, r->path), 1);
  protobuf_c_message_free_unpacked(&r->base, &m.a);
  /* a failure halfway frees what was built (ASan: no leak, no bad free) */
  pbmem_init(&m, buf, 64, 1 << 20);
  const char *bad = "{\"cmd\":\"sh\",\"args\":[\"-c\",\"echo a long argument that spills\",7]}";
  ProtobufCMessage *x = pbjson_decode_mem(&pb__start_process_request__descriptor, bad, strlen(bad), &m.a,
                                          NULL, err, sizeof err);
  ASSERT_EQ(x == NULL, 1);
  /* binary: the same request packed, unpacked into the buffer */
  Pb__ListFilesRequest q = PB__LIST_FILES_REQUEST__INIT;
  q.path = "/srv/data";
  q.depth = 1;
  uint8_t w[64];
  size_t wl = protobuf_c_message_pack(&q.base, w);
  pbmem_init(&m, buf, sizeof buf, JSON_MEM_BUDGET(wl));
  Pb__ListFilesRequest *u =
      (Pb__ListFilesRequest *)pbwire_unpack_mem(&pb__list_files_request__descriptor, w, wl, &m);
  ASSERT_EQ(u != NULL, 1);
  ASSERT_STR_EQ(u->path, "/srv/data");
  ASSERT_EQ(in_buf(&m, u), 1);
  protobuf_c_message_free_unpacked(&u->base, &m.a);
}

int main(void) {
  RUN(buffer_then_malloc_within_budget);
  RUN(json_tree_in_a_buffer);
  RUN(messages_in_a_buffer);
  return test_summary();
}
