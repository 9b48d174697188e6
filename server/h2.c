/* h2 — HTTP/2 on one connection; see h2.h. */
#include "server/h2.h"

#include <nghttp2/nghttp2.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "server/h2check.h"
#include "core/list.h"
#include "core/log.h"
#include "proto/text.h"

typedef struct h2buf {
  struct h2buf *next;
  void *owner; /* released once written (bufref.h) */
  const uint8_t *data;
  size_t len, off;
} h2buf;

#define H2_OUT_HINT_MAX 2048 /* the first buffer grows to the last write's size up to this */

typedef struct h2s {
  hx x; /* first: hx.tp points back here */
  struct h2c *sess;
  list_node link; /* in sess->streams, newest first */
  int32_t id;
  size_t hbytes;
  int dispatched, body_ended, body_end_sent, submitted, deferred, out_ended;
  int body_paused, drain_armed, want_drain, upgraded;
  int malformed; /* reset with PROTOCOL_ERROR: nothing more of it is read */
  int hdone;     /* its request header block is complete */
  int computing; /* counted in sc->computing */
  int waiting;   /* hx_waiting: never counted again */
  list_node alink; /* complete, waiting in the admission FIFO (h2_admit) */
  h2check chk;   /* RFC 9113 request rules (nghttp2's own are off) */
  h2buf *qhead, *qtail;
  size_t outq;
  uint8_t *pend; /* request body held while paused */
  size_t pend_len, pend_cap, pend_unconsumed;
  nghttp2_nv *trailers;
  size_t ntrailers;
  nghttp2_nv *head; /* response head not yet submitted */
  size_t nhead;
  h2buf inl; /* the first queued write's node (a unary answer has one) */
  int inl_used;
  size_t reserved;    /* hx_room granted this much, not yet written */
  size_t room_n;      /* waiting for room for this much (in sc's FIFO) */
  list_node wlink;    /* in the room FIFO */
} h2s;

typedef struct h2c {
  hsink *c;
  nghttp2_session *ng;
  list_node streams; /* newest first */
  size_t nstreams;
  int dead;
  /* Upgraded from HTTP/1.1: nothing is sent after the 101 until the
   * client's preface (its SETTINGS) is in.  curl 7.88 fails with "connection
   * buffer size is too small to store data following HTTP Upgrade response
   * header" when frames arrive in the same read as the 101. */
  int await_preface;
  size_t undispatched; /* streams whose header block is still open */
  int seen_stream;     /* a request has begun on this connection */
  int tmode;           /* what the connection timer is armed for (H2T_*) */
  int tactivity;       /* an exchange ended since: restart the idle time */
  /* frames from nghttp2 gathered for one write (malloc'd, freed once the
   * kernel has the bytes) */
  uint8_t *ob;
  size_t olen, ocap;
  size_t ohint; /* the last write's size: the next buffer starts that big */
  /* The stream whose header block is being received (header blocks never
   * interleave): one lookup per block instead of one per header field. */
  int32_t hstream_id;
  h2s *hstream;
  /* body bytes the streams queued and nghttp2 has not taken yet, plus
   * what hx_room reserved: with c->outq, the connection's output */
  size_t held;
  list_node room_fifo; /* streams waiting for room, first come first served */
  /* Admission (h2_admit): requests whose answer is being made (dispatched,
   * request complete, no response yet), and bytes of ended responses held
   * behind the peer's flow-control windows. */
  size_t computing, done_held;
  list_node admit_fifo; /* complete requests waiting to be dispatched */
  int read_paused;    /* reading stopped: too much output for the socket */
  /* the token its requests authenticated with was replaced (h2_on_revoked):
   * 1 new streams refused, GOAWAY once none is left; 2 GOAWAY submitted */
  int revoked;
} h2c;

#define H2_WRITE_CHUNK (256u * 1024)
#define H2_COPY_DATA_MAX 4096 /* DATA payloads up to this are copied, not referenced */
#define H2_CONN_OUTQ_MAX (2u * 1024 * 1024)
/* No frames are read while this much waits for the socket: requests that
 * are answered at once (errors, 401s, /health, refused streams) would
 * otherwise pile up in nghttp2's queue for a client that never reads.
 * Stream data held back by flow control does not count: it cannot go out
 * until we read the peer's WINDOW_UPDATE. */
