/* h2_int — what h2.c (the session: nghttp2's callbacks, frames out, the
 * connection's timer and lifecycle) and h2stream.c (a stream: its
 * lifecycle, request body, admission, response queue and the hx ops)
 * share; nothing else includes it but the unit tests.  Each lifecycle is
 * one state, changed only by its set-state function, which checks the
 * transition (lifecycle.h); docs/internals/h2.md has the tables. */
#ifndef CONCH_H2_INT_H
#define CONCH_H2_INT_H

#include <nghttp2/nghttp2.h>

#include "core/list.h"
#include "server/h2check.h"
#include "server/hx.h"
#include "server/sink.h"

typedef struct h2buf {
  struct h2buf *next;
  void *owner; /* released once written (bufref.h) */
  const uint8_t *data;
  size_t len, off;
} h2buf;

/* A stream's request, from its header block to its end (h2s_set_state). */
typedef enum h2s_state {
  H2S_HEADERS,   /* its request header block is open (counted in undispatched) */
  H2S_QUEUED,    /* complete, waiting in the admission FIFO; its body may come */
  H2S_QUEUED_IN, /* waiting for admission, its END_STREAM in */
  H2S_OPEN,      /* dispatched: the handler has it; its body is coming */
  H2S_IN_ENDED,  /* END_STREAM in; its end waits behind held body or a pause */
  H2S_IN_DONE,   /* the request's end went to the handler */
  H2S_REFUSED,   /* malformed before dispatch: reset, never dispatched */
  H2S_BROKEN,    /* malformed after dispatch: reset, nothing more is read */
  H2S_NSTATES
} h2s_state;

/* A stream in the admission count (sc->computing, H2_COMPUTING_MAX): not
 * yet, counted while its answer is being made, then never again (changed
 * only by h2stream.c's h2s_set_count, checked as the states are). */
typedef enum h2s_count { H2K_NONE, H2K_COUNTED, H2K_DONE, H2K_NSTATES } h2s_count;

typedef struct h2s {
  hx x; /* first: hx.tp points back here */
  struct h2c *sess;
  list_node link; /* in sess->streams, newest first */
  int32_t id;
  h2s_state state; /* changed only by h2s_set_state */
  h2s_count count;  /* its place in the admission count */
  size_t hbytes;
  int submitted;   /* the response head went to nghttp2 */
  int deferred;    /* its data provider said NGHTTP2_ERR_DEFERRED: resume it */
  int body_paused; /* the handler's hx_pause_body */
  int drain_armed; /* its queue went above HX_OUTQ_LOW ... */
  int want_drain;  /* ... and fell back, or room came: on_drain from the loop */
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
  int inl_used; /* inl is in the queue */
  size_t reserved;    /* hx_room granted this much, not yet written */
  size_t room_n;      /* waiting for room for this much (in sc's FIFO) */
  list_node wlink;    /* in the room FIFO */
} h2s;

/* A connection's lifecycle (h2c_set_state). */
typedef enum h2c_state {
  H2C_NEW,             /* no request yet: the header time runs */
  H2C_OPEN,            /* a request has begun: serving */
  /* Upgraded from HTTP/1.1: nothing is sent after the 101 until the
   * client's preface (its SETTINGS) is in.  curl 7.88 fails with
   * "connection buffer size is too small to store data following HTTP
   * Upgrade response header" when frames arrive in the same read as the 101. */
  H2C_PREFACE,
  H2C_PREFACE_REVOKED, /* ... and its token was replaced meanwhile */
  H2C_REVOKED,         /* its token was replaced (h2_on_revoked): new streams refused, GOAWAY once none is left */
  H2C_GOAWAY,          /* that GOAWAY is submitted: it closes once written */
  H2C_DEAD,            /* closing (h2_on_close): its streams are aborted and freed, then it */
  H2C_NSTATES
} h2c_state;

/* What the connection timer is armed for. */
typedef enum h2_tmode { H2T_NONE, H2T_HEADER, H2T_IDLE } h2_tmode;

typedef struct h2c {
  hsink *c;
  nghttp2_session *ng;
  h2c_state state; /* changed only by h2c_set_state */
  list_node streams; /* newest first */
  size_t nstreams;
  size_t undispatched; /* streams whose header block is still open */
  h2_tmode tmode;      /* what the connection timer is armed for */
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
} h2c;

#define H2_OUT_HINT_MAX 2048 /* the first buffer grows to the last write's size up to this */
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

/* ---- the lifecycles (h2stream.c) ---- */
/* The one place each state changes: -1 (and the state left as it was)
 * when `to` may not follow the current state (lifecycle.h). */
int h2s_set_state(h2s *st, h2s_state to);
int h2c_set_state(h2c *sc, h2c_state to);
/* 1 when `to` may follow `from` (the tables alone). */
int h2s_state_legal(h2s_state from, h2s_state to);
int h2c_state_legal(h2c_state from, h2c_state to);
const char *h2s_state_name(h2s_state s);
const char *h2c_state_name(h2c_state s);

/* The handler has the stream (it was dispatched). */
static inline int h2s_dispatched(const h2s *st) {
  return st->state == H2S_OPEN || st->state == H2S_IN_ENDED || st->state == H2S_IN_DONE ||
         st->state == H2S_BROKEN;
}
/* Reset for a malformed request: nothing more of it is read. */
static inline int h2s_reset(const h2s *st) { return st->state >= H2S_REFUSED; }
/* Nothing is sent until the upgraded client's preface is in. */
static inline int h2c_preface(const h2c *sc) {
  return sc->state == H2C_PREFACE || sc->state == H2C_PREFACE_REVOKED;
}
/* New streams are refused: the token was replaced. */
static inline int h2c_refusing(const h2c *sc) {
  return sc->state == H2C_PREFACE_REVOKED || sc->state == H2C_REVOKED || sc->state == H2C_GOAWAY;
}

/* ---- h2stream.c: streams ---- */
h2s *h2_stream_new(h2c *sc, int32_t id);
/* The stream is gone (closed or reset, or its connection closed): a
 * handler that has not ended hears on_abort once; then it is freed. */
void h2_stream_close(h2s *st);
/* Request body bytes: to the handler, or held (paused, not admitted). */
void h2_stream_body(h2s *st, const uint8_t *d, size_t n, int count_window);
/* END_STREAM is in, or (from the loop) what held its end went. */
void h2_stream_body_end(h2s *st);
/* RFC 9113 §8.1.1: reset with PROTOCOL_ERROR. */
void h2_malformed(h2s *st);
/* The request's header block is complete: dispatch or queue it. */
void h2_headers_done(h2s *st);
/* Dispatch queued requests while there is room. */
void h2_admit(h2c *sc);
/* Waiting streams that now have room: on_drain from the loop. */
void h2_room_wake(h2c *sc);
/* nghttp2's send_data callback: a DATA frame's payload, not copied. */
int h2_send_data(nghttp2_session *ng, nghttp2_frame *f, const uint8_t *framehd, size_t length,
                 nghttp2_data_source *src, void *ud);

/* ---- h2.c: the session ---- */
/* Deferred work from the loop: admission, held bodies, then sending. */
void h2_deferred(hsink *c);
/* An exchange ended: the idle time restarts. */
void h2_timer_touch(h2c *sc);
/* The frames gathered for one write: append, and hand them to the sink. */
int h2_out_put(h2c *sc, const uint8_t *p, size_t n);
int h2_out_flush(h2c *sc);

#endif
