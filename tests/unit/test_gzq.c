/* test_gzq — a call's gzip output queue (server/gzq.c) on a real loop and
 * thread pool, with fake ops that record what they are handed: what is
 * compressed (from GZQ_MIN on) and what is not, order behind a pool
 * deflate (from GZQ_POOL_MIN on), by-reference tails queued and never
 * compressed, the unary answer at once and from the pool, `settled`, the
 * byte count, and no block left behind (ASan). */
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "server/gzq.h"
#include "proto/envelope.h"
#include "proto/gzip.h"
#include "tests/unit/test.h"

static uv_loop_t *loop;

#define MAXW 16
static struct {
  int n;
  struct {
    uint8_t flags;
    size_t len;      /* payload length (frame header's) */
    uint8_t *plain;  /* the payload, gunzipped when compressed (malloc'd) */
    size_t plain_len;
    int tail;        /* it had a tail */
  } w[MAXW];
  int settled, unary;
  uint8_t *uz;
  size_t uzl;
} R;

static void rec_reset(void) {
  for (int i = 0; i < R.n; i++) free(R.w[i].plain);
  free(R.uz);
  memset(&R, 0, sizeof R);
}

static void op_write(gzq *q, void *owner, uint8_t *frame, size_t len, const uint8_t *tail, size_t tail_len,
                     bufref *tail_ref) {
  (void)q;
  if (R.n >= MAXW) abort();
  size_t plen = (size_t)frame[1] << 24 | (size_t)frame[2] << 16 | (size_t)frame[3] << 8 | frame[4];
  R.w[R.n].flags = frame[0];
  R.w[R.n].len = plen;
  R.w[R.n].tail = tail_ref != NULL;
  size_t have = len - ENV_HEADER;
  uint8_t *all = malloc(have + tail_len + 1);
  memcpy(all, frame + ENV_HEADER, have);
  if (tail_len) memcpy(all + have, tail, tail_len);
  if (frame[0] & ENV_COMPRESSED) {
    uint8_t *out;
    size_t ol;
    if (gz_inflate(all, have, 64u << 20, &out, &ol) != GZ_OK) abort();
    free(all);
    R.w[R.n].plain = out;
    R.w[R.n].plain_len = ol;
  } else {
    R.w[R.n].plain = all;
    R.w[R.n].plain_len = have + tail_len;
  }
  R.n++;
  bufref_owner_free(owner);
  if (tail_ref) tail_ref->release(tail_ref);
}
static void op_unary(gzq *q, uint8_t *z, size_t zl) {
  (void)q;
  R.unary++;
  R.uz = z;
  R.uzl = zl;
}
static void op_settled(gzq *q) {
  (void)q;
  R.settled++;
}
static const gzq_ops ops = {op_write, op_unary, op_settled};

/* A message of n bytes (compressible text) in a malloc'd buffer with the
 * envelope's 5 bytes in front: *msg points past them. */
static uint8_t *message(size_t n, uint8_t **msg, char seed) {
  uint8_t *b = malloc(ENV_HEADER + n + 1);
  for (size_t i = 0; i < n; i++) b[ENV_HEADER + i] = (uint8_t)("abcdefgh"[(i / 7 + (size_t)seed) % 8]);
  *msg = b + ENV_HEADER;
  return b;
}
/* Write i carried message(n, …, seed)'s bytes (the queue freed those). */
static int same(int i, size_t n, char seed) {
  if (R.w[i].plain_len != n) return 0;
  for (size_t k = 0; k < n; k++)
    if (R.w[i].plain[k] != (uint8_t)("abcdefgh"[(k / 7 + (size_t)seed) % 8])) return 0;
  return 1;
}

typedef struct {
  bufref ref;
  int released;
} count_ref;
static void count_release(bufref *r) { ((count_ref *)r)->released++; }

TEST(nothing_to_do_goes_as_usual) {
  gzq q;
  gzq_init(&q, loop, &ops);
  rec_reset();
  uint8_t *m, *b = message(5000, &m, 0);
  int rc = 7;
  ASSERT_EQ(gzq_send(&q, 0, b, m, 5000, &rc), 0); /* not accepted */
  ASSERT_EQ(gzq_send(&q, 1, b, m, GZQ_MIN - 1, &rc), 0); /* too small */
  count_ref cr = {{count_release}, 0};
  ASSERT_EQ(gzq_send(&q, 1, bufref_owner(&cr.ref), m, 5000, &rc), 0); /* its bytes only go to the kernel */
  ASSERT_EQ(gzq_send_pair(&q, b, ENV_HEADER, 10, m, 10, &cr.ref, &rc), 0); /* nothing to keep order with */
  ASSERT_EQ(rc, 7);
  ASSERT_EQ(R.n, 0);
  ASSERT_EQ(cr.released, 0);
  ASSERT(!gzq_busy(&q));
  free(b);
}

