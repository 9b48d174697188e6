/* h2stream — an HTTP/2 stream: its lifecycle, its request body, admission,
 * its response queue and the hx ops; see h2_int.h and docs/internals/h2.md. */
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/log.h"
#include "proto/text.h"
#include "server/h2.h"
#include "server/h2_int.h"
#include "core/lifecycle.h"

static const hx_ops h2_ops;

/* ---------------------------------------------------------------- lifecycles */

#define B(s) (1u << (s))

/* legal_from[to]: the states `to` may follow. */
static const unsigned h2s_from[H2S_NSTATES] = {
  [H2S_HEADERS] = 0, /* a new stream starts here */
  [H2S_QUEUED] = B(H2S_HEADERS),
  [H2S_QUEUED_IN] = B(H2S_QUEUED),
  [H2S_OPEN] = B(H2S_QUEUED),
  [H2S_IN_ENDED] = B(H2S_OPEN) | B(H2S_QUEUED_IN),
  [H2S_IN_DONE] = B(H2S_IN_ENDED),
  [H2S_REFUSED] = B(H2S_HEADERS) | B(H2S_QUEUED) | B(H2S_QUEUED_IN),
  [H2S_BROKEN] = B(H2S_OPEN) | B(H2S_IN_ENDED) | B(H2S_IN_DONE),
};

static const unsigned h2c_from[H2C_NSTATES] = {
  [H2C_NEW] = 0, /* a new connection starts here */
  [H2C_OPEN] = B(H2C_NEW) | B(H2C_PREFACE),
  [H2C_PREFACE] = B(H2C_OPEN), /* the upgrade's stream 1 came first */
  [H2C_PREFACE_REVOKED] = B(H2C_PREFACE),
  [H2C_REVOKED] = B(H2C_NEW) | B(H2C_OPEN) | B(H2C_PREFACE_REVOKED),
  [H2C_GOAWAY] = B(H2C_REVOKED),
  [H2C_DEAD] = B(H2C_NEW) | B(H2C_OPEN) | B(H2C_PREFACE) | B(H2C_PREFACE_REVOKED) |
               B(H2C_REVOKED) | B(H2C_GOAWAY),
};

/* The admission count: counted once, released once, never again. */
static const unsigned h2k_from[H2K_NSTATES] = {
  [H2K_NONE] = 0,
  [H2K_COUNTED] = B(H2K_NONE),
  [H2K_DONE] = B(H2K_NONE) | B(H2K_COUNTED),
};

static const char *const h2k_names[H2K_NSTATES] = {"NONE", "COUNTED", "DONE"};

static const char *const h2s_names[H2S_NSTATES] = {"HEADERS", "QUEUED",  "QUEUED_IN", "OPEN",
                                                   "IN_ENDED", "IN_DONE", "REFUSED",   "BROKEN"};
static const char *const h2c_names[H2C_NSTATES] = {"NEW",     "OPEN",  "PREFACE", "PREFACE_REVOKED",
                                                   "REVOKED", "GOAWAY", "DEAD"};

int h2s_state_legal(h2s_state from, h2s_state to) {
  return (unsigned)from < H2S_NSTATES && (unsigned)to < H2S_NSTATES && (h2s_from[to] >> from & 1u);
}

int h2c_state_legal(h2c_state from, h2c_state to) {
  return (unsigned)from < H2C_NSTATES && (unsigned)to < H2C_NSTATES && (h2c_from[to] >> from & 1u);
}

const char *h2s_state_name(h2s_state s) { return (unsigned)s < H2S_NSTATES ? h2s_names[s] : "?"; }
const char *h2c_state_name(h2c_state s) { return (unsigned)s < H2C_NSTATES ? h2c_names[s] : "?"; }

int h2s_set_state(h2s *st, h2s_state to) {
  unsigned legal = (unsigned)to < H2S_NSTATES ? h2s_from[to] : 0;
  if (lifecycle_check("h2 stream", legal, (int)st->state, (int)to, h2s_names, H2S_NSTATES) != 0) return -1;
  st->state = to;
  return 0;
}

static void h2s_set_count(h2s *st, h2s_count to) {
  if (lifecycle_check("h2 stream count", h2k_from[to], (int)st->count, (int)to, h2k_names, H2K_NSTATES) == 0)
    st->count = to;
}

