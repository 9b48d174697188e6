/* proc/ring.c: the retained output of one channel (api.md §9). */
#include <stdlib.h>

#include "proc/ring.h"
#include "tests/unit/test.h"

#define CAP (256u * 1024)

/* The ring's bytes, checked block by block: contiguous offsets from
 * the head, each block's bytes those of the stream at that offset (byte
 * at offset o is (uint8_t)(o * 7)), and bytes/mem as counted. */
static void check_ring(const struct proc_ring *r, uint64_t end) {
  uint64_t at = r->head ? r->head->off : end;
  size_t bytes = 0, mem = 0;
  for (const struct proc_ring_blk *b = r->head; b; b = b->next) {
    ASSERT_EQ(b->off, at);
    ASSERT(b->len <= b->cap);
    for (size_t i = 0; i < b->len; i++) ASSERT_EQ(b->data[i], (uint8_t)((b->off + i) * 7));
    at += b->len;
    bytes += b->len;
    mem += sizeof *b + b->cap;
    if (!b->next) ASSERT(b == r->tail);
  }
  ASSERT_EQ(at, end);
  ASSERT_EQ(bytes, r->bytes);
  ASSERT_EQ(mem, r->mem);
}

static void append(struct proc_ring *r, uint64_t *off, size_t n) {
  uint8_t buf[PROC_RING_BLOCK];
  for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)((*off + i) * 7);
  ASSERT_EQ(proc_ring_append(r, *off, buf, n, CAP), 0);
  *off += n;
}

TEST(small_events_share_small_blocks) {
  struct proc_ring r = {0};
  uint64_t off = 0;
  for (int i = 0; i < 10; i++) append(&r, &off, 10);
  check_ring(&r, off);
  ASSERT(r.head == r.tail); /* 100 bytes: one block */
  ASSERT(r.mem <= sizeof *r.head + PROC_RING_MIN_BLOCK);
  ASSERT_EQ(proc_ring_first(&r, off), 0);
  proc_ring_clear(&r);
  ASSERT(r.head == NULL && r.bytes == 0 && r.mem == 0);
  ASSERT_EQ(proc_ring_first(&r, off), off);
}

TEST(cap_keeps_whole_events_at_least_224k) {
  /* sizes that do not divide the block: events never straddle blocks, the
   * oldest retained byte is an event's first, and once past the cap
   * 224..256 KiB stay */
  static const size_t sizes[] = {1, 32768, 17000, 5, 30000, 4096, 12345, 32767, 2};
  struct proc_ring r = {0};
  uint64_t off = 0;
  uint64_t starts[4096];
  size_t nst = 0;
  for (int i = 0; i < 400; i++) {
    starts[nst++] = off;
    append(&r, &off, sizes[i % 9]);
    check_ring(&r, off);
    ASSERT(r.bytes <= CAP);
    if (off >= CAP) ASSERT(r.bytes >= CAP - PROC_RING_BLOCK);
    uint64_t first = proc_ring_first(&r, off);
    int is_start = 0;
    for (size_t k = 0; k < nst; k++) is_start |= starts[k] == first;
    ASSERT(is_start);
  }
  /* memory follows the bytes: full blocks gave their unused ends back */
  ASSERT(r.mem <= r.bytes + PROC_RING_BLOCK + 16 * sizeof(struct proc_ring_blk));
  proc_ring_clear(&r);
}

TEST(a_send_keeps_its_block_alive) {
  struct proc_ring r = {0};
  uint64_t off = 0;
  append(&r, &off, 20000);
  append(&r, &off, 16000); /* a new block of 20000: 4000 free */
  struct proc_ring_blk *b = r.tail;
  ASSERT(b != r.head && b->cap == 20000 && b->len == 16000);
  bufref *ref = proc_ring_blk_ref(b); /* a send in flight points into it */
  const uint8_t *data = b->data;
  append(&r, &off, 16000); /* does not fit: b is neither shrunk nor moved */
  ASSERT(r.head->next == b && b->next == r.tail && b->data == data && b->cap == 20000);
  for (int i = 0; i < 20; i++) append(&r, &off, 30000); /* b ages out of the ring */
  ASSERT(r.head != b && r.head->next != b);
  check_ring(&r, off);
  /* still readable (ASan would report a use after free) */
  for (size_t i = 0; i < 16000; i++) ASSERT_EQ(data[i], (uint8_t)((20000 + i) * 7));
  ref->release(ref);
  /* without a send, a block full for the next event gives its end back */
  struct proc_ring q = {0};
  uint64_t o2 = 0;
  append(&q, &o2, 20000);
  append(&q, &o2, 16000);
  append(&q, &o2, 16000);
  ASSERT(q.head->next->cap == 16000);
  check_ring(&q, o2);
  proc_ring_clear(&q);
  proc_ring_clear(&r);
}

TEST(drop_and_reuse) {
  struct proc_ring r = {0};
  uint64_t off = 0;
  for (int i = 0; i < 20; i++) append(&r, &off, 9000);
  size_t before = r.mem;
  ASSERT_EQ(proc_ring_drop(&r), 0);
  ASSERT(r.mem < before);
  check_ring(&r, off);
  while (proc_ring_drop(&r) == 0) {
  }
  ASSERT(r.head == NULL && r.tail == NULL && r.mem == 0 && r.bytes == 0);
  ASSERT_EQ(proc_ring_drop(&r), -1);
  /* empty, appended again at a later offset (a cleared ring) */
  append(&r, &off, 100);
  append(&r, &off, 32768);
  check_ring(&r, off);
  proc_ring_clear(&r);
}

int main(void) {
  RUN(small_events_share_small_blocks);
  RUN(cap_keeps_whole_events_at_least_224k);
  RUN(a_send_keeps_its_block_alive);
  RUN(drop_and_reuse);
  return test_summary();
}
