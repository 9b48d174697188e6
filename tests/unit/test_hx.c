/* test_hx — the version-independent exchange (server/hx.c) over a fake
 * transport (hx_ops) that records what reaches it. */
#include "tests/unit/test.h"
#include "tests/unit/memsink.h"

#include <stdlib.h>

#include "server/hx.h"

static int n_respond, n_write, n_end, n_pause, last_status, last_paused;
static int64_t last_clen;
static size_t written, last_nparts, last_ntrailers;
static int write_result;

static int f_respond(hx *x, int status, const hx_header *h, size_t n, int64_t clen) {
  (void)x;
  (void)h;
  (void)n;
  n_respond++;
  last_status = status;
  last_clen = clen;
  return 0;
}
static int f_write(hx *x, const hx_part *p, unsigned n) {
  (void)x;
  n_write++;
  last_nparts = n;
  for (unsigned i = 0; i < n; i++) {
    ASSERT(p[i].len > 0); /* hx drops empty pieces */
    written += p[i].len;
    bufref_owner_free(p[i].owner);
  }
  return write_result;
}
static int f_end(hx *x, const hx_header *t, size_t n) {
  (void)x;
  (void)t;
  n_end++;
  last_ntrailers = n;
  return 0;
}
static void f_pause(hx *x, int p) {
  (void)x;
  n_pause++;
  last_paused = p;
}
static size_t f_outq(const hx *x) {
  (void)x;
  return 42;
}
static int f_room(hx *x, size_t n) {
  (void)x;
  return n < 100;
}
static const hx_ops fops = {f_respond, f_write, f_end, f_pause, f_outq, f_room};

static void fresh(hx *x) {
  memset(x, 0, sizeof *x);
  x->ops = &fops;
  x->content_length = -1;
  n_respond = n_write = n_end = n_pause = 0;
  written = 0;
  write_result = 0;
}

static int released;
static void count_release(bufref *r) {
  (void)r;
  released++;
}

TEST(headers_inline_then_heap) {
  hx x;
  fresh(&x);
  for (int i = 0; i < HX_MAX_HEADERS; i++) {
    char n[16], v[64];
    snprintf(n, sizeof n, "X-H%d", i);
    snprintf(v, sizeof v, "value-%d-%s", i, i % 7 ? "" : "a longer value that will not fit inline");
    ASSERT_EQ(hx_add_header(&x, n, strlen(n), v, strlen(v)), 0);
  }
  ASSERT_EQ(x.nhdr, HX_MAX_HEADERS);
  ASSERT(x.hdr != x.hdr_inl); /* grown past the inline ones */
  ASSERT_EQ(hx_add_header(&x, "y", 1, "z", 1), -1); /* at most HX_MAX_HEADERS */
  ASSERT_STR_EQ(hx_get(&x, "x-h5"), "value-5-"); /* names lower-cased (HTTP/1.1) */
  ASSERT_STR_EQ(hx_get(&x, "x-h127"), "value-127-");
  ASSERT(hx_get(&x, "X-H5") == NULL); /* lookups take lower-case names */
  ASSERT(hx_get(&x, "x-h") == NULL);
  hx_free_request(&x);
  ASSERT_EQ(x.nhdr, 0);
}

TEST(http2_names_kept) {
  hx x;
  fresh(&x);
  x.http2 = 1;
  ASSERT_EQ(hx_add_header(&x, "content-type", 12, "a/b", 3), 0);
  ASSERT_STR_EQ(hx_get(&x, "content-type"), "a/b");
  hx_free_request(&x);
}

TEST(strdup_and_copy) {
  hx a, b;
  fresh(&a);
  fresh(&b);
  char big[1000];
  memset(big, 'p', sizeof big - 1);
  big[sizeof big - 1] = 0;
  a.method = hx_strdup(&a, "POST", 4);
  a.path = hx_strdup(&a, big, strlen(big)); /* past the inline space: malloc'd */
  a.query = hx_strdup(&a, "q=1", 3);
  ASSERT(a.path < a.str_inl || a.path >= a.str_inl + sizeof a.str_inl);
  ASSERT(a.method >= a.str_inl && a.method < a.str_inl + sizeof a.str_inl);
  ASSERT_EQ(hx_add_header(&a, "Host", 4, "h", 1), 0);
  ASSERT_EQ(hx_copy_request(&b, &a), 0);
  hx_free_request(&a);
  ASSERT_STR_EQ(b.method, "POST");
  ASSERT_EQ(strlen(b.path), sizeof big - 1);
  ASSERT_STR_EQ(b.query, "q=1");
  ASSERT_STR_EQ(hx_get(&b, "host"), "h");
  hx_free_request(&b);
}

