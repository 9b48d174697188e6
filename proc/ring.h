/* ring — the retained output of one channel of a background process
 * (api.md §9 "Output that survives a disconnect").
 *
 * A FIFO of append-only blocks of whole events: an event goes into the
 * newest block when it fits there, else into a new block (so no event
 * straddles two, and the oldest retained byte is always the start of an
 * event).  Bytes already in a block never change; a block is freed when
 * the ring drops it and no transport still sends from it — each send of a
 * block's bytes takes a reference (its bufref, released by the transport),
 * so the one retained copy is shared by every replaying subscriber.
 *
 * Block sizes follow the output: max(event, min(PROC_RING_BLOCK, max(512,
 * bytes retained))), so a channel that printed a line holds ~512 bytes, a
 * busy one 32 KiB blocks; a block that is full for the next event gives
 * its unused end back (realloc, while no send points into it).  `mem`
 * (what the blocks take, headers included) is what a budget counts;
 * `bytes` the output retained.
 *
 * Knows nothing of the record (process.c owns the rings and the budget);
 * no allocation but the blocks.  Loop thread only (releases included).
 */
#ifndef CONCH_PROC_RING_H
#define CONCH_PROC_RING_H

#include <stddef.h>
#include <stdint.h>

#include "core/bufref.h"

#define PROC_RING_BLOCK (32u * 1024) /* = PROC_READ_MAX: any event fits in a fresh block */
#define PROC_RING_MIN_BLOCK 512u

struct proc_ring_blk {
  bufref ref; /* first: the owner word of a send's tail */
  struct proc_ring_blk *next;
  unsigned refs; /* the ring's own (while in it) + sends in flight */
  uint64_t off;  /* channel offset of data[0] */
  size_t len, cap;
  uint8_t data[];
};

struct proc_ring {
  struct proc_ring_blk *head, *tail; /* oldest, newest */
  struct proc_ring_blk **tail_link;  /* what points at tail (&head or the previous block's next) */
  size_t bytes; /* output retained */
  size_t mem;   /* bytes the blocks take (headers included) */
};

/* Append an event of n bytes (1..PROC_RING_BLOCK) at channel offset off,
 * which must be where the ring's last event ended (or anything for an
 * empty ring); then drop the oldest blocks while more than max_bytes are
 * retained.  0, or -1 when out of memory (the ring is then emptied, so it
 * never holds a gap). */
int proc_ring_append(struct proc_ring *r, uint64_t off, const uint8_t *buf, size_t n, size_t max_bytes);
/* Drop the oldest block; 0, or -1 when the ring is empty. */
int proc_ring_drop(struct proc_ring *r);
/* Drop every block. */
void proc_ring_clear(struct proc_ring *r);
/* Offset of the oldest retained byte, or `end` (the channel's total) when
 * nothing is retained. */
uint64_t proc_ring_first(const struct proc_ring *r, uint64_t end);
/* A reference on b for one send of its bytes: released (on the loop) by
 * b->ref.release(&b->ref). */
bufref *proc_ring_blk_ref(struct proc_ring_blk *b);

#endif
