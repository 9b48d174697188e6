/* gzq — a call's gzip output queue (api.md §9's response compression, on
 * the loop): the stream messages of one call, in order, each gzipped when
 * it is big enough and the client accepts gzip.
 *
 * A message of GZQ_MIN bytes or more is gzipped; one of GZQ_POOL_MIN or
 * more is deflated in the thread pool (level 6 takes ~0.7 ms per 64 KiB of
 * JSON listing, 15-23 ms for a 10 000-entry ListFiles answer).  From the
 * first pool deflate on, every later send of the call queues behind it, so
 * messages leave in the order they were sent; a call's final answer waits
 * while gzq_busy().  The queue knows neither calls nor transports: it hands
 * each message, framed, to ops->write in order, and says when it has
 * settled (nothing queued, nothing deflating).
 */
#ifndef CONCH_GZQ_H
#define CONCH_GZQ_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/bufref.h"

#define GZQ_MIN 1024u
#define GZQ_POOL_MIN (32u * 1024)

typedef struct gzq gzq;
typedef struct gzq_item gzq_item;

typedef struct gzq_ops {
  /* A message's turn: frame[0, len) (its 5-byte envelope header written,
   * compressed flag included) held by owner, then tail[0, tail_len) held
   * by tail_ref (NULL: none; owner is then a malloc'd pointer).  The
   * callee writes or drops them, releasing owner and tail_ref either way. */
  void (*write)(gzq *q, void *owner, uint8_t *frame, size_t len, const uint8_t *tail,
                size_t tail_len, bufref *tail_ref);
  /* gzq_unary's result: z[0, zl), malloc'd, now the callee's.  Not called
   * when the deflate failed or was cancelled (the answer goes as it is). */
  void (*unary)(gzq *q, uint8_t *z, size_t zl);
  /* Nothing is queued or deflating any more (after a push that emptied the
   * queue, or a pool deflate's return).  May free the queue's owner. */
  void (*settled)(gzq *q);
} gzq_ops;

struct gzq {
  const gzq_ops *ops;
  uv_loop_t *loop;
  gzq_item *head, *tail;
  size_t bytes; /* the queued messages' plain sizes (the call's output queue counts them) */
  int jobs;     /* deflates in the pool: the owner outlives them */
};

void gzq_init(gzq *q, uv_loop_t *loop, const gzq_ops *ops);

/* 1 while something is queued or deflating: the final answer waits. */
int gzq_busy(const gzq *q);

/* A stream message msg[0, len) (5 writable bytes in front, held by owner;
 * gzip: the client accepts it).  Returns 1 when the queue took it — *rc is
 * then the send's result (0, or -1: out of memory, owner released) — and 0
 * when the caller writes it as usual (nothing to compress, nothing to keep
 * order with). */
int gzq_send(gzq *q, int gzip, void *owner, uint8_t *msg, size_t len, int *rc);

/* The same for a message whose tail is held by a bufref (never compressed:
 * its bytes only go to the kernel): head[off, off + len) is malloc'd, 5
 * bytes free in front.  Taken only behind a deflate. */
int gzq_send_pair(gzq *q, uint8_t *head, size_t off, size_t len, const uint8_t *tail, size_t tail_len,
                  bufref *ref, int *rc);

/* Deflate a unary answer msg[0, len) (which must stay valid until
 * ops->unary or settled): at once when small, else in the pool. */
void gzq_unary(gzq *q, const uint8_t *msg, size_t len);

#endif
