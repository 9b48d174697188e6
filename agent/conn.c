/* conn — TCP connections; see conn.h. */
#include "agent/conn.h"

#include <malloc.h>
#include <stdlib.h>
#include <string.h>

#include "agent/bufref.h"
#include "agent/daemon.h"
#include "agent/h2.h"
#include "agent/http1.h"
#include "agent/log.h"

static const char h2_preface[24] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#define CONN_BATCH_BUFS 64
#define CONN_BATCH_PRE 1024

typedef struct wreq {
  uv_write_t req;
  conn *c;
  size_t bytes;
  unsigned nbuf, nowned;
  size_t prelen;
  uv_buf_t bufs[CONN_BATCH_BUFS];
  void *owned[CONN_BATCH_BUFS];
  char pre[CONN_BATCH_PRE]; /* small prefixes (chunk-size lines) */
} wreq;

static void conn_batch_free(conn *c);

static void conn_free_later_run(conn *c) {
  for (size_t i = 0; i < c->nlater; i++) bufref_owner_free(c->later[i]);
  c->nlater = 0;
}

void conn_free_later(conn *c, void *p) {
  if (c->outq == 0) {
    bufref_owner_free(p);
    return;
  }
  if (c->nlater == c->caplater) {
    size_t cap = c->caplater ? c->caplater * 2 : 8;
    void **n = realloc(c->later, cap * sizeof *n);
    if (!n) return; /* leak rather than free early */
    c->later = n;
    c->caplater = cap;
  }
  c->later[c->nlater++] = p;
}

/* Give freed heap back to the kernel a little after connections went
 * away: glibc keeps freed memory in its arenas (the heap top only shrinks
 * past M_TRIM_THRESHOLD, which grows with every large free), so after a
 * burst of big answers RSS would stay at its peak.  One trim per second at
 * most, never on the request path. */
static void conn_trim_cb(uv_timer_t *t) {
  (void)t;
  malloc_trim(0);
}

void conn_trim_soon(void) {
  if (!conch.trim_timer) {
    conch.trim_timer = malloc(sizeof *conch.trim_timer);
    if (!conch.trim_timer) return;
    uv_timer_init(conch.loop, conch.trim_timer);
    uv_unref((uv_handle_t *)conch.trim_timer);
  }
  if (!uv_is_active((uv_handle_t *)conch.trim_timer))
    uv_timer_start(conch.trim_timer, conn_trim_cb, CONN_TRIM_MS, 0);
}

static void conn_free_cb(uv_handle_t *h) {
  conn *c = h->data;
  if (--c->handles_open == 0) {
    if (c->counted) {
      conch.nconns--;
      conn_trim_soon();
    }
    conn_free_later_run(c);
    free(c->later);
    free(c->rbuf);
    free(c->spare);
    free(c);
  }
}

void conn_close(conn *c) {
  if (c->closing) return;
  c->closing = 1;
  if (c->proto && c->proto->on_close) c->proto->on_close(c);
  c->proto = NULL;
  conn_batch_free(c);
  uv_close((uv_handle_t *)&c->flush, conn_free_cb);
  uv_close((uv_handle_t *)&c->timer, conn_free_cb);
  uv_close((uv_handle_t *)&c->defer, conn_free_cb);
  uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
}

static void conn_on_defer(uv_timer_t *t) {
  conn *c = t->data;
  void (*fn)(conn *) = c->defer_fn;
  c->defer_fn = NULL;
  if (!c->closing && fn) fn(c);
}

void conn_defer(conn *c, void (*fn)(conn *c)) {
  if (c->closing) return;
  c->defer_fn = fn;
  if (!uv_is_active((uv_handle_t *)&c->defer)) uv_timer_start(&c->defer, conn_on_defer, 0, 0);
}

/* Keep one finished request for the next batch: a 2.6 KiB malloc/free per
 * batch made glibc consolidate its fast bins on every request. */
static void conn_wreq_release(conn *c, wreq *w) {
  if (!c->spare && !c->closing)
    c->spare = w;
  else
    free(w);
}

/* A batch's bytes reached the kernel: give back what it owned. */
static void conn_batch_written(conn *c, wreq *w) {
  c->outq -= w->bytes;
  for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
  conn_wreq_release(c, w);
  if (c->outq == 0 && c->nlater) conn_free_later_run(c);
}

static void conn_write_done(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  conn *c = w->c;
  conn_batch_written(c, w);
  if (c->closing) return;
  if (status < 0) {
    LOG_DEBUG("write failed conn=%llu err=%s", (unsigned long long)c->id, uv_strerror(status));
    conn_close(c);
    return;
  }
  if (c->proto && c->proto->on_written) c->proto->on_written(c);
}

static void conn_on_flush(uv_prepare_t *h);

