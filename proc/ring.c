/* ring — retained output of one channel; see ring.h. */
#include "proc/ring.h"

#include <stdlib.h>
#include <string.h>

static void blk_release(bufref *ref) {
  struct proc_ring_blk *b = (struct proc_ring_blk *)ref;
  if (--b->refs == 0) free(b);
}

bufref *proc_ring_blk_ref(struct proc_ring_blk *b) {
  b->refs++;
  return &b->ref;
}

static size_t blk_mem(const struct proc_ring_blk *b) { return sizeof *b + b->cap; }

int proc_ring_drop(struct proc_ring *r) {
  struct proc_ring_blk *b = r->head;
  if (!b) return -1;
  r->head = b->next;
  if (!r->head) r->tail = NULL;
  if (r->tail_link == &b->next) r->tail_link = &r->head;
  r->bytes -= b->len;
  r->mem -= blk_mem(b);
  b->next = NULL;
  blk_release(&b->ref); /* the ring's reference: sends still in flight keep it */
  return 0;
}

void proc_ring_clear(struct proc_ring *r) {
  while (proc_ring_drop(r) == 0) {
  }
}

/* The newest block is full for the next event: give its unused end back
 * (events of 20 KiB would otherwise leave 12 KiB of every 32 KiB block
 * empty, and the budget counts what blocks take).  Only while no send
 * points into it: realloc may move it. */
static void blk_close(struct proc_ring *r) {
  struct proc_ring_blk *b = r->tail, *nb;
  if (!b || b->refs != 1 || b->cap - b->len < b->cap / 8) return;
  nb = realloc(b, sizeof *b + b->len);
  if (!nb) return;
  r->mem -= nb->cap - nb->len;
  nb->cap = nb->len;
  if (nb != b) {
    *r->tail_link = nb;
    r->tail = nb;
  }
}

int proc_ring_append(struct proc_ring *r, uint64_t off, const uint8_t *buf, size_t n, size_t max_bytes) {
  struct proc_ring_blk *b = r->tail;
  if (!b || b->cap - b->len < n) {
    blk_close(r);
    size_t cap = r->bytes > PROC_RING_MIN_BLOCK ? r->bytes : PROC_RING_MIN_BLOCK;
    if (cap > PROC_RING_BLOCK) cap = PROC_RING_BLOCK;
    if (cap < n) cap = n;
    b = malloc(sizeof *b + cap);
    if (!b) {
      proc_ring_clear(r);
      return -1;
    }
    b->ref.release = blk_release;
    b->next = NULL;
    b->refs = 1;
    b->off = off;
    b->len = 0;
    b->cap = cap;
    r->tail_link = r->tail ? &r->tail->next : &r->head;
    *r->tail_link = b;
    r->tail = b;
    r->mem += blk_mem(b);
  }
  /* appending never touches bytes a send may point at: [0, len) stays */
  memcpy(b->data + b->len, buf, n);
  b->len += n;
  r->bytes += n;
  while (r->bytes > max_bytes && r->head != r->tail) proc_ring_drop(r);
  return 0;
}

uint64_t proc_ring_first(const struct proc_ring *r, uint64_t end) { return r->head ? r->head->off : end; }
