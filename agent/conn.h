/* conn — one accepted TCP connection: reading, bounded writing, timers, and
 * the choice of protocol (HTTP/2 preface → h2.c, anything else → http1.c;
 * http1.c may later hand the connection to h2.c on `Upgrade: h2c`).
 */
#ifndef CONCH_CONN_H
#define CONCH_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

typedef struct conn conn;

typedef struct conn_proto {
  void (*on_read)(conn *c, const uint8_t *data, size_t len);
  void (*on_written)(conn *c); /* some queued bytes reached the kernel */
  void (*on_timeout)(conn *c); /* conn_timer() expired */
  void (*on_close)(conn *c);   /* connection gone: abort exchanges, free state */
} conn_proto;

struct conn {
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_timer_t defer; /* conn_defer(): run proto work on the next loop turn */
  uv_prepare_t flush; /* submits the corked batch before the loop blocks */
  struct wreq *batch; /* writes gathered during this loop turn */
  struct wreq *spare; /* a finished write request kept for the next batch */
  char *rbuf;         /* the read buffer (CONN_READ_BUF), reused */
  void **later;       /* buffers to free once every queued write is done */
  size_t nlater, caplater;
  void (*defer_fn)(conn *c);
  const conn_proto *proto;
  void *p; /* protocol state */
  uint8_t sniff[24];
  size_t sniff_len;
  size_t outq; /* bytes handed to uv_write, not yet completed */
  int read_paused;
  int turn_paused;   /* read its share of this loop turn: resumed by the prepare */
  unsigned turn_reqs; /* requests dispatched since the last prepare */
  int closing;
  int write_failed; /* closed from the loop, never inside a caller's stack */
  int handles_open;
  int counted; /* in conch.nconns */
  int authed;  /* a request on it passed the token check (conn_authed) */
  uint64_t id;
  char peer[64];
};

#define CONN_READ_BUF (64u * 1024)
/* Before any request on it is authenticated a connection may leave at most
 * this many bytes unsent (the kernel's socket buffers not counted); past
 * it, it is closed and counted (conch.unauth_closed): a client that sends
 * no token and never reads gets nothing buffered for it. */
#define CONN_UNAUTH_OUTQ (64u * 1024)
/* A connection whose reads of this loop turn dispatched this many requests
 * reads no more until the next turn (libuv would read up to 32 buffers in
 * a row): a peer flooding tiny requests must not keep the loop from the
 * others.  Counted by requests, not bytes: a big upload is one request and
 * reads at full speed. */
#define CONN_TURN_REQS 64
static inline void conn_turn_request(conn *c) { c->turn_reqs++; }
/* malloc_trim this long after a connection closed (agent/conn.c) */
#define CONN_TRIM_MS 1000

/* Write n buffers; each owned[i] (an owner word, see bufref.h; may be NULL)
 * is released once written.
 * Writes made during one loop turn are gathered and go out as one writev
 * just before the loop polls again (fewer syscalls for streams of small
 * events); order is kept. */
int conn_write(conn *c, const uv_buf_t *bufs, unsigned n, void **owned, unsigned nowned);
/* The same, preceded by up to 32 small bytes copied into the request itself
 * (an HTTP/1.1 chunk-size line: no allocation per chunk). */
int conn_write_pre(conn *c, const void *pre, size_t prelen, const uv_buf_t *bufs, unsigned n,
                   void **owned, unsigned nowned);
/* Release owner p (see bufref.h) once every write queued so far has
 * completed (a buffer that queued writes may still point into). */
void conn_free_later(conn *c, void *p);
/* Copying variant for small protocol bytes. */
int conn_write_copy(conn *c, const void *data, size_t len);
void conn_read_pause(conn *c, int paused);
/* (Re)arm the single connection timer; 0 stops it. */
void conn_timer(conn *c, uint64_t ms);
/* Run fn(c) once from the loop, soon (not re-entrantly); a later call with
 * another fn before it ran replaces it — callers use one dispatcher. */
void conn_defer(conn *c, void (*fn)(conn *c));
/* c, not authenticated, went past its budget (what: which one, for the
 * log): counted and logged (first and every 1000th); the caller closes. */
void conn_unauth_over(conn *c, const char *what);
/* malloc_trim in CONN_TRIM_MS (once, however often asked meanwhile):
 * after a connection closed, or an exchange that sent a lot ended. */
void conn_trim_soon(void);
/* A request on c passed the token check: the connection may now queue
 * what its exchanges' own bounds allow (CONN_UNAUTH_OUTQ no longer applies). */
void conn_authed(conn *c);
/* Close (idempotent); proto->on_close runs once, then the conn is freed. */
void conn_close(conn *c);

/* Accept on a listening stream. */
void conn_accept(uv_stream_t *server);

#endif