int h2c_set_state(h2c *sc, h2c_state to) {
  unsigned legal = (unsigned)to < H2C_NSTATES ? h2c_from[to] : 0;
  if (lifecycle_check("h2 connection", legal, (int)sc->state, (int)to, h2c_names, H2C_NSTATES) != 0) return -1;
  sc->state = to;
  return 0;
}

/* ---------------------------------------------------------------- streams */

static h2buf *h2_buf_new(h2s *st) {
  if (!st->inl_used) {
    st->inl_used = 1;
    return &st->inl;
  }
  return malloc(sizeof(h2buf));
}

static void h2_buf_free(h2s *st, h2buf *b) {
  if (b == &st->inl) st->inl_used = 0;
  else free(b);
}

h2s *h2_stream_new(h2c *sc, int32_t id) {
  h2s *st = calloc(1, sizeof *st);
  if (!st) return NULL;
  st->sess = sc;
  st->id = id;
  st->x.tp = st;
  st->x.ops = &h2_ops;
  st->x.http2 = 1;
  st->x.sink = sc->c;
  st->x.content_length = -1;
  h2check_init(&st->chk);
  list_insert_head(&sc->streams, &st->link);
  sc->nstreams++;
  sc->undispatched++;
  if (sc->state == H2C_NEW) h2c_set_state(sc, H2C_OPEN);
  return st;
}

void h2_stream_close(h2s *st) {
  h2c *sc = st->sess;
  if (st->x.ended) { /* hx_end ran: its unsent bytes leave the count */
    sc->done_held -= st->outq;
  } else if (h2s_dispatched(st) && st->x.h && st->x.h->on_abort) {
    st->x.ended = 1;
    st->x.h->on_abort(&st->x);
  }
  st->x.ended = 1;
  if (sc->hstream == st) {
    sc->hstream = NULL;
    sc->hstream_id = 0;
  }
  if (st->state == H2S_HEADERS) sc->undispatched--;
  if (st->count == H2K_COUNTED) sc->computing--;
  list_remove(&st->alink); /* out of the admission FIFO */
  sc->held -= st->outq + st->reserved;
  conch.held -= st->outq; /* the daemon-wide budget (daemon.h) */
  list_remove(&st->wlink); /* out of the room FIFO */
  list_remove(&st->link);
  sc->nstreams--;
  for (h2buf *b = st->qhead, *n; b; b = n) {
    n = b->next;
    if (b->off)
      sink_free_later(sc->c, b->owner); /* queued writes may point into it */
    else
      bufref_owner_free(b->owner);
    h2_buf_free(st, b);
  }
  free(st->trailers);
  free(st->head);
  free(st->pend);
  hx_free_request(&st->x);
  free(st);
  h2_timer_touch(sc);
}

/* Hand request body bytes to the handler, or hold them while paused. */
void h2_stream_body(h2s *st, const uint8_t *d, size_t n, int count_window) {
  h2c *sc = st->sess;
  if (h2s_dispatched(st) && (st->x.ended || !st->x.h || !st->x.h->on_body)) { /* nobody wants it */
    if (count_window) nghttp2_session_consume(sc->ng, st->id, n);
    return;
  }
  /* held while paused, and while waiting for admission (within the
   * stream's window: nothing held is consumed) */
  if (!h2s_dispatched(st) || st->body_paused || st->pend_len) {
    if (st->pend_len + n > st->pend_cap) {
      size_t cap = st->pend_cap ? st->pend_cap : 16384;
      while (cap < st->pend_len + n) cap *= 2;
      uint8_t *p = realloc(st->pend, cap);
      if (!p) {
        nghttp2_submit_rst_stream(sc->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR);
        return;
      }
      st->pend = p;
      st->pend_cap = cap;
    }
    memcpy(st->pend + st->pend_len, d, n);
    st->pend_len += n;
    if (count_window) st->pend_unconsumed += n;
    return;
  }
  hx_body(&st->x, d, n);
  if (count_window && sc->state != H2C_DEAD) nghttp2_session_consume(sc->ng, st->id, n);
}

/* The request is complete and its answer is being made: counted until it
 * responds (see H2_COMPUTING_MAX). */