TEST(write_needs_response_and_releases) {
  hx x;
  fresh(&x);
  bufref r = {count_release};
  released = 0;
  static const uint8_t d[] = "abc";
  /* before hx_respond: refused, and the owner released at once */
  ASSERT_EQ(hx_write_owned(&x, bufref_owner(&r), d, 3), -1);
  ASSERT_EQ(released, 1);
  ASSERT_EQ(n_write, 0);
  ASSERT_EQ(hx_respond(&x, 200, NULL, 0, 3), 0);
  ASSERT_EQ(hx_respond(&x, 201, NULL, 0, 3), -1); /* once */
  ASSERT_EQ(hx_write_owned(&x, bufref_owner(&r), d, 3), 0);
  ASSERT_EQ(released, 2);
  ASSERT_EQ(written, 3);
  /* empty pieces never reach the transport, but are released */
  ASSERT_EQ(hx_write_owned(&x, bufref_owner(&r), d, 0), 0);
  ASSERT_EQ(released, 3);
  ASSERT_EQ(n_write, 1);
  ASSERT_EQ(x.out_bytes, 3);
  ASSERT_EQ(hx_end(&x, NULL, 0), 0);
  ASSERT_EQ(hx_end(&x, NULL, 0), -1);
  ASSERT_EQ(hx_write_copy(&x, "zz", 2), -1); /* after the end */
  ASSERT_EQ(n_write, 1);
  hx_free_request(&x);
}

TEST(write_pair_all_or_nothing) {
  hx x;
  fresh(&x);
  bufref r = {count_release};
  released = 0;
  static const uint8_t win[] = "window";
  hx_respond(&x, 200, NULL, 0, -1);
  uint8_t *frame = malloc(16);
  memcpy(frame, "0123456789abcdef", 16);
  ASSERT_EQ(hx_write_pair(&x, frame, 4, 5, win, 6, &r), 0);
  ASSERT_EQ(last_nparts, 2);
  ASSERT_EQ(written, 11);
  ASSERT_EQ(released, 1);
  /* an empty framing piece goes, the data alone */
  frame = malloc(4);
  ASSERT_EQ(hx_write_pair(&x, frame, 0, 0, win, 6, &r), 0);
  ASSERT_EQ(last_nparts, 1);
  ASSERT_EQ(released, 2);
  hx_end(&x, NULL, 0);
}

TEST(end_responds_200) {
  hx x;
  fresh(&x);
  hx_header t = {"grpc-status", "0", 0};
  ASSERT_EQ(hx_end(&x, &t, 1), 0);
  ASSERT_EQ(n_respond, 1);
  ASSERT_EQ(last_status, 200);
  ASSERT_EQ(last_clen, 0);
  ASSERT_EQ(last_ntrailers, 1);
  ASSERT(x.ended);
}

TEST(simple) {
  hx x;
  fresh(&x);
  ASSERT_EQ(hx_simple(&x, 404, "text/plain", "nope", NULL, 0), 0);
  ASSERT_EQ(last_status, 404);
  ASSERT_EQ(last_clen, 4);
  ASSERT_EQ(written, 4);
  ASSERT_EQ(n_end, 1);
  fresh(&x);
  ASSERT_EQ(hx_simple(&x, 204, NULL, NULL, NULL, 0), 0);
  ASSERT_EQ(n_write, 0);
  ASSERT_EQ(n_end, 1);
}

