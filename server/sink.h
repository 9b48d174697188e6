/* sink — what an HTTP protocol core (http1.c, h2.c) is given to reach its
 * peer: bytes out with an owner word, reading paused and resumed, one
 * timer, work deferred to the loop, close.  The cores never see a socket:
 * conn.c implements a sink over a libuv TCP connection, the unit tests and
 * fuzz drivers implement one over memory.
 *
 * Contract an implementation keeps (the cores rely on it):
 *  - write/write_pre never call back into the protocol from inside the
 *    call; on_written runs later, from the loop, after some bytes left.
 *  - outq counts bytes written and not yet gone (the implementation keeps
 *    it); closing is set by close(), which runs proto->on_close once from
 *    inside the call.  After that every op is a no-op, and the sink stays
 *    valid until the caller's stack has unwound.
 *  - defer runs fn once from the loop, never re-entrantly; a later call
 *    with another fn before it ran replaces it.
 */
#ifndef CONCH_SINK_H
#define CONCH_SINK_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h> /* uv_buf_t only */

typedef struct hsink hsink;
struct hx;

/* A protocol's side: the sink calls these (state in s->p). */
typedef struct hproto {
  void (*on_read)(hsink *s, const uint8_t *data, size_t len);
  void (*on_written)(hsink *s); /* some queued bytes left */
  void (*on_timeout)(hsink *s); /* the timer expired */
  void (*on_close)(hsink *s);   /* gone: abort exchanges, free state */
  /* Optional: where the next read may go instead of the sink's own buffer
   * — memory of the protocol's, *len bytes of room — or NULL.  The bytes
   * read there are then passed to on_read at that address, so a body can
   * land where it is assembled (http1.c, connect.c: no copy).  Asked right
   * before each read; nothing else runs in between. */
  uint8_t *(*read_into)(hsink *s, size_t *len);
  /* Optional: the token its requests authenticated with was replaced
   * (tokhold.h): take no new request, close once the exchanges running now
   * have ended.  Without it the sink closes at once. */
  void (*on_revoked)(hsink *s);
  /* Optional (an upgrade's drain, conn.c): 0 between requests (the
   * connection can be carried to the next program), 1 a request head is
   * still coming (wait for it), 2 an exchange is under way.  Without it: 2. */
  int (*drain_state)(const hsink *s);
} hproto;

typedef struct hsink_ops {
  /* Up to 64 bytes of pre (copied) and then n buffers; each owned[i] (an
   * owner word, bufref.h; may be NULL) is released once written, or at
   * once on failure.  Order is kept.  0 or -1. */
  int (*write)(hsink *s, const void *pre, size_t prelen, const uv_buf_t *bufs, unsigned n,
               void **owned, unsigned nowned);
  /* release owner p once every write queued so far is done */
  void (*free_later)(hsink *s, void *p);
  void (*read_pause)(hsink *s, int paused);
  void (*timer)(hsink *s, uint64_t ms); /* (re)arm the one timer; 0 stops it */
  void (*defer)(hsink *s, void (*fn)(hsink *s));
  void (*close)(hsink *s); /* idempotent */
  void (*trim)(hsink *s);  /* an exchange that sent a lot ended: memory may go back */
  /* Optional: an exchange that sends bulk data starts (1) or is gone (0);
   * counted (hx_bulk). */
  void (*bulk)(hsink *s, int on);
  /* Optional: a request on it passed the token check (hx_authed), with the
   * current token; conn.c records it (tokhold.h) so that a replaced token
   * closes the connection. */
  void (*authed)(hsink *s);
  /* Optional: len bytes of fd (dup'd) from off, sent by the kernel
   * (sendfile, in the thread pool: the file's pages may have to be read)
   * once every write queued before has left; later writes wait behind
   * them.  done(arg) runs from the loop once they all left, never when the
   * sink closed first.  One at a time: 0 started, -1 refused. */
  int (*sendfile)(hsink *s, int fd, uint64_t off, uint64_t len, void (*done)(void *arg), void *arg);
} hsink_ops;

/* What the server serves: the protocols a connection can speak and the
 * router they hand exchanges to.  Given to each sink by whoever accepts
 * it (server.c: the real ones; tests: doubles). */
typedef struct hserve {
  void (*dispatch)(struct hx *x); /* a request's head is complete */
  int (*http1_init)(hsink *s);    /* sets s->proto, s->p; 0 or -1 */
  /* prior knowledge (up NULL) or `Upgrade: h2c` (the request and its body,
   * both taken over); sets s->proto, s->p */
  int (*h2_init)(hsink *s, struct hx *up, uint8_t *body, size_t len);
  int (*h2_settings_valid)(const char *v); /* HTTP2-Settings that would decode */
} hserve;

struct hsink {
  const hsink_ops *ops;
  const hserve *serve;
  const hproto *proto;
  void *p;            /* protocol state */
  size_t outq;        /* bytes written, not yet gone */
  int closing;
  int authed;         /* a request on it passed the token check */
  unsigned turn_reqs; /* requests dispatched this loop turn (fairness, conn.c) */
  uint64_t id;        /* for the log */
  char peer[64];
};

static inline int sink_write_pre(hsink *s, const void *pre, size_t prelen, const uv_buf_t *bufs,
                                 unsigned n, void **owned, unsigned nowned) {
  return s->ops->write(s, pre, prelen, bufs, n, owned, nowned);
}
static inline int sink_write(hsink *s, const uv_buf_t *bufs, unsigned n, void **owned,
                             unsigned nowned) {
  return s->ops->write(s, NULL, 0, bufs, n, owned, nowned);
}
/* A copy of small protocol bytes. */
int sink_write_copy(hsink *s, const void *data, size_t len);
static inline void sink_free_later(hsink *s, void *p) { s->ops->free_later(s, p); }
static inline void sink_read_pause(hsink *s, int paused) { s->ops->read_pause(s, paused); }
static inline void sink_timer(hsink *s, uint64_t ms) { s->ops->timer(s, ms); }
static inline void sink_defer(hsink *s, void (*fn)(hsink *s)) { s->ops->defer(s, fn); }
static inline void sink_close(hsink *s) { s->ops->close(s); }
static inline void sink_turn_request(hsink *s) { s->turn_reqs++; }
/* s, not authenticated, went past a budget (what: which, for the log):
 * counted (conch.unauth_closed) and logged (first and every 1000th); the
 * caller closes. */
void sink_unauth_over(hsink *s, const char *what);

#endif
