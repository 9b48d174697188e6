/* memsink.h — a sink (server/sink.h) over memory, and a router double, for
 * driving the protocol cores (http1.c, h2.c) without a socket: the unit
 * tests and the fuzz drivers.
 *
 *   memsink m; memsink_init(&m, &serve);  serve.http1_init(&m.s);
 *   memsink_feed(&m, bytes, n);  memsink_run(&m);   → m.out, m.out_len
 *
 * What the core writes is appended to m.out at once and counted in
 * m.s.outq until memsink_flush() says it left (or m.auto_flush does so in
 * memsink_run).  Input is held while the core paused reading and handed
 * over in pieces of at most m.read_chunk bytes (with m.use_into, into the
 * core's own memory when it offers some, as conn.c does).  The timer is only
 * recorded (m.timer_ms); memsink_fire_timer() makes it expire.  Bulk
 * exchanges (hx_bulk) are counted in m.bulk_on / m.bulk_off.
 * memsink_run() is the loop: deferred work, flushes, held input, until
 * nothing is left to do.
 *
 * The router double (tr_dispatch) answers by path:
 *   /echo    200 with the request body, at its end (Content-Length)
 *   /stream  200 chunked at once: "start", then the body, at its end
 *   /big?N   N bytes of 'b' at the body's end (Content-Length)
 *   /hold    nothing: the test answers (tr_last, hx_simple)
 *   /wait    like /hold, and hx_waiting at the body's end (SendInput)
 *   /pause   like /echo, with the body paused at once (tr_unpause)
 *   /into    like /echo, and offers its body buffer to read into
 *            (hx_handler.body_into: TR_INTO bytes; into_bytes counts what
 *            came to on_body at that address)
 *   else     404 "nope"
 * Every exchange is recorded in tr_x[] (at most TR_MAX a test).
 */
#ifndef CONCH_MEMSINK_H
#define CONCH_MEMSINK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bufref.h"
#include "server/hx.h"
#include "server/sink.h"

typedef struct memsink {
  hsink s;
  uint8_t *out;
  size_t out_len, out_cap;
  size_t out_max;   /* keep at most this many bytes of out (0: all) */
  void **owned;     /* released at the next flush */
  size_t nowned, capowned;
  void **later;
  size_t nlater, caplater;
  uint8_t *in;      /* input not yet handed to the core */
  size_t in_len, in_cap;
  size_t read_chunk; /* 0: whatever there is */
  int use_into;      /* read where the core offers (hproto.read_into), as conn.c */
  int read_paused;
  int auto_flush;   /* memsink_run lets the output leave */
  uint64_t timer_ms; /* 0: not armed */
  void (*defer_fn)(hsink *s);
  int closed;
  unsigned writes, reads;
  unsigned bulk_on, bulk_off;
} memsink;

static inline void memsink_release(void **v, size_t *n) {
  for (size_t i = 0; i < *n; i++) bufref_owner_free(v[i]);
  *n = 0;
}

static inline int memsink_push(void ***v, size_t *n, size_t *cap, void *p) {
  if (*n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    void **q = realloc(*v, nc * sizeof *q);
    if (!q) return -1;
    *v = q;
    *cap = nc;
  }
  (*v)[(*n)++] = p;
  return 0;
}

static inline void memsink_append(memsink *m, const void *d, size_t n) {
  if (m->out_max && m->out_len + n > m->out_max) { /* keep the head only */
    n = m->out_len < m->out_max ? m->out_max - m->out_len : 0;
  }
  if (!n) return;
  if (m->out_len + n > m->out_cap) {
    size_t cap = m->out_cap ? m->out_cap : 4096;
    while (cap < m->out_len + n) cap *= 2;
    uint8_t *q = realloc(m->out, cap);
    if (!q) abort();
    m->out = q;
    m->out_cap = cap;
  }
  memcpy(m->out + m->out_len, d, n);
  m->out_len += n;
}

static inline int memsink_write(hsink *s, const void *pre, size_t prelen, const uv_buf_t *bufs,
                         unsigned n, void **owned, unsigned nowned) {
  memsink *m = (memsink *)s;
  if (s->closing || prelen > 64) {
    for (unsigned i = 0; i < nowned; i++) bufref_owner_free(owned[i]);
    return -1;
  }
  memsink_append(m, pre, prelen);
  s->outq += prelen;
  for (unsigned i = 0; i < n; i++) {
    memsink_append(m, bufs[i].base, bufs[i].len);
    s->outq += bufs[i].len;
  }
  for (unsigned i = 0; i < nowned; i++)
    if (memsink_push(&m->owned, &m->nowned, &m->capowned, owned[i])) abort();
  m->writes++;
  return 0;
}

static inline void memsink_free_later(hsink *s, void *p) {
  memsink *m = (memsink *)s;
  if (s->outq == 0) bufref_owner_free(p);
  else if (memsink_push(&m->later, &m->nlater, &m->caplater, p)) abort();
}