/* Hand the gathered batch to libuv (which tries to write it at once). */
static int conn_submit(conn *c) {
  wreq *w = c->batch;
  c->batch = NULL;
  if (!c->turn_paused) uv_prepare_stop(&c->flush); /* else it still has to resume reading */
  if (!w) return 0;
  int r = c->closing ? UV_ECANCELED
                     : uv_write(&w->req, (uv_stream_t *)&c->tcp, w->bufs, w->nbuf, conn_write_done);
  if (r < 0) {
    /* the callback never runs: undo, and close from the loop (next prepare) */
    c->outq -= w->bytes;
    for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
    free(w);
    if (!c->closing) {
      c->write_failed = 1;
      uv_prepare_start(&c->flush, conn_on_flush);
    }
    return -1;
  }
  return 0;
}

/* The batch straight into the socket when libuv holds nothing unwritten
 * for it (uv_try_write refuses otherwise, which keeps the order): most
 * answers fit the socket buffer, and a finished uv_write costs a pending
 * callback plus an epoll_ctl to clear POLLOUT.  Returns 1 when the whole
 * batch went out (its completion has run), 0 when the rest of the batch
 * (if any) is left for uv_write. */
static int conn_try_batch(conn *c) {
  wreq *w = c->batch;
  ssize_t n = uv_try_write((uv_stream_t *)&c->tcp, w->bufs, w->nbuf);
  if (n <= 0) return 0;
  size_t done = (size_t)n;
  if (done < w->bytes) { /* partly written: drop what went out */
    c->outq -= done;
    w->bytes -= done;
    unsigned k = 0;
    while (done >= w->bufs[k].len) done -= w->bufs[k++].len;
    w->bufs[k].base += done;
    w->bufs[k].len -= (unsigned)done;
    memmove(w->bufs, w->bufs + k, (w->nbuf - k) * sizeof w->bufs[0]);
    w->nbuf -= k;
    return 0;
  }
  c->batch = NULL;
  conn_batch_written(c, w);
  if (c->proto && c->proto->on_written) c->proto->on_written(c);
  return 1;
}

void conn_authed(conn *c) { c->authed = 1; }

void conn_unauth_over(conn *c, const char *what) {
  if (++conch.unauth_closed % 1000 == 1)
    LOG_WARN("unauthenticated connection closed: %s peer=%s queued=%zu closed=%llu", what, c->peer,
             c->outq, conch.unauth_closed);
}

static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void conn_on_flush(uv_prepare_t *h) {
  conn *c = h->data;
  c->turn_reqs = 0;
  if (c->turn_paused) { /* a new loop turn: its reading share again */
    c->turn_paused = 0;
    if (!c->read_paused && !c->closing) uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
  }
  /* on_written may queue more: a few rounds, then uv_write */
  for (int round = 0; round < 4 && c->batch && !c->closing; round++)
    if (!conn_try_batch(c)) break;
  conn_submit(c);
  if (c->write_failed && !c->closing) {
    LOG_DEBUG("write failed conn=%llu", (unsigned long long)c->id);
    conn_close(c);
    return;
  }
  /* measured here, after the kernel took what it would: what is left is
   * ours to hold */
  if (!c->authed && !c->closing && c->outq > CONN_UNAUTH_OUTQ) {
    conn_unauth_over(c, "output not read");
    conn_close(c);
  }
}

static void conn_batch_free(conn *c) {
  wreq *w = c->batch;
  c->batch = NULL;
  if (!w) return;
  c->outq -= w->bytes;
  for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
  free(w);
}

int conn_write_pre(conn *c, const void *pre, size_t prelen, const uv_buf_t *bufs, unsigned n,
                   void **owned, unsigned nowned) {
  if (c->closing || n + 1 > CONN_BATCH_BUFS || nowned > CONN_BATCH_BUFS || prelen > 64) {
    for (unsigned i = 0; i < nowned; i++) bufref_owner_free(owned[i]);
    return -1;
  }
  wreq *w = c->batch;
  if (w && (w->nbuf + n + 1 > CONN_BATCH_BUFS || w->nowned + nowned > CONN_BATCH_BUFS ||
            w->prelen + prelen > CONN_BATCH_PRE)) {
    if (conn_submit(c) != 0) {
      for (unsigned i = 0; i < nowned; i++) bufref_owner_free(owned[i]);
      return -1;
    }
    w = NULL;
  }
  if (!w) {
    w = c->spare ? c->spare : malloc(sizeof *w);
    c->spare = NULL;
    if (!w) {
      for (unsigned i = 0; i < nowned; i++) bufref_owner_free(owned[i]);
      return -1;
    }
    w->c = c;
    w->bytes = w->prelen = 0;
    w->nbuf = w->nowned = 0;
    c->batch = w;
    uv_prepare_start(&c->flush, conn_on_flush);
  }
  if (prelen) {
    memcpy(w->pre + w->prelen, pre, prelen);
    w->bufs[w->nbuf++] = uv_buf_init(w->pre + w->prelen, (unsigned)prelen);
    w->prelen += prelen;
    w->bytes += prelen;
    c->outq += prelen;
  }
  for (unsigned i = 0; i < n; i++) {
    w->bufs[w->nbuf++] = bufs[i];
    w->bytes += bufs[i].len;
    c->outq += bufs[i].len;
  }
  for (unsigned i = 0; i < nowned; i++) w->owned[w->nowned++] = owned[i];
  return 0;
}