TEST(small_compressed_at_once) {
  gzq q;
  gzq_init(&q, loop, &ops);
  rec_reset();
  uint8_t *m;
  message(5000, &m, 1);
  int rc = 7;
  ASSERT_EQ(gzq_send(&q, 1, m - ENV_HEADER, m, 5000, &rc), 1);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(R.n, 1); /* written before the send returned */
  ASSERT_EQ(R.w[0].flags, ENV_COMPRESSED);
  ASSERT(R.w[0].len < 5000 / 4);
  ASSERT(same(0, 5000, 1));
  ASSERT_EQ(R.settled, 1);
  ASSERT(!gzq_busy(&q));
  ASSERT_EQ(q.bytes, 0);
}

TEST(order_behind_a_pool_deflate) {
  gzq q;
  gzq_init(&q, loop, &ops);
  rec_reset();
  static const size_t plan[] = {150000, 10, 5000, 60000, 3};
  uint8_t *msgs[5];
  int rc;
  size_t queued = 0;
  for (int i = 0; i < 5; i++) {
    message(plan[i], &msgs[i], (char)i);
    ASSERT_EQ(gzq_send(&q, 1, msgs[i] - ENV_HEADER, msgs[i], plan[i], &rc), 1);
    ASSERT_EQ(rc, 0);
    queued += plan[i];
  }
  ASSERT_EQ(R.n, 0); /* all behind the first, which is in the pool */
  ASSERT(gzq_busy(&q));
  ASSERT_EQ(q.bytes, queued);
  ASSERT_EQ(R.settled, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_EQ(R.n, 5);
  for (int i = 0; i < 5; i++) {
    ASSERT_EQ(R.w[i].flags, plan[i] >= GZQ_MIN ? ENV_COMPRESSED : 0);
    ASSERT(same(i, plan[i], (char)i));
  }
  ASSERT_EQ(R.settled, 1); /* once, when the last left */
  ASSERT(!gzq_busy(&q));
  ASSERT_EQ(q.bytes, 0);
}

TEST(tail_queued_never_compressed) {
  gzq q;
  gzq_init(&q, loop, &ops);
  rec_reset();
  uint8_t *big, *head;
  message(100000, &big, 2);
  int rc;
  ASSERT_EQ(gzq_send(&q, 1, big - ENV_HEADER, big, 100000, &rc), 1);
  static uint8_t tail[3000];
  memset(tail, 'x', sizeof tail);
  count_ref cr = {{count_release}, 0};
  uint8_t *hb = message(4, &head, 3);
  ASSERT_EQ(gzq_send_pair(&q, hb, ENV_HEADER, 4, tail, sizeof tail, &cr.ref, &rc), 1);
  ASSERT_EQ(rc, 0);
  ASSERT_EQ(q.bytes, 100000 + 4 + sizeof tail);
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_EQ(R.n, 2);
  ASSERT_EQ(R.w[1].flags, 0);
  ASSERT(R.w[1].tail);
  ASSERT_EQ(R.w[1].len, 4 + sizeof tail); /* the header counts head and tail */
  ASSERT_EQ(cr.released, 1);
  ASSERT_EQ(R.settled, 1);
}

TEST(unary_at_once_and_from_the_pool) {
  static const size_t sizes[] = {5000, 200000};
  for (int i = 0; i < 2; i++) {
    gzq q;
    gzq_init(&q, loop, &ops);
    rec_reset();
    uint8_t *m, *b = message(sizes[i], &m, 4);
    gzq_unary(&q, m, sizes[i]);
    if (sizes[i] >= GZQ_POOL_MIN) {
      ASSERT_EQ(R.unary, 0);
      ASSERT(gzq_busy(&q)); /* the answer waits */
      uv_run(loop, UV_RUN_DEFAULT);
      ASSERT_EQ(R.settled, 1);
    } else {
      ASSERT_EQ(R.settled, 0); /* at once: nothing was queued */
    }
    ASSERT_EQ(R.unary, 1);
    ASSERT(!gzq_busy(&q));
    uint8_t *out;
    size_t ol;
    ASSERT_EQ(gz_inflate(R.uz, R.uzl, 64u << 20, &out, &ol), GZ_OK); /* no envelope header in front */
    ASSERT_EQ(ol, sizes[i]);
    ASSERT_MEM_EQ(out, m, ol);
    free(out);
    free(b); /* the caller's answer: never the queue's */
  }
  rec_reset();
}

int main(void) {
  loop = uv_default_loop();
  RUN(nothing_to_do_goes_as_usual);
  RUN(small_compressed_at_once);
  RUN(order_behind_a_pool_deflate);
  RUN(tail_queued_never_compressed);
  RUN(unary_at_once_and_from_the_pool);
  rec_reset();
  uv_loop_close(loop);
  return test_summary();
}