#define H2_READ_OUTQ_MAX (1u * 1024 * 1024)
/* hx_room: n more bytes when the connection's output is empty or stays
 * within this with them — about one file chunk per connection at a time,
 * whatever the number of streams. */
#define H2_ROOM (1u * 1024 * 1024)
/* Admission: a complete request is dispatched only while fewer than
 * H2_COMPUTING_MAX answers are being made on its connection and less than
 * H2_DONE_HELD_MAX of finished answers wait for the peer's window; others
 * wait, in order.  Without it a client that never opens its window can
 * have 128 unary answers (up to 16 MiB each) made and held at once.  A
 * streaming call stops counting once it has responded; its output has its
 * own bound (hx_room, rpc_outq_bytes).  A unary call whose small answer
 * waits on the outside (hx_waiting: SendInput to a child that does not
 * read) stops counting too: sixteen of them would otherwise hold back
 * every new request on the connection; their number is bounded by the
 * connection's concurrent streams and their bytes by the process's input
 * bounds (proc/input.c). */
#define H2_COMPUTING_MAX 16
#define H2_DONE_HELD_MAX (4u * 1024 * 1024)

static void h2_deferred(hsink *c);
static const hx_ops h2_ops;

enum { H2T_NONE, H2T_HEADER, H2T_IDLE };

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

/* ---------------------------------------------------------------- streams */

static h2s *h2_stream_new(h2c *sc, int32_t id) {
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
  sc->seen_stream = 1;
  return st;
}

/* The connection timer: 10 s (header time) before the first request, while
 * the upgraded client's preface is awaited, and while a header block is
 * open — measured from when that began, not re-armed; else 60 s idle once
 * no exchange is running, restarted whenever one ends (a stream whose
 * response ended but whose client never finished its request does not keep
 * the connection alive); none while an exchange runs.  Worked out once per
 * read or flush (h2_timer_apply), not per stream: a request whose header
 * block arrives whole never arms the header timer. */
static void h2_timer_touch(h2c *sc) { sc->tactivity = 1; }

static void h2_timer_apply(h2c *sc) {
  if (sc->dead || sc->c->closing) return;
  int want;
  if (sc->await_preface || sc->undispatched || !sc->seen_stream) {
    want = H2T_HEADER;
  } else {
    want = H2T_IDLE;
    h2s *st;
    list_each(st, &sc->streams, link)
      if (!st->x.ended && !list_linked(&st->alink)) {
        want = H2T_NONE;
        break;
      }
  }
  int restart = want == H2T_IDLE && sc->tactivity;
  sc->tactivity = 0;
  if (want == sc->tmode && !restart) return;
  sc->tmode = want;
  sink_timer(sc->c, want == H2T_HEADER ? conch.http_header_ms
                    : want == H2T_IDLE ? conch.http_idle_ms
                                       : 0);
}