static inline void memsink_read_pause(hsink *s, int paused) {
  if (!s->closing) ((memsink *)s)->read_paused = paused;
}
static inline void memsink_timer(hsink *s, uint64_t ms) {
  if (!s->closing) ((memsink *)s)->timer_ms = ms;
}
static inline void memsink_defer(hsink *s, void (*fn)(hsink *s)) {
  if (!s->closing) ((memsink *)s)->defer_fn = fn;
}
static inline void memsink_close(hsink *s) {
  memsink *m = (memsink *)s;
  if (s->closing) return;
  s->closing = 1;
  m->closed = 1;
  if (s->proto && s->proto->on_close) s->proto->on_close(s);
  s->proto = NULL;
  m->defer_fn = NULL;
  m->timer_ms = 0;
}
static inline void memsink_trim(hsink *s) { (void)s; }
static inline void memsink_bulk(hsink *s, int on) {
  if (on) ((memsink *)s)->bulk_on++;
  else ((memsink *)s)->bulk_off++;
}

static const hsink_ops memsink_ops = {memsink_write, memsink_free_later, memsink_read_pause,
                                      memsink_timer, memsink_defer,      memsink_close,
                                      memsink_trim,  memsink_bulk};

static inline void memsink_init(memsink *m, const hserve *serve) {
  memset(m, 0, sizeof *m);
  m->s.ops = &memsink_ops;
  m->s.serve = serve;
  m->s.id = 1;
  snprintf(m->s.peer, sizeof m->s.peer, "memsink");
}

/* Everything written so far left: owners released, on_written. */
static inline void memsink_flush(memsink *m) {
  if (!m->s.outq && !m->nowned) return;
  m->s.outq = 0;
  memsink_release(m->owned, &m->nowned);
  memsink_release(m->later, &m->nlater);
  if (!m->s.closing && m->s.proto && m->s.proto->on_written) m->s.proto->on_written(&m->s);
}

static inline void memsink_feed(memsink *m, const void *d, size_t n) {
  if (!n) return;
  if (m->in_len + n > m->in_cap) {
    size_t cap = m->in_cap ? m->in_cap : 4096;
    while (cap < m->in_len + n) cap *= 2;
    uint8_t *q = realloc(m->in, cap);
    if (!q) abort();
    m->in = q;
    m->in_cap = cap;
  }
  memcpy(m->in + m->in_len, d, n);
  m->in_len += n;
}
static inline void memsink_feeds(memsink *m, const char *s) { memsink_feed(m, s, strlen(s)); }

/* Hand held input over while reading is on: 1 if any was. */
static inline int memsink_pump(memsink *m) {
  int did = 0;
  while (m->in_len && !m->read_paused && !m->s.closing && m->s.proto) {
    size_t n = m->read_chunk && m->read_chunk < m->in_len ? m->read_chunk : m->in_len;
    size_t into = 0;
    uint8_t *p = m->use_into && m->s.proto->read_into ? m->s.proto->read_into(&m->s, &into) : NULL;
    uint8_t *chunk = NULL; /* ours: the core may not keep pointers into it */
    if (p && into)
      n = into < n ? into : n;
    else if (!(p = chunk = malloc(n)))
      abort();
    memcpy(p, m->in, n);
    memmove(m->in, m->in + n, m->in_len - n);
    m->in_len -= n;
    m->reads++;
    m->s.proto->on_read(&m->s, p, n);
    if (chunk) memset(chunk, 0xdd, n);
    free(chunk);
    did = 1;
  }
  return did;
}

/* The loop, until nothing is left to do (bounded: a core that keeps
 * deferring forever is a bug the caller sees as a nonzero return). */
static inline int memsink_run(memsink *m) {
  for (int i = 0; i < 100000; i++) {
    if (m->s.closing) return 0;
    if (m->defer_fn) {
      void (*fn)(hsink *) = m->defer_fn;
      m->defer_fn = NULL;
      fn(&m->s);
      continue;
    }
    if (m->auto_flush && (m->s.outq || m->nowned)) {
      memsink_flush(m);
      continue;
    }
    if (memsink_pump(m)) continue;
    return 0;
  }
  return -1;
}

static inline void memsink_fire_timer(memsink *m) {
  if (m->s.closing || !m->timer_ms) return;
  m->timer_ms = 0;
  if (m->s.proto && m->s.proto->on_timeout) m->s.proto->on_timeout(&m->s);
}

/* Close (if the core did not), release everything. */
static inline void memsink_free(memsink *m) {
  memsink_close(&m->s);
  memsink_release(m->owned, &m->nowned);
  memsink_release(m->later, &m->nlater);
  free(m->owned);
  free(m->later);
  free(m->out);
  free(m->in);
}

/* The output as a string (NUL added past out_len). */
static inline const char *memsink_str(memsink *m) {
  memsink_append(m, "", 1);
  m->out_len--;
  return (const char *)m->out;
}

/* Times needle occurs in the output. */
static inline int memsink_count(memsink *m, const char *needle) {
  int k = 0;
  size_t nl = strlen(needle);
  for (size_t i = 0; nl && i + nl <= m->out_len; i++)
    if (memcmp(m->out + i, needle, nl) == 0) k++;
  return k;
}

