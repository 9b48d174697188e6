/* gzq — see gzq.h. */
#include "server/gzq.h"

#include <stdlib.h>

#include "proto/envelope.h"
#include "proto/gzip.h"

#define GZQ_LEVEL 6

struct gzq_item {
  uv_work_t w;
  gzq_item *next;
  gzq *q;
  int done;
  /* the plain message msg[0, len), 5 bytes free in front, held by owner;
   * or (gzq_send_pair, never compressed) pbuf[poff, poff + len) followed
   * by data[0, dlen) held by ref */
  void *owner;
  const uint8_t *msg;
  size_t len;
  uint8_t *pbuf;
  size_t poff;
  const uint8_t *data;
  size_t dlen;
  bufref *ref;
  int unary;  /* gzq_unary's answer, not a queue entry */
  uint8_t *z; /* compressed, ENV_HEADER bytes in front (unary: none) */
  size_t zl;
};

void gzq_init(gzq *q, uv_loop_t *loop, const gzq_ops *ops) {
  *q = (gzq){.ops = ops, .loop = loop};
}

int gzq_busy(const gzq *q) { return q->head != NULL || q->jobs != 0; }

static void item_free(gzq_item *it) {
  if (it->ref) {
    free(it->pbuf);
    it->ref->release(it->ref);
  } else if (it->owner) {
    bufref_owner_free(it->owner);
  }
  free(it->z);
  free(it);
}

/* Hand the item, framed, to ops->write: compressed, with its tail, or as
 * it is (small, or the deflate ran out of memory). */
static void item_write(gzq *q, gzq_item *it) {
  if (it->z) {
    env_put_header(it->z, ENV_COMPRESSED, it->zl);
    q->ops->write(q, it->z, it->z, ENV_HEADER + it->zl, NULL, 0, NULL);
    it->z = NULL;
  } else if (it->ref) {
    uint8_t *frame = it->pbuf + it->poff - ENV_HEADER;
    env_put_header(frame, 0, it->len + it->dlen);
    q->ops->write(q, it->pbuf, frame, it->len + ENV_HEADER, it->data, it->dlen, it->ref);
    it->pbuf = NULL;
    it->ref = NULL;
  } else {
    uint8_t *frame = (uint8_t *)it->msg - ENV_HEADER;
    env_put_header(frame, 0, it->len);
    q->ops->write(q, it->owner, frame, it->len + ENV_HEADER, NULL, 0, NULL);
    it->owner = NULL;
  }
  item_free(it);
}

/* Write what is ready at the head; settled once nothing is left. */
static void flush(gzq *q) {
  while (q->head && q->head->done) {
    gzq_item *it = q->head;
    q->head = it->next;
    if (!q->head) q->tail = NULL;
    q->bytes -= it->len + it->dlen;
    item_write(q, it);
  }
  if (!gzq_busy(q)) q->ops->settled(q);
}

static void job_run(uv_work_t *w) {
  gzq_item *it = (gzq_item *)w;
  it->z = gz_deflate(it->msg, it->len, NULL, 0, it->unary ? 0 : ENV_HEADER, GZQ_LEVEL, &it->zl);
}

static void unary_take(gzq *q, gzq_item *it) {
  if (it->z) q->ops->unary(q, it->z, it->zl); /* out of memory: the answer goes as it is */
  it->z = NULL;
  it->owner = NULL; /* the caller's answer */
  item_free(it);
}

static void job_done(uv_work_t *w, int status) {
  gzq_item *it = (gzq_item *)w;
  gzq *q = it->q;
  q->jobs--;
  it->done = 1;
  if (status != 0) { /* cancelled at shutdown */
    free(it->z);
    it->z = NULL;
  }
  if (it->unary) unary_take(q, it);
  flush(q);
}

/* Deflate it when asked (in the pool when big), then queue it (a stream
 * message) or hand it over (unary). */
static void push(gzq *q, gzq_item *it, int compress) {
  it->q = q;
  it->done = 1;
  if (compress && it->len >= GZQ_POOL_MIN && uv_queue_work(q->loop, &it->w, job_run, job_done) == 0) {
    q->jobs++;
    it->done = 0;
  } else if (compress) {
    job_run(&it->w); /* small: ~0.3 ms at most here */
  }
  if (it->unary) {
    if (it->done) unary_take(q, it);
    return;
  }
  if (q->tail) q->tail->next = it;
  else q->head = it;
  q->tail = it;
  q->bytes += it->len + it->dlen;
  flush(q);
}

int gzq_send(gzq *q, int gzip, void *owner, uint8_t *msg, size_t len, int *rc) {
  int compress = gzip && len >= GZQ_MIN && !bufref_owner_is_ref(owner);
  if (!compress && !q->head) return 0;
  gzq_item *it = calloc(1, sizeof *it);
  if (!it) {
    if (!q->head) return 0; /* as it is: nothing to keep order with */
    bufref_owner_free(owner);
    *rc = -1;
    return 1;
  }
  *it = (gzq_item){.owner = owner, .msg = msg, .len = len};
  push(q, it, compress);
  *rc = 0;
  return 1;
}

int gzq_send_pair(gzq *q, uint8_t *head, size_t off, size_t len, const uint8_t *tail, size_t tail_len,
                  bufref *ref, int *rc) {
  if (!q->head) return 0;
  gzq_item *it = calloc(1, sizeof *it);
  if (!it) {
    free(head);
    ref->release(ref);
    *rc = -1;
    return 1;
  }
  *it = (gzq_item){.pbuf = head, .poff = off, .len = len, .data = tail, .dlen = tail_len, .ref = ref};
  push(q, it, 0);
  *rc = 0;
  return 1;
}

void gzq_unary(gzq *q, const uint8_t *msg, size_t len) {
  gzq_item *it = calloc(1, sizeof *it);
  if (!it) return;
  *it = (gzq_item){.msg = msg, .len = len, .unary = 1};
  push(q, it, 1);
}