static void h2_stream_free(h2s *st) {
  h2c *sc = st->sess;
  if (sc->hstream == st) {
    sc->hstream = NULL;
    sc->hstream_id = 0;
  }
  if (!st->hdone) sc->undispatched--;
  if (st->computing) sc->computing--;
  if (st->out_ended) sc->done_held -= st->outq;
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

static void h2_abort_stream(h2s *st) {
  if (st->dispatched && !st->x.ended && st->x.h && st->x.h->on_abort) {
    st->x.ended = 1;
    st->x.h->on_abort(&st->x);
  }
  st->x.ended = 1;
}

/* Hand request body bytes to the handler, or hold them while paused. */
static void h2_stream_body(h2s *st, const uint8_t *d, size_t n, int count_window) {
  h2c *sc = st->sess;
  if (st->dispatched && (st->x.ended || !st->x.h || !st->x.h->on_body)) { /* nobody wants it */
    if (count_window) nghttp2_session_consume(sc->ng, st->id, n);
    return;
  }
  /* held while paused, and while waiting for admission (within the
   * stream's window: nothing held is consumed) */
  if (!st->dispatched || st->body_paused || st->pend_len) {
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
  if (count_window && !sc->dead) nghttp2_session_consume(sc->ng, st->id, n);
}

/* The request is complete and its answer is being made: counted until it
 * responds (see H2_COMPUTING_MAX). */
static void h2_compute(h2s *st) {
  if (st->computing || st->waiting || st->x.responded || st->x.ended) return;
  st->computing = 1;
  st->sess->computing++;
}

static void h2_stream_body_end(h2s *st) {
  st->body_ended = 1;
  if (!st->dispatched || st->pend_len || st->body_paused || st->body_end_sent) return;
  st->body_end_sent = 1;
  h2_compute(st);
  if (!st->x.ended && st->x.h && st->x.h->on_body_end) st->x.h->on_body_end(&st->x);
}

/* RFC 9113 §8.1.1: a malformed request is a stream error of type
 * PROTOCOL_ERROR; nothing more of it reaches a handler. */
static void h2_malformed(h2s *st) {
  st->malformed = 1;
  nghttp2_submit_rst_stream(st->sess->ng, NGHTTP2_FLAG_NONE, st->id, NGHTTP2_PROTOCOL_ERROR);
}

static void h2_dispatch(h2s *st) {
  st->dispatched = 1;
  sink_turn_request(st->sess->c);
  if (st->chk.content_length >= 0) st->x.content_length = st->chk.content_length;
  st->sess->c->serve->dispatch(&st->x);
}

static int h2_can_admit(const h2c *sc) {
  return sc->computing < H2_COMPUTING_MAX && sc->done_held < H2_DONE_HELD_MAX;
}

/* The stream's answer is no longer being made (it responded or ended). */
static void h2_uncompute(h2s *st) {
  if (!st->computing) return;
  st->computing = 0;
  st->sess->computing--;
  if (!list_empty(&st->sess->admit_fifo)) sink_defer(st->sess->c, h2_deferred);
}

/* A request's header block is complete: dispatch it now, or queue it
 * behind those already waiting (see H2_COMPUTING_MAX). */
static void h2_headers_done(h2s *st) {
  h2c *sc = st->sess;
  st->hdone = 1;
  sc->undispatched--;
  if (list_empty(&sc->admit_fifo) && h2_can_admit(sc)) {
    h2_dispatch(st);
    return;
  }
  list_insert_tail(&sc->admit_fifo, &st->alink);
}

/* Dispatch waiting requests while there is room; their held body and end
 * are delivered by h2_deferred's loop after this. */
static void h2_admit(h2c *sc) {
  h2s *st;
  while ((st = list_first_entry(&sc->admit_fifo, h2s, alink)) && h2_can_admit(sc) && !sc->c->closing) {
    list_remove(&st->alink);
    h2_dispatch(st);
    if (sc->c->closing) return;
    /* counted now: its held body and end are delivered after this loop */
    if (st->body_ended) h2_compute(st);
  }
}

/* ---------------------------------------------------------------- nghttp2 callbacks */

static int h2_on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud) {
  h2c *sc = ud;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (sc->revoked) { /* closing (h2_on_revoked): not processed, the client may retry elsewhere */
    nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  if (!sc->c->authed && sc->nstreams >= H2_UNAUTH_STREAMS) {
    sink_unauth_over(sc->c, "too many streams");
    return NGHTTP2_ERR_CALLBACK_FAILURE; /* h2_on_read closes */
  }
  h2s *st = h2_stream_new(sc, f->hd.stream_id);
  if (!st) return NGHTTP2_ERR_CALLBACK_FAILURE;
  nghttp2_session_set_stream_user_data(ng, f->hd.stream_id, st);
  sc->hstream_id = f->hd.stream_id;
  sc->hstream = st;
  return 0;
}

static int h2_on_header(nghttp2_session *ng, const nghttp2_frame *f, nghttp2_rcbuf *nrc,
                        nghttp2_rcbuf *vrc, uint8_t flags, void *ud) {
  (void)flags;
  h2c *sc = ud;
  if (f->hd.type != NGHTTP2_HEADERS) return 0;
  if (sc->hstream_id != f->hd.stream_id) {
    sc->hstream_id = f->hd.stream_id;
    sc->hstream = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  }
  h2s *st = sc->hstream;
  if (!st || st->malformed) return 0;
  nghttp2_vec nv = nghttp2_rcbuf_get_buf(nrc), vv = nghttp2_rcbuf_get_buf(vrc);
  const uint8_t *name = nv.base, *value = vv.base;
  size_t nlen = nv.len, vlen = vv.len;
  if (st->hdone) { /* trailers: checked, otherwise ignored */
    if (h2check_trailer_field(name, nlen, value, vlen) != 0) h2_malformed(st);
    return 0;
  }
  h2check_kind kind;
  if (h2check_classify(name, nlen, value, vlen, &kind) != 0 || h2check_apply(&st->chk, &kind) != 0) {
    h2_malformed(st);
    return 0;
  }
  st->hbytes += nlen + vlen + 32;
  if (st->hbytes > H2_MAX_HEADER_LIST) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (nlen && name[0] == ':') {
    char **dst = NULL;
    if (nlen == 7 && memcmp(name, ":method", 7) == 0) dst = &st->x.method;
    else if (nlen == 5 && memcmp(name, ":path", 5) == 0) dst = &st->x.path;
    if (dst && !*dst) {
      const uint8_t *q = dst == &st->x.path ? memchr(value, '?', vlen) : NULL;
      size_t l = q ? (size_t)(q - value) : vlen;
      *dst = hx_strdup(&st->x, (const char *)value, l);
      if (q) st->x.query = hx_strdup(&st->x, (const char *)q + 1, vlen - l - 1);
      if (!*dst || (q && !st->x.query)) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return 0;
  }
  if (hx_add_header(&st->x, (const char *)name, nlen, (const char *)value, vlen) != 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  return 0;
}

static int h2_on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud) {
  h2c *sc = ud;
  if (sc->await_preface && f->hd.type == NGHTTP2_SETTINGS) { /* the client's preface */
    sc->await_preface = 0;
    h2_timer_touch(sc);
    sink_defer(sc->c, h2_deferred);
  }
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  h2s *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (!st || st->malformed) return 0;
  int end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_HEADERS) {
    /* a header block needs its pseudo-headers; trailers must end the stream */
    if (st->hdone ? !end : h2check_end_headers(&st->chk) != 0) {
      h2_malformed(st);
      return 0;
    }
    if (!st->hdone) h2_headers_done(st);
  }
  if (end && !st->body_ended && st->hdone) {
    if (h2check_end_stream(&st->chk) != 0) h2_malformed(st); /* DATA short of content-length */
    else h2_stream_body_end(st);
  }
  return 0;
}

static int h2_on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d,
                            size_t n, void *ud) {
  (void)flags;
  (void)ud;
  h2s *st = nghttp2_session_get_stream_user_data(ng, id);
  if (st && !st->malformed && h2check_data(&st->chk, n) != 0) h2_malformed(st); /* past content-length */
  if (!st || st->malformed) {
    nghttp2_session_consume(ng, id, n);
    return 0;
  }
  h2_stream_body(st, d, n, 1);
  return 0;
}

static int h2_on_stream_close(nghttp2_session *ng, int32_t id, uint32_t err, void *ud) {
  (void)err;
  h2c *sc = ud;
  h2s *st = nghttp2_session_get_stream_user_data(ng, id);
  if (!st || sc->dead) return 0;
  nghttp2_session_set_stream_user_data(ng, id, NULL);
  h2_abort_stream(st);
  h2_stream_free(st);
  return 0;
}

/* DATA frames are sent without copying (NGHTTP2_DATA_FLAG_NO_COPY): this
 * callback only says how much of the head buffer the next frame carries;
 * h2_send_data() writes the frame header and that slice of the buffer. */
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
  if (st->out_ended && (!b || (take == b->len - b->off && !b->next))) {
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

static int h2_out_flush(h2c *sc) {
  if (!sc->olen) return 0;
  uv_buf_t b = uv_buf_init((char *)sc->ob, (unsigned)sc->olen);
  void *owned = sc->ob;
  sc->ohint = sc->olen;
  sc->ob = NULL;
  sc->olen = sc->ocap = 0;
  return sink_write(sc->c, &b, 1, &owned, 1);
}

static int h2_out_put(h2c *sc, const uint8_t *p, size_t n) {
  if (sc->olen + n > sc->ocap) {
    /* the first block as big as the last write (answers to a burst of
     * calls go out together, and regrowing it cost two reallocs a write),
     * a small one small-bin sized */
    size_t cap = sc->ocap ? sc->ocap * 2 : 496;
    while (!sc->ocap && cap < sc->ohint && cap * 2 <= H2_OUT_HINT_MAX) cap *= 2;
    while (cap < sc->olen + n) cap *= 2;
    uint8_t *q = realloc(sc->ob, cap);
    if (!q) return -1;
    sc->ob = q;
    sc->ocap = cap;
  }
  memcpy(sc->ob + sc->olen, p, n);
  sc->olen += n;
  return 0;
}

static int h2_send_data(nghttp2_session *ng, nghttp2_frame *f, const uint8_t *framehd,
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
  if (st->out_ended) {
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
static void h2_room_wake(h2c *sc) {
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

/* ---------------------------------------------------------------- sending */

/* A revoked connection's last stream is gone: GOAWAY (NO_ERROR), after
 * which nghttp2 wants neither to read nor to write, and h2_flush_out
 * closes once the bytes left.  1 when it was submitted now. */
static int h2_goaway_when_done(h2c *sc) {
  if (sc->revoked != 1 || !list_empty(&sc->streams)) return 0;
  sc->revoked = 2;
  nghttp2_submit_goaway(sc->ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(sc->ng),
                        NGHTTP2_NO_ERROR, NULL, 0);
  return 1;
}

static void h2_flush_out(h2c *sc) {
  hsink *c = sc->c;
  if (sc->dead || c->closing || sc->await_preface) return;
  h2_goaway_when_done(sc);
  while (c->outq + sc->olen < H2_CONN_OUTQ_MAX) {
    const uint8_t *p;
    ssize_t n = nghttp2_session_mem_send(sc->ng, &p);
    if (n < 0) {
      LOG_DEBUG("h2 send error conn=%llu err=%s", (unsigned long long)c->id,
                nghttp2_strerror((int)n));
      sink_close(c);
      return;
    }
    if (n == 0) break;
    if (h2_out_put(sc, p, (size_t)n) != 0) {
      sink_close(c);
      return;
    }
    if (sc->olen >= H2_WRITE_CHUNK && h2_out_flush(sc) != 0) {
      sink_close(c);
      return;
    }
  }
  if (h2_out_flush(sc) != 0) {
    sink_close(c);
    return;
  }
  int pause = c->outq >= H2_READ_OUTQ_MAX;
  if (pause != sc->read_paused) {
    sc->read_paused = pause;
    sink_read_pause(c, pause);
  }
  if (!list_empty(&sc->room_fifo)) h2_room_wake(sc);
  /* drain notifications, outside nghttp2's callbacks */
  h2s *st, *n;
  list_each_safe(st, n, &sc->streams, link) {
    if (st->want_drain) {
      st->want_drain = 0;
      if (!st->x.ended && st->x.h && st->x.h->on_drain) st->x.h->on_drain(&st->x);
      if (c->closing) return;
    }
  }
  if (h2_goaway_when_done(sc)) { /* the last stream closed while sending */
    sink_defer(c, h2_deferred);
    return;
  }
  if (!nghttp2_session_want_read(sc->ng) && !nghttp2_session_want_write(sc->ng) && c->outq == 0)
    sink_close(c);
}

/* Send what there is, then set the connection timer for the new state. */
static void h2_flush(h2c *sc) {
  hsink *c = sc->c; /* outlives sc: freed only once its handles closed */
  h2_flush_out(sc);
  if (!c->closing) h2_timer_apply(sc);
}

/* Deferred work: held bodies of un-paused streams, then sending. */
static void h2_deferred(hsink *c) {
  h2c *sc = c->p;
  if (!sc) return;
  if (!list_empty(&sc->admit_fifo)) h2_admit(sc);
  if (c->closing) return;
  h2s *st, *n;
  list_each_safe(st, n, &sc->streams, link) {
    if (!st->dispatched) continue; /* its header block is open, or it waits for admission */
    if (!st->body_paused && st->pend_len) {
      uint8_t *p = st->pend;
      size_t len = st->pend_len, unc = st->pend_unconsumed;
      st->pend = NULL;
      st->pend_len = st->pend_cap = st->pend_unconsumed = 0;
      if (!st->x.ended && st->x.h && st->x.h->on_body) hx_body(&st->x, p, len);
      free(p);
      if (c->closing) return;
      if (unc) nghttp2_session_consume(sc->ng, st->id, unc);
      if (st->body_paused) continue; /* paused again: later chunks wait */
    }
    if (st->body_ended && !st->body_end_sent && !st->body_paused && !st->pend_len)
      h2_stream_body_end(st);
    if (c->closing) return;
  }
  h2_flush(sc);
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
  h2s *st = x->tp;
  st->out_ended = 1;
  st->sess->done_held += st->outq; /* from now on only the peer's window holds it */
  h2_uncompute(st);
  h2_timer_touch(st->sess);
  /* the rest of the request body, if any, is not wanted any more */
  if (!st->body_ended) st->body_paused = 0;
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
  st->waiting = 1;
  h2_uncompute(st);
}

static const hx_ops h2_ops = {h2_respond, h2_write, h2_end, h2_pause_body, h2_outq, h2_room, h2_waiting};

/* ---------------------------------------------------------------- conn proto */

static void h2_on_read(hsink *c, const uint8_t *d, size_t n) {
  h2c *sc = c->p;
  ssize_t r = nghttp2_session_mem_recv(sc->ng, d, n);
  if (c->closing) return;
  if (r < 0) {
    LOG_DEBUG("h2 recv error conn=%llu err=%s", (unsigned long long)c->id, nghttp2_strerror((int)r));
    h2_flush(sc); /* GOAWAY, if nghttp2 queued one */
    sink_close(c);
    return;
  }
  h2_flush(sc);
}

static void h2_on_written(hsink *c) {
  h2c *sc = c->p;
  if (sc) h2_flush(sc);
}

static void h2_on_timeout(hsink *c) {
  h2c *sc = c->p;
  sc->tmode = H2T_NONE; /* fired: nothing armed now */
  if (sc->await_preface) {
    LOG_DEBUG("h2 timeout conn=%llu: no client preface after the upgrade",
              (unsigned long long)c->id);
    sink_close(c);
    return;
  }
  if (!sc->undispatched) {
    h2s *st;
    list_each(st, &sc->streams, link) {
      if (!st->x.ended && !list_linked(&st->alink)) return; /* an exchange is running */
      if (!nghttp2_session_get_stream_local_close(sc->ng, st->id)) {
        sc->tmode = H2T_IDLE;
        sink_timer(c, conch.http_idle_ms); /* its response is still going out: no write timeout */
        return;
      }
    }
    if (c->outq) {
      sc->tmode = H2T_IDLE;
      sink_timer(c, conch.http_idle_ms);
      return;
    }
  }
  LOG_DEBUG("h2 timeout conn=%llu open_header_blocks=%zu", (unsigned long long)c->id,
            sc->undispatched);
  nghttp2_session_terminate_session(sc->ng, NGHTTP2_NO_ERROR);
  h2_flush(sc);
  sink_close(c);
}

static void h2_on_close(hsink *c) {
  h2c *sc = c->p;
  if (!sc) return;
  sc->dead = 1;
  h2s *st;
  while ((st = list_first_entry(&sc->streams, h2s, link))) {
    h2_abort_stream(st);
    h2_stream_free(st);
  }
  nghttp2_session_del(sc->ng);
  free(sc->ob);
  free(sc);
  c->p = NULL;
}

/* hproto.on_revoked: the token the connection's requests authenticated
 * with was replaced (tokhold.h).  New streams are refused (RST_STREAM
 * REFUSED_STREAM: not processed, a client retries them elsewhere); the
 * streams open finish — their streaming calls have been ended with the
 * error already (connect.c), a unary call completes — and once none is
 * left, GOAWAY (NO_ERROR) and close (h2_goaway_when_done).  GOAWAY comes
 * last rather than first: a client may take frames after a GOAWAY as an
 * error (python-h2 4 does), and nothing needs it earlier. */
static void h2_on_revoked(hsink *c) {
  h2c *sc = c->p;
  if (!sc || sc->dead || c->closing || sc->revoked) return;
  sc->revoked = 1;
  sink_defer(c, h2_deferred); /* from the loop, after the calls' ends */
}

const hproto h2_conn_proto = {h2_on_read, h2_on_written, h2_on_timeout, h2_on_close, NULL, h2_on_revoked};

/* HTTP2-Settings: base64url (proto/text.h's strict decoder); -1 when
 * absent, not base64 or possibly more than cap bytes (for 512: 84 settings,
 * where RFC 9113 defines 7). */
static long h2_b64url_decode(const char *in, uint8_t *out, size_t cap) {
  size_t n = in ? strlen(in) : 0;
  if (!in || TEXT_B64_DECODED_MAX(n) > cap) return -1;
  return text_b64_decode(in, n, out);
}

/* Whole entries, each value within RFC 9113 §6.5.2's range: nghttp2 takes
 * an out-of-range value in HTTP2-Settings as a connection error, after the
 * 101 would have gone out (the client then heard nothing more). */
int h2_settings_valid(const char *v) {
  uint8_t buf[512];
  long n = h2_b64url_decode(v, buf, sizeof buf);
  if (n < 0 || n % 6 != 0) return 0;
  for (long i = 0; i < n; i += 6) {
    unsigned id = (unsigned)buf[i] << 8 | buf[i + 1];
    uint32_t val = (uint32_t)buf[i + 2] << 24 | (uint32_t)buf[i + 3] << 16 |
                   (uint32_t)buf[i + 4] << 8 | buf[i + 5];
    switch (id) {
      case NGHTTP2_SETTINGS_ENABLE_PUSH:
      case NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL:
        if (val > 1) return 0;
        break;
      case NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE:
        if (val > (uint32_t)NGHTTP2_MAX_WINDOW_SIZE) return 0;
        break;
      case NGHTTP2_SETTINGS_MAX_FRAME_SIZE:
        if (val < 16384 || val > 16777215) return 0; /* 2^14 .. 2^24-1 */
        break;
      default: break;
    }
  }
  return 1;
}

int h2_conn_init(hsink *c, hx *up, uint8_t *body, size_t blen) {
  h2c *sc = calloc(1, sizeof *sc);
  c->proto = &h2_conn_proto;
  nghttp2_session_callbacks *cb = NULL;
  nghttp2_option *opt = NULL;
  if (!sc || nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0) goto fail;
  sc->c = c;
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, h2_on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback2(cb, h2_on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_stream_close);
  nghttp2_session_callbacks_set_send_data_callback(cb, h2_send_data);
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_no_http_messaging(opt, 1); /* server/h2check.c does the request rules */
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  if (nghttp2_session_server_new2(&sc->ng, cb, sc, opt) != 0) goto fail;
  nghttp2_session_callbacks_del(cb);
  nghttp2_option_del(opt);
  cb = NULL;
  opt = NULL;
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, H2_MAX_HEADER_LIST},
  };
  nghttp2_submit_settings(sc->ng, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
  nghttp2_session_set_local_window_size(sc->ng, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
  c->p = sc;
  sc->tmode = H2T_HEADER; /* the client's first request within the header time */
  sink_timer(c, conch.http_header_ms);
  if (up) {
    const char *set = hx_get(up, "http2-settings");
    uint8_t sbuf[512];
    long sl = set ? h2_b64url_decode(set, sbuf, sizeof sbuf) : -1;
    /* a session that gave up on the settings wants nothing more: fail
     * here, while the 101 can still be dropped unsent */
    if (sl < 0 ||
        nghttp2_session_upgrade2(sc->ng, sbuf, (size_t)sl, strcmp(up->method, "HEAD") == 0, NULL) != 0 ||
        !nghttp2_session_want_read(sc->ng)) {
      hx_free_request(up);
      free(up);
      free(body);
      return -1; /* sc freed by conn_close → h2_on_close */
    }
    h2s *st = h2_stream_new(sc, 1);
    if (!st) return -1;
    nghttp2_session_set_stream_user_data(sc->ng, 1, st);
    /* copy the request over (its strings may live inside up) */
    int cr = hx_copy_request(&st->x, up);
    st->x.content_length = up->content_length;
    hx_free_request(up);
    free(up);
    if (cr != 0) {
      free(body);
      return -1;
    }
    st->upgraded = 1;
    sc->await_preface = 1;
    h2_headers_done(st); /* the first stream: admitted at once */
    if (blen && !c->closing) h2_stream_body(st, body, blen, 0);
    free(body);
    if (!c->closing) h2_stream_body_end(st);
    if (!c->closing) h2_timer_apply(sc);
  }
  if (!c->closing) sink_defer(c, h2_deferred);
  return 0;
fail:
  if (cb) nghttp2_session_callbacks_del(cb);
  if (opt) nghttp2_option_del(opt);
  free(sc);
  if (up) {
    hx_free_request(up);
    free(up);
  }
  free(body);
  return -1;
}