/* ---------------------------------------------------------------- router double */

#define TR_MAX 512
#define TR_BODY_MAX (1u << 20)
#define TR_INTO 64u /* /into's buffer */

typedef struct trx {
  hx *x;
  char method[16], path[128];
  uint8_t *body;
  size_t body_len;
  int body_ended, aborted, drained, done;
  size_t big;
  uint8_t into[TR_INTO];
  size_t into_len, into_bytes;
} trx;

static trx tr_x[TR_MAX];
static int tr_n;

static inline void tr_reset(void) {
  for (int i = 0; i < tr_n; i++) free(tr_x[i].body);
  memset(tr_x, 0, sizeof tr_x);
  tr_n = 0;
}

static inline trx *tr_of(hx *x) { return x->hdata; }

static inline void tr_on_body(hx *x, const uint8_t *d, size_t n) {
  trx *t = tr_of(x);
  if (t->body_len + n > TR_BODY_MAX) n = TR_BODY_MAX - t->body_len;
  if (!n) return;
  uint8_t *b = realloc(t->body, t->body_len + n);
  if (!b) abort();
  memcpy(b + t->body_len, d, n);
  t->body = b;
  t->body_len += n;
  if (!strcmp(t->path, "/stream")) hx_write_copy(x, d, n);
}

static inline void tr_on_body_end(hx *x) {
  trx *t = tr_of(x);
  t->body_ended = 1;
  if (!strcmp(t->path, "/hold")) return;
  if (!strcmp(t->path, "/wait")) {
    hx_waiting(x);
    return;
  }
  t->done = 1;
  if (!strcmp(t->path, "/stream")) {
    hx_end(x, NULL, 0);
  } else if (!strcmp(t->path, "/big")) {
    uint8_t *b = malloc(t->big ? t->big : 1);
    if (!b) abort();
    memset(b, 'b', t->big);
    hx_respond(x, 200, NULL, 0, (int64_t)t->big);
    hx_write(x, b, t->big);
    hx_end(x, NULL, 0);
  } else {
    hx_header h = {"content-type", "application/octet-stream", 0};
    hx_respond(x, 200, &h, 1, (int64_t)t->body_len);
    if (t->body_len) hx_write_copy(x, t->body, t->body_len);
    hx_end(x, NULL, 0);
  }
}

static inline void tr_on_abort(hx *x) { tr_of(x)->aborted = 1; }
static inline void tr_on_drain(hx *x) { tr_of(x)->drained++; }

static const hx_handler tr_handler = {tr_on_body, tr_on_body_end, tr_on_abort, tr_on_drain};

static inline uint8_t *tr_body_into(hx *x, size_t *len) {
  trx *t = tr_of(x);
  *len = TR_INTO - t->into_len;
  return *len ? t->into + t->into_len : NULL;
}
/* The first TR_INTO body bytes are kept in t->into (fuzz drivers send
 * more: the rest is only recorded by tr_on_body). */
static inline void tr_into_body(hx *x, const uint8_t *d, size_t n) {
  trx *t = tr_of(x);
  size_t room = TR_INTO - t->into_len, k = n < room ? n : room;
  if (k && d == t->into + t->into_len) t->into_bytes += k;
  else if (k) memcpy(t->into + t->into_len, d, k);
  t->into_len += k;
  tr_on_body(x, d, n);
}
static const hx_handler tr_into_handler = {tr_into_body, tr_on_body_end, tr_on_abort, tr_on_drain,
                                           tr_body_into};

static inline void tr_dispatch(hx *x) {
  if (tr_n >= TR_MAX) { /* fuzz drivers: answer without recording */
    hx_simple(x, 503, "text/plain", "full", NULL, 0);
    return;
  }
  trx *t = &tr_x[tr_n++];
  t->x = x;
  snprintf(t->method, sizeof t->method, "%s", x->method ? x->method : "");
  snprintf(t->path, sizeof t->path, "%s", x->path ? x->path : "");
  if (!strcmp(t->path, "/big") && x->query) t->big = strtoul(x->query, NULL, 10) % (8u << 20);
  if (!strcmp(t->path, "/echo") || !strcmp(t->path, "/stream") || !strcmp(t->path, "/big") ||
      !strcmp(t->path, "/hold") || !strcmp(t->path, "/wait") || !strcmp(t->path, "/pause")) {
    hx_set_handler(x, &tr_handler, t);
    if (!strcmp(t->path, "/stream")) {
      hx_respond(x, 200, NULL, 0, -1);
      hx_write_copy(x, "start", 5);
    }
    if (!strcmp(t->path, "/pause")) hx_pause_body(x, 1);
    return;
  }
  if (!strcmp(t->path, "/into")) {
    hx_set_handler(x, &tr_into_handler, t);
    return;
  }
  t->done = 1;
  hx_simple(x, 404, "text/plain", "nope", NULL, 0);
}

static inline void tr_unpause(trx *t) { hx_pause_body(t->x, 0); }

#endif