int conn_write(conn *c, const uv_buf_t *bufs, unsigned n, void **owned, unsigned nowned) {
  return conn_write_pre(c, NULL, 0, bufs, n, owned, nowned);
}

int conn_write_copy(conn *c, const void *data, size_t len) {
  void *b = malloc(len ? len : 1);
  if (!b) return -1;
  memcpy(b, data, len);
  uv_buf_t buf = uv_buf_init(b, (unsigned)len);
  return conn_write(c, &buf, 1, &b, 1);
}

/* One read buffer per connection, reused: protocols copy what they keep
 * before on_read returns (a fresh 64 KiB block per read made malloc trim
 * and re-fault the heap top on every request). */
static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  (void)hint;
  conn *c = h->data;
  if (!c->rbuf) c->rbuf = malloc(CONN_READ_BUF);
  *buf = uv_buf_init(c->rbuf, c->rbuf ? CONN_READ_BUF : 0);
}

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = s->data;
  if (nread < 0) {
    if (nread != UV_EOF)
      LOG_DEBUG("read failed conn=%llu err=%s", (unsigned long long)c->id, uv_strerror((int)nread));
    conn_close(c);
    return;
  }
  const uint8_t *d = (const uint8_t *)buf->base;
  size_t n = (size_t)nread;
  if (!c->proto && n > 0) {
    /* sniff the HTTP/2 preface */
    size_t take = n < 24 - c->sniff_len ? n : 24 - c->sniff_len;
    memcpy(c->sniff + c->sniff_len, d, take);
    c->sniff_len += take;
    int match = memcmp(c->sniff, h2_preface, c->sniff_len) == 0;
    if (match && c->sniff_len < 24) return;
    c->proto = match ? &h2_conn_proto : &http1_conn_proto;
    if (match ? h2_conn_init(c, NULL, NULL, 0) : http1_conn_init(c)) {
      conn_close(c);
      return;
    }
    /* replay the sniffed bytes first */
    uint8_t pre[24];
    size_t prelen = c->sniff_len;
    memcpy(pre, c->sniff, prelen);
    c->proto->on_read(c, pre, prelen);
    d += take;
    n -= take;
  }
  if (n > 0 && c->proto && !c->closing) c->proto->on_read(c, d, n);
  if (c->turn_reqs >= CONN_TURN_REQS && !c->closing && !c->read_paused && !c->turn_paused) {
    c->turn_paused = 1;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_prepare_start(&c->flush, conn_on_flush);
  }
}

void conn_read_pause(conn *c, int paused) {
  if (c->closing || c->read_paused == paused) return;
  c->read_paused = paused;
  if (paused)
    uv_read_stop((uv_stream_t *)&c->tcp);
  else
    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
}

static void conn_on_timer(uv_timer_t *t) {
  conn *c = t->data;
  if (c->closing) return;
  if (c->proto && c->proto->on_timeout)
    c->proto->on_timeout(c);
  else
    conn_close(c); /* nothing arrived in time to even pick a protocol */
}

void conn_timer(conn *c, uint64_t ms) {
  if (c->closing) return;
  if (ms)
    uv_timer_start(&c->timer, conn_on_timer, ms, 0);
  else
    uv_timer_stop(&c->timer);
}

void conn_accept(uv_stream_t *server) {
  conn *c = calloc(1, sizeof *c);
  if (!c) return;
  uv_tcp_init(server->loop, &c->tcp);
  uv_timer_init(server->loop, &c->timer);
  uv_timer_init(server->loop, &c->defer);
  uv_prepare_init(server->loop, &c->flush);
  c->handles_open = 4;
  c->tcp.data = c->timer.data = c->defer.data = c;
  c->flush.data = c;
  c->id = ++conch.conn_seq;
  int full = conch.nconns >= conch.max_conns;
  if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0 || full) {
    if (full && ++conch.conns_refused % 1000 == 1)
      LOG_WARN("connection limit reached max=%u refused=%llu", conch.max_conns, conch.conns_refused);
    c->closing = 1;
    uv_close((uv_handle_t *)&c->flush, conn_free_cb);
    uv_close((uv_handle_t *)&c->timer, conn_free_cb);
    uv_close((uv_handle_t *)&c->defer, conn_free_cb);
    uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
    return;
  }
  c->counted = 1;
  conch.nconns++;
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&ss, c->peer, sizeof c->peer);
    else uv_ip4_name((struct sockaddr_in *)&ss, c->peer, sizeof c->peer);
  }
  conn_timer(c, conch.http_header_ms); /* request headers within 10 s (api.md §1) */
  uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
}