TEST(pause_room_outq_after_end) {
  hx x;
  fresh(&x);
  hx_pause_body(&x, 1);
  ASSERT_EQ(n_pause, 1);
  ASSERT_EQ(last_paused, 1);
  ASSERT_EQ(hx_outq(&x), 42);
  ASSERT_EQ(hx_room(&x, 10), 1);
  ASSERT_EQ(hx_room(&x, 1000), 0);
  hx_end(&x, NULL, 0);
  hx_pause_body(&x, 0); /* ended: not passed on */
  ASSERT_EQ(n_pause, 1);
  ASSERT_EQ(hx_room(&x, 10), 0);
}

static void ignore_body(hx *x, const uint8_t *d, size_t n) {
  (void)x, (void)d, (void)n;
}

static int trims;
static void t_trim(hsink *s) {
  (void)s;
  trims++;
}

/* hx_authed marks the connection; a big answer's end asks for a trim. */
TEST(authed_and_trim) {
  memsink m;
  memsink_init(&m, NULL);
  hsink_ops ops = *m.s.ops;
  ops.trim = t_trim;
  m.s.ops = &ops;
  hx x;
  fresh(&x);
  x.sink = &m.s;
  hx_authed(&x);
  ASSERT(m.s.authed);
  hx_respond(&x, 200, NULL, 0, -1);
  trims = 0;
  uint8_t *b = calloc(1, HX_TRIM_BYTES);
  ASSERT_EQ(hx_write(&x, b, HX_TRIM_BYTES), 0);
  hx_end(&x, NULL, 0);
  ASSERT_EQ(trims, 1);
  fresh(&x);
  x.sink = &m.s;
  hx_simple(&x, 200, NULL, "small", NULL, 0);
  ASSERT_EQ(trims, 1);
  /* a big upload with a small answer asks too (a keep-alive connection
   * kept its heap otherwise), counted by hx_body */
  static uint8_t up[HX_TRIM_BYTES];
  hx_handler h = {.on_body = ignore_body};
  fresh(&x);
  x.sink = &m.s;
  hx_set_handler(&x, &h, NULL);
  for (int i = 0; i < 4; i++) hx_body(&x, up, HX_TRIM_BYTES / 4);
  ASSERT_EQ(x.in_bytes, HX_TRIM_BYTES);
  hx_simple(&x, 200, NULL, "{\"uploadedCount\":1}", NULL, 0);
  ASSERT_EQ(trims, 2);
  fresh(&x);
  x.sink = &m.s;
  hx_set_handler(&x, &h, NULL);
  hx_body(&x, up, HX_TRIM_BYTES - 1);
  hx_simple(&x, 200, NULL, "{}", NULL, 0);
  ASSERT_EQ(trims, 2);
  memsink_free(&m);
}

/* hx_bulk tells the sink once per exchange (memsink counts), and freeing
 * the exchange ends it; an ended exchange, or a sink without the op, asks
 * nothing. */
TEST(bulk_once_until_freed) {
  memsink m;
  memsink_init(&m, NULL);
  hx x;
  fresh(&x);
  x.sink = &m.s;
  hx_bulk(&x);
  hx_bulk(&x);
  ASSERT_EQ(m.bulk_on, 1);
  ASSERT_EQ(m.bulk_off, 0);
  hx_free_request(&x);
  ASSERT_EQ(m.bulk_off, 1);
  hx_free_request(&x);
  ASSERT_EQ(m.bulk_off, 1);
  fresh(&x);
  x.sink = &m.s;
  hx_simple(&x, 200, NULL, "done", NULL, 0);
  hx_bulk(&x);
  hx_free_request(&x);
  ASSERT_EQ(m.bulk_on, 1);
  ASSERT_EQ(m.bulk_off, 1);
  hsink_ops ops = *m.s.ops;
  ops.bulk = NULL;
  m.s.ops = &ops;
  fresh(&x);
  x.sink = &m.s;
  hx_bulk(&x);
  hx_free_request(&x);
  ASSERT_EQ(m.bulk_on + m.bulk_off, 2);
  memsink_free(&m);
}

int main(void) {
  RUN(headers_inline_then_heap);
  RUN(http2_names_kept);
  RUN(strdup_and_copy);
  RUN(write_needs_response_and_releases);
  RUN(write_pair_all_or_nothing);
  RUN(end_responds_200);
  RUN(simple);
  RUN(pause_room_outq_after_end);
  RUN(authed_and_trim);
  RUN(bulk_once_until_freed);
  return test_summary();
}