static void h2_compute(h2s *st) {
  if (st->count != H2K_NONE || st->x.responded || st->x.ended) return;
  h2s_set_count(st, H2K_COUNTED);
  st->sess->computing++;
}

void h2_stream_body_end(h2s *st) {
  if (st->state == H2S_QUEUED) { /* delivered once admitted */
    h2s_set_state(st, H2S_QUEUED_IN);
    return;
  }
  if (st->state == H2S_OPEN) h2s_set_state(st, H2S_IN_ENDED);
  if (st->state != H2S_IN_ENDED || st->pend_len || st->body_paused) return;
  h2s_set_state(st, H2S_IN_DONE);
  h2_compute(st);
  if (!st->x.ended && st->x.h && st->x.h->on_body_end) st->x.h->on_body_end(&st->x);
}

/* RFC 9113 §8.1.1: a malformed request is a stream error of type
 * PROTOCOL_ERROR; nothing more of it reaches a handler.  One not yet
 * dispatched never is: it leaves the admission FIFO, and the connection's
 * window gets back the body it held. */
void h2_malformed(h2s *st) {
  h2c *sc = st->sess;
  if (h2s_dispatched(st)) {
    h2s_set_state(st, H2S_BROKEN);
  } else {
    if (st->state == H2S_HEADERS) sc->undispatched--;
    list_remove(&st->alink);
    if (st->pend_unconsumed) nghttp2_session_consume(sc->ng, st->id, st->pend_unconsumed);
    free(st->pend);
    st->pend = NULL;
    st->pend_len = st->pend_cap = st->pend_unconsumed = 0;
    h2s_set_state(st, H2S_REFUSED);
  }
  nghttp2_submit_rst_stream(sc->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
}

static void h2_dispatch(h2s *st) {
  h2s_set_state(st, st->state == H2S_QUEUED_IN ? H2S_IN_ENDED : H2S_OPEN);
  sink_turn_request(st->sess->c);
  if (st->chk.content_length >= 0) st->x.content_length = st->chk.content_length;
  st->sess->c->serve->dispatch(&st->x);
}

static int h2_can_admit(const h2c *sc) {
  return sc->computing < H2_COMPUTING_MAX && sc->done_held < H2_DONE_HELD_MAX;
}

/* The stream's answer is no longer being made (it responded or ended). */
static void h2_uncompute(h2s *st) {
  if (st->count != H2K_COUNTED) return;
  h2s_set_count(st, H2K_DONE);
  st->sess->computing--;
  if (!list_empty(&st->sess->admit_fifo)) sink_defer(st->sess->c, h2_deferred);
}

/* A request's header block is complete: dispatch it now, or queue it
 * behind those already waiting (see H2_COMPUTING_MAX). */
void h2_headers_done(h2s *st) {
  h2c *sc = st->sess;
  h2s_set_state(st, H2S_QUEUED);
  sc->undispatched--;
  if (list_empty(&sc->admit_fifo) && h2_can_admit(sc)) {
    h2_dispatch(st);
    return;
  }
  list_insert_tail(&sc->admit_fifo, &st->alink);
}

/* Dispatch waiting requests while there is room; their held body and end
 * are delivered by h2_deferred's loop after this. */
void h2_admit(h2c *sc) {
  h2s *st;
  while ((st = list_first_entry(&sc->admit_fifo, h2s, alink)) && h2_can_admit(sc) && !sc->c->closing) {
    list_remove(&st->alink);
    h2_dispatch(st);
    if (sc->c->closing) return;
    /* counted now: its held body and end are delivered after this loop */
    if (st->state == H2S_IN_ENDED) h2_compute(st);
  }
}

/* DATA frames are sent without copying (NGHTTP2_DATA_FLAG_NO_COPY): this
 * callback only says how much of the head buffer the next frame carries;
 * h2_send_data() writes the frame header and that slice of the buffer.
 * The answer's end is hx_end's (x.ended: the stream is not aborted while
 * nghttp2 still sends for it). */
static ssize_t h2_read_body(nghttp2_session *ng, int32_t id, uint8_t *buf, size_t len,
                            uint32_t *flags, nghttp2_data_source *src, void *ud) {
  (void)ud;
  (void)buf;
  h2s *st = src->ptr;
  h2buf *b = st->qhead;
  size_t take = 0;
  if (b) {
    take = b->len - b->off;
    if (take > len) take = len;
    *flags |= NGHTTP2_DATA_FLAG_NO_COPY;
  }
  if (st->x.ended && (!b || (take == b->len - b->off && !b->next))) {
    *flags |= NGHTTP2_DATA_FLAG_EOF;
    if (st->ntrailers) {
      *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      nghttp2_submit_trailer(ng, id, st->trailers, st->ntrailers);
    }
    return (ssize_t)take;
  }
  if (take == 0) {
    st->deferred = 1;
    return NGHTTP2_ERR_DEFERRED;
  }
  return (ssize_t)take;
}

int h2_send_data(nghttp2_session *ng, nghttp2_frame *f, const uint8_t *framehd,
                 size_t length, nghttp2_data_source *src, void *ud) {
  (void)ng;
  h2c *sc = ud;
  h2s *st = src->ptr;
  h2buf *b = st->qhead;
  if (!b || b->len - b->off < length || f->data.padlen) return NGHTTP2_ERR_CALLBACK_FAILURE;
  /* A small buffer sent whole (a unary answer) is copied behind the other
   * frames, so that many answers leave in one buffer (no queued write can
   * point into it: none of it was referenced before).  Never a bufref's
   * bytes: those only reach the kernel (bufref.h). */
  int copy = length <= H2_COPY_DATA_MAX && b->off == 0 && length == b->len &&
             !bufref_owner_is_ref(b->owner);
  if (copy) {
    if (h2_out_put(sc, framehd, 9) != 0 || h2_out_put(sc, b->data, length) != 0)
      return NGHTTP2_ERR_CALLBACK_FAILURE;
  } else if (h2_out_flush(sc) != 0) {
    return NGHTTP2_ERR_CALLBACK_FAILURE; /* keep the order */
  }
  uv_buf_t slice = uv_buf_init((char *)b->data + b->off, (unsigned)length);
  void *owned = NULL;
  unsigned nowned = 0;
  b->off += length;
  st->outq -= length;
  sc->held -= length;
  conch.held -= length; /* now counted in the conn's outq */
  if (st->x.ended) {
    sc->done_held -= length;
    if (!list_empty(&sc->admit_fifo) && sc->done_held < H2_DONE_HELD_MAX) sink_defer(sc->c, h2_deferred);
  }
  if (b->off == b->len) { /* the last slice: the write frees the buffer */
    st->qhead = b->next;
    if (!st->qhead) st->qtail = NULL;
    owned = b->owner;
    nowned = 1;
    h2_buf_free(st, b);
  }
  if (st->drain_armed && st->outq <= HX_OUTQ_LOW) {
    st->drain_armed = 0;
    st->want_drain = 1;
  }
  if (copy) {
    bufref_owner_free(owned);
    return 0;
  }
  if (sink_write_pre(sc->c, framehd, 9, length ? &slice : NULL, length ? 1 : 0, &owned, nowned) != 0)
    return NGHTTP2_ERR_CALLBACK_FAILURE;
  return 0;
}

/* ---------------------------------------------------------------- room */

/* Room for n more bytes on st: its own queue is empty (what it made went
 * out within the peer's window), the windows are open (once it has sent
 * something), and the
 * connection's output (q, st's own reservation not counted) is empty or
 * stays within H2_ROOM. */
static int h2_room_ok(h2s *st, size_t q, size_t n) {
  h2c *sc = st->sess;
  if (st->outq) return 0;
  /* a closed window would only hold the bytes here; the first chunk goes
   * all the same (it carries the response head) */
  if (st->submitted && (nghttp2_session_get_stream_remote_window_size(sc->ng, st->id) <= 0 ||
                        nghttp2_session_get_remote_window_size(sc->ng) <= 0))
    return 0;
  return q == 0 || q + n <= H2_ROOM;
}

static size_t h2_conn_queued(h2c *sc) { return sc->c->outq + sc->olen + sc->held; }

/* Waiting streams that now have room, in their order: their on_drain runs
 * with the other drain notifications (h2_flush_out).  Each is counted in
 * as if it had taken its room, so as many are woken as fit. */
void h2_room_wake(h2c *sc) {
  size_t q = h2_conn_queued(sc);
  h2s *st, *nx;
  list_each_safe(st, nx, &sc->room_fifo, wlink) {
    if (h2_room_ok(st, q, st->room_n)) {
      list_remove(&st->wlink);
      st->want_drain = 1;
      q += st->room_n;
    }
  }
}

/* ---------------------------------------------------------------- hx ops */

/* A header list in one block (free() it): the nv array, then the strings. */
static nghttp2_nv *h2_copy_nv(const char *const *kv, size_t n) {
  size_t lens[2 * (HX_MAX_HEADERS + 2)], bytes = (n ? n : 1) * sizeof(nghttp2_nv);
  for (size_t i = 0; i < 2 * n; i++) {
    lens[i] = strlen(kv[i]);
    bytes += lens[i] + 1;
  }
  nghttp2_nv *nv = malloc(bytes);
  if (!nv) return NULL;
  uint8_t *p = (uint8_t *)(nv + (n ? n : 1));
  for (size_t i = 0; i < n; i++) {
    nv[i].name = p;
    /* lower case (RFC 9113 §8.2.1): nghttp2 lower-cases names only when it
     * copies them, and with NO_COPY_NAME it does not */
    for (size_t c = 0; c <= lens[2 * i]; c++) {
      uint8_t ch = (uint8_t)kv[2 * i][c];
      p[c] = ch >= 'A' && ch <= 'Z' ? (uint8_t)(ch + 32) : ch;
    }
    p += lens[2 * i] + 1;
    nv[i].value = p;
    memcpy(p, kv[2 * i + 1], lens[2 * i + 1] + 1);
    p += lens[2 * i + 1] + 1;
    nv[i].namelen = lens[2 * i];
    nv[i].valuelen = lens[2 * i + 1];
    /* the copy lives until the stream is freed, after its frames went out:
     * nghttp2 need not copy the strings again */
    nv[i].flags = NGHTTP2_NV_FLAG_NO_COPY_NAME | NGHTTP2_NV_FLAG_NO_COPY_VALUE;
  }
  return nv;
}

/* Decimal text of a non-negative number into b (>= 21 bytes). */
static const char *h2_udec(char *b, size_t cap, uint64_t v) {
  b[cap - 1] = 0;
  return text_u64_dec(b + cap - 1, v);
}

/* The response head is held until the first body bytes or the end, so that
 * a response with no body goes out as one HEADERS frame with END_STREAM
 * (gRPC's "trailers-only" form). */
static int h2_submit(h2s *st, int with_body) {
  h2c *sc = st->sess;
  if (st->submitted) return 0;
  st->submitted = 1;
  nghttp2_data_provider prd = {.source.ptr = st, .read_callback = h2_read_body};
  /* st->head stays until the stream is freed: its strings are not copied */
  int r = nghttp2_submit_response(sc->ng, st->id, st->head, st->nhead, with_body ? &prd : NULL);
  sink_defer(sc->c, h2_deferred);
  return r == 0 ? 0 : -1;
}

static int h2_respond(hx *x, int status, const hx_header *h, size_t n, int64_t clen) {
  h2s *st = x->tp;
  h2_uncompute(st);
  const char *kv[2 * (HX_MAX_HEADERS + 2)];
  char sbuf[24], lbuf[24];
  size_t k = 0;
  kv[2 * k] = ":status";
  kv[2 * k++ + 1] = h2_udec(sbuf, sizeof sbuf, (uint64_t)(status < 0 ? 0 : status));
  for (size_t i = 0; i < n && k < HX_MAX_HEADERS; i++) {
    kv[2 * k] = h[i].name;
    kv[2 * k++ + 1] = h[i].value;
  }
  if (clen >= 0 && status != 204 && status != 304) { /* RFC 9110: no length field there */
    kv[2 * k] = "content-length";
    kv[2 * k++ + 1] = h2_udec(lbuf, sizeof lbuf, (uint64_t)clen);
  }
  st->head = h2_copy_nv(kv, k);
  if (!st->head) return -1;
  st->nhead = k;
  return 0;
}

/* More to send on st: wake its data provider and flush from the loop. */
static void h2_resume(h2s *st) {
  if (st->deferred) {
    st->deferred = 0;
    nghttp2_session_resume_data(st->sess->ng, st->id);
  }
  sink_defer(st->sess->c, h2_deferred);
}

static int h2_write(hx *x, const hx_part *parts, unsigned n) {
  h2s *st = x->tp;
  h2c *sc = st->sess;
  h2buf *b[2] = {NULL, NULL};
  for (unsigned i = 0; i < n; i++) /* every node first: all or nothing */
    if (!(b[i] = h2_buf_new(st))) {
      for (unsigned k = 0; k < i; k++) h2_buf_free(st, b[k]);
      for (unsigned k = 0; k < n; k++) bufref_owner_free(parts[k].owner);
      return -1;
    }
  for (unsigned i = 0; i < n; i++) {
    *b[i] = (h2buf){NULL, parts[i].owner, parts[i].data, parts[i].len, 0};
    if (st->qtail) st->qtail->next = b[i];
    else st->qhead = b[i];
    st->qtail = b[i];
    st->outq += parts[i].len;
    sc->held += parts[i].len;
    conch.held += parts[i].len;
  }
  sc->held -= st->reserved; /* the room it asked for is now these bytes */
  st->reserved = 0;
  if (st->outq > HX_OUTQ_LOW) st->drain_armed = 1;
  if (!st->submitted) return h2_submit(st, 1);
  h2_resume(st);
  return 0;
}

static int h2_end(hx *x, const hx_header *tr, size_t n) {
  h2s *st = x->tp; /* x->ended is set (hx_end) */
  st->sess->done_held += st->outq; /* from now on only the peer's window holds it */
  h2_uncompute(st);
  h2_timer_touch(st->sess);
  /* the rest of the request body, if any, is not wanted any more */
  if (st->state == H2S_OPEN || st->state == H2S_BROKEN) st->body_paused = 0;
  if (!st->submitted && !st->qhead && n == 0) return h2_submit(st, 0);
  if (n) {
    const char *kv[2 * HX_MAX_HEADERS];
    if (n > HX_MAX_HEADERS) n = HX_MAX_HEADERS;
    for (size_t i = 0; i < n; i++) {
      kv[2 * i] = tr[i].name;
      kv[2 * i + 1] = tr[i].value;
    }
    free(st->trailers);
    st->trailers = h2_copy_nv(kv, n);
    st->ntrailers = st->trailers ? n : 0;
  }
  if (!st->submitted) return h2_submit(st, 1);
  h2_resume(st);
  return 0;
}

static void h2_pause_body(hx *x, int paused) {
  h2s *st = x->tp;
  st->body_paused = paused;
  if (!paused) sink_defer(st->sess->c, h2_deferred);
}

static size_t h2_outq(const hx *x) {
  const h2s *st = x->tp;
  return st->outq;
}

static int h2_room(hx *x, size_t n) {
  h2s *st = x->tp;
  h2c *sc = st->sess;
  sc->held -= st->reserved;
  st->reserved = 0;
  if (!list_linked(&st->wlink) && h2_room_ok(st, h2_conn_queued(sc), n)) {
    st->reserved = n;
    sc->held += n;
    return 1;
  }
  st->room_n = n;
  if (!list_linked(&st->wlink)) list_insert_tail(&sc->room_fifo, &st->wlink); /* to the end of the FIFO */
  sink_defer(sc->c, h2_deferred); /* a WINDOW_UPDATE may already be in */
  return 0;
}

static void h2_waiting(hx *x) {
  h2s *st = x->tp;
  h2_uncompute(st);
  if (st->count == H2K_NONE) h2s_set_count(st, H2K_DONE); /* never counted again */
}

static int h2_reset(hx *x) {
  h2s *st = x->tp;
  h2c *sc = st->sess;
  if (sc->state == H2C_DEAD || nghttp2_submit_rst_stream(sc->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_INTERNAL_ERROR) != 0)
    return -1;
  sink_defer(sc->c, h2_deferred); /* sent with what else is queued; the close calls on_abort */
  return 0;
}

static const hx_ops h2_ops = {h2_respond, h2_write,   h2_end,  h2_pause_body, h2_outq,
                              h2_room,    h2_waiting, NULL,    h2_reset};
