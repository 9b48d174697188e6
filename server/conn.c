/* conn — TCP connections; see conn.h. */
#include "server/conn.h"

#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/sendfile.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/bufref.h"
#include "core/daemon.h"
#include "core/list.h"
#include "core/log.h"
#include "core/pool.h"
#include "server/tokhold.h"

static const char h2_preface[24] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/* The sink (first: a conn is its sink) and the socket behind it. */
typedef struct conn {
  hsink s;
  uv_tcp_t tcp;
  uv_timer_t timer;
  uv_timer_t defer; /* conn_defer(): run proto work on the next loop turn */
  uv_prepare_t flush; /* submits the corked batch before the loop blocks */
  struct wreq *batch; /* writes gathered during this loop turn */
  struct wreq *spare; /* a finished write request kept for the next batch */
  char *rbuf;         /* the read buffer (CONN_READ_BUF), reused */
  void **later;       /* buffers to free once every queued write is done */
  size_t nlater, caplater;
  void (*defer_fn)(hsink *s);
  uint8_t sniff[24];
  size_t sniff_len;
  int read_paused;
  int turn_paused;   /* read its share of this loop turn: resumed by the prepare */
  int write_failed; /* closed from the loop, never inside a caller's stack */
  int handles_open;
  int counted; /* in conch.nconns */
  unsigned nbulk; /* exchanges sending bulk data (hx_bulk) */
  int drained;    /* conn_drain asked it to finish and close */
  tokhold tok;    /* authenticated (hx_authed): with which token generation */
  struct conn_sf *sf; /* a file range being sent (conn_op_sendfile) */
  list_node link; /* in conn_all: the open connections (conn_freeze), newest first */
} conn;

static list_node conn_all;
static int conn_frozen; /* conn_freeze: no connection reads */
static int conn_draining; /* conn_drain: an upgrade's drain */

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

static void conn_free_later(conn *c, void *p) {
  if (c->s.outq == 0) {
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

static void conn_sf_detach(conn *c);

static void conn_close(conn *c) {
  if (c->s.closing) return;
  c->s.closing = 1;
  conn_sf_detach(c);
  list_remove(&c->link);
  tokhold_drop(&c->tok);
  if (c->s.proto && c->s.proto->on_close) c->s.proto->on_close(&c->s);
  c->s.proto = NULL;
  conn_batch_free(c);
  uv_close((uv_handle_t *)&c->flush, conn_free_cb);
  uv_close((uv_handle_t *)&c->timer, conn_free_cb);
  uv_close((uv_handle_t *)&c->defer, conn_free_cb);
  uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
}

static void conn_on_defer(uv_timer_t *t) {
  conn *c = t->data;
  void (*fn)(hsink *) = c->defer_fn;
  c->defer_fn = NULL;
  if (!c->s.closing && fn) fn(&c->s);
}

static void conn_defer(conn *c, void (*fn)(hsink *s)) {
  if (c->s.closing) return;
  c->defer_fn = fn;
  if (!uv_is_active((uv_handle_t *)&c->defer)) uv_timer_start(&c->defer, conn_on_defer, 0, 0);
}

/* Keep one finished request for the next batch: a 2.6 KiB malloc/free per
 * batch made glibc consolidate its fast bins on every request. */
static void conn_wreq_release(conn *c, wreq *w) {
  if (!c->spare && !c->s.closing)
    c->spare = w;
  else
    free(w);
}

/* ---- a file range by the kernel (hsink_ops.sendfile) ----
 * The range goes in pool jobs (sendfile may have to read the file's pages:
 * never on the loop), each until the socket is full or CONN_SF_SLICE
 * went; when full, a uv_poll on a dup of the socket says when it drains.
 * The job works on dups of the socket and the file, so that a connection
 * closed meanwhile (its sf detached: done never runs) takes nothing from
 * under it; the sf frees itself once its job and its poll handle are
 * done. */
#define CONN_SF_SLICE (8u << 20)

static void conn_on_flush(uv_prepare_t *h);

typedef struct conn_sf {
  pool_job job; /* first */
  conn *c;      /* NULL once detached */
  int sock, fd;
  uint64_t off, left;
  int err;      /* the job's errno (EAGAIN: the socket is full) */
  int busy, poll_init, polling, started;
  uv_poll_t poll;
  void (*done)(void *arg);
  void *arg;
} conn_sf;

static void conn_sf_free(conn_sf *f) {
  if (f->sock >= 0) close(f->sock);
  if (f->fd >= 0) close(f->fd);
  free(f);
}

static void conn_sf_poll_closed(uv_handle_t *h) { conn_sf_free(h->data); }

/* Free once nothing runs (detached or finished). */
static void conn_sf_release(conn_sf *f) {
  if (f->busy) return; /* its done comes back */
  if (f->poll_init) {
    f->poll_init = 0;
    uv_close((uv_handle_t *)&f->poll, conn_sf_poll_closed);
    return;
  }
  conn_sf_free(f);
}

static void conn_sf_detach(conn *c) {
  conn_sf *f = c->sf;
  if (!f) return;
  c->sf = NULL;
  f->c = NULL;
  if (f->polling) uv_poll_stop(&f->poll);
  f->polling = 0;
  conn_sf_release(f);
}

static void conn_sf_run(pool_job *j) {
  conn_sf *f = (conn_sf *)j;
  uint64_t sent = 0;
  f->err = 0;
  while (f->left && sent < CONN_SF_SLICE) {
    off_t off = (off_t)f->off;
    size_t n = f->left > CONN_SF_SLICE ? CONN_SF_SLICE : (size_t)f->left;
    ssize_t r = sendfile(f->sock, f->fd, &off, n);
    if (r < 0) {
      if (errno == EINTR) continue;
      f->err = errno;
      return;
    }
    if (r == 0) { /* the file ended early: it shrank */
      f->err = ENODATA;
      return;
    }
    f->off += (uint64_t)r;
    f->left -= (uint64_t)r;
    sent += (uint64_t)r;
  }
}

static void conn_sf_next(conn_sf *f);

static void conn_sf_on_poll(uv_poll_t *p, int status, int events) {
  conn_sf *f = p->data;
  (void)events;
  uv_poll_stop(p);
  f->polling = 0;
  if (!f->c) return;
  if (status < 0) {
    conn_close(f->c); /* detaches f */
    return;
  }
  conn_sf_next(f);
}

static void conn_sf_job_done(pool_job *j, int canceled) {
  conn_sf *f = (conn_sf *)j;
  f->busy = 0;
  conn *c = f->c;
  if (!c) {
    conn_sf_release(f);
    return;
  }
  if (canceled || (f->err && f->err != EAGAIN)) {
    LOG_DEBUG("sendfile failed conn=%llu err=%s", (unsigned long long)c->s.id,
              canceled ? "canceled" : strerror(f->err));
    conn_close(c);
    return;
  }
  if (f->left == 0) { /* all sent: writes go on, the exchange too */
    void (*done)(void *) = f->done;
    void *arg = f->arg;
    conn_sf_detach(c);
    if (c->batch) uv_prepare_start(&c->flush, conn_on_flush);
    done(arg);
    return;
  }
  if (f->err == EAGAIN) { /* full: wait until it drains */
    if (!f->poll_init) {
      if (uv_poll_init_socket(c->tcp.loop, &f->poll, f->sock) != 0) {
        conn_close(c);
        return;
      }
      f->poll_init = 1;
      f->poll.data = f;
    }
    if (uv_poll_start(&f->poll, UV_WRITABLE, conn_sf_on_poll) != 0) {
      conn_close(c);
      return;
    }
    f->polling = 1;
    return;
  }
  conn_sf_next(f); /* a slice went: the next one */
}

static void conn_sf_next(conn_sf *f) {
  f->busy = 1;
  pool_submit(&f->job, conn_sf_run, conn_sf_job_done);
}

/* Start when every write queued before has left. */
static void conn_sf_go(conn *c) {
  conn_sf *f = c->sf;
  if (f->busy || f->polling || f->started) return;
  f->started = 1;
  conn_sf_next(f);
}

static int conn_op_sendfile(hsink *s, int fd, uint64_t off, uint64_t len, void (*done)(void *arg),
                            void *arg) {
  conn *c = (conn *)s;
  uv_os_fd_t sock;
  if (c->s.closing || c->sf || uv_fileno((uv_handle_t *)&c->tcp, &sock) != 0) return -1;
  conn_sf *f = calloc(1, sizeof *f);
  if (!f) return -1;
  f->sock = fcntl(sock, F_DUPFD_CLOEXEC, 3);
  f->fd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (f->sock < 0 || f->fd < 0) {
    conn_sf_free(f);
    return -1;
  }
  f->c = c;
  f->off = off;
  f->left = len;
  f->done = done;
  f->arg = arg;
  c->sf = f;
  /* what was written before goes first (the batch is flushed as usual) */
  if (c->s.outq == 0 && !c->batch) conn_sf_go(c);
  return 0;
}

/* A batch's bytes reached the kernel: give back what it owned. */
static void conn_batch_written(conn *c, wreq *w) {
  c->s.outq -= w->bytes;
  conch.held -= w->bytes;
  for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
  conn_wreq_release(c, w);
  if (c->s.outq == 0 && c->nlater) conn_free_later_run(c);
  if (c->s.outq == 0 && c->sf) conn_sf_go(c);
}

static void conn_write_done(uv_write_t *req, int status) {
  wreq *w = (wreq *)req;
  conn *c = w->c;
  conn_batch_written(c, w);
  if (c->s.closing) return;
  if (status < 0) {
    LOG_DEBUG("write failed conn=%llu err=%s", (unsigned long long)c->s.id, uv_strerror(status));
    conn_close(c);
    return;
  }
  if (c->s.proto && c->s.proto->on_written) c->s.proto->on_written(&c->s);
}

static void conn_on_flush(uv_prepare_t *h);

/* Hand the gathered batch to libuv (which tries to write it at once). */
static int conn_submit(conn *c) {
  wreq *w = c->batch;
  c->batch = NULL;
  if (!c->turn_paused) uv_prepare_stop(&c->flush); /* else it still has to resume reading */
  if (!w) return 0;
  int r = c->s.closing ? UV_ECANCELED
                     : uv_write(&w->req, (uv_stream_t *)&c->tcp, w->bufs, w->nbuf, conn_write_done);
  if (r < 0) {
    /* the callback never runs: undo, and close from the loop (next prepare) */
    c->s.outq -= w->bytes;
    conch.held -= w->bytes;
    for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
    free(w);
    if (!c->s.closing) {
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
    c->s.outq -= done;
    conch.held -= done;
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
  if (c->s.proto && c->s.proto->on_written) c->s.proto->on_written(&c->s);
  return 1;
}

static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf);
static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void conn_on_flush(uv_prepare_t *h) {
  conn *c = h->data;
  c->s.turn_reqs = 0;
  if (c->turn_paused) { /* a new loop turn: its reading share again */
    c->turn_paused = 0;
    if (!c->read_paused && !c->s.closing && !conn_frozen)
      uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
  }
  if (c->sf && c->sf->started) return; /* writes wait behind the file range */
  /* on_written may queue more: a few rounds, then uv_write */
  for (int round = 0; round < 4 && c->batch && !c->s.closing; round++)
    if (!conn_try_batch(c)) break;
  conn_submit(c);
  if (c->write_failed && !c->s.closing) {
    LOG_DEBUG("write failed conn=%llu", (unsigned long long)c->s.id);
    conn_close(c);
    return;
  }
  /* measured here, after the kernel took what it would: what is left is
   * ours to hold */
  if (!c->s.authed && !c->s.closing && c->s.outq > CONN_UNAUTH_OUTQ) {
    sink_unauth_over(&c->s, "output not read");
    conn_close(c);
  }
}

static void conn_batch_free(conn *c) {
  wreq *w = c->batch;
  c->batch = NULL;
  if (!w) return;
  c->s.outq -= w->bytes;
  conch.held -= w->bytes;
  for (unsigned i = 0; i < w->nowned; i++) bufref_owner_free(w->owned[i]);
  free(w);
}

static int conn_write_pre(conn *c, const void *pre, size_t prelen, const uv_buf_t *bufs, unsigned n,
                   void **owned, unsigned nowned) {
  if (c->s.closing || n + 1 > CONN_BATCH_BUFS || nowned > CONN_BATCH_BUFS || prelen > 64) {
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
    c->s.outq += prelen;
    conch.held += prelen;
  }
  for (unsigned i = 0; i < n; i++) {
    w->bufs[w->nbuf++] = bufs[i];
    w->bytes += bufs[i].len;
    c->s.outq += bufs[i].len;
    conch.held += bufs[i].len;
  }
  for (unsigned i = 0; i < nowned; i++) w->owned[w->nowned++] = owned[i];
  return 0;
}

/* Big enough that a read into the protocol's memory saves more than the
 * extra read it may cost (the rest then comes through rbuf). */
#define CONN_INTO_MIN (16u * 1024)

/* One read buffer per connection, reused: protocols copy what they keep
 * before on_read returns (a fresh 64 KiB block per read made malloc trim
 * and re-fault the heap top on every request) — unless the protocol
 * offers memory of its own for the next read (hproto.read_into). */
static void conn_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  (void)hint;
  conn *c = h->data;
  if (c->s.proto && c->s.proto->read_into && !c->s.closing) {
    size_t len = 0;
    uint8_t *p = c->s.proto->read_into(&c->s, &len);
    if (p && len >= CONN_INTO_MIN) {
      *buf = uv_buf_init((char *)p, len > UINT32_MAX ? UINT32_MAX : (unsigned)len);
      return;
    }
  }
  if (!c->rbuf) c->rbuf = malloc(CONN_READ_BUF);
  *buf = uv_buf_init(c->rbuf, c->rbuf ? CONN_READ_BUF : 0);
}

static void conn_drain_one(conn *c);

static void conn_on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  conn *c = s->data;
  if (nread < 0) {
    if (nread != UV_EOF)
      LOG_DEBUG("read failed conn=%llu err=%s", (unsigned long long)c->s.id, uv_strerror((int)nread));
    conn_close(c);
    return;
  }
  const uint8_t *d = (const uint8_t *)buf->base;
  size_t n = (size_t)nread;
  if (!c->s.proto && n > 0) {
    /* sniff the HTTP/2 preface */
    size_t take = n < 24 - c->sniff_len ? n : 24 - c->sniff_len;
    memcpy(c->sniff + c->sniff_len, d, take);
    c->sniff_len += take;
    int match = memcmp(c->sniff, h2_preface, c->sniff_len) == 0;
    if (match && c->sniff_len < 24) return;
    if (match ? c->s.serve->h2_init(&c->s, NULL, NULL, 0) : c->s.serve->http1_init(&c->s)) {
      conn_close(c);
      return;
    }
    /* replay the sniffed bytes first */
    uint8_t pre[24];
    size_t prelen = c->sniff_len;
    memcpy(pre, c->sniff, prelen);
    c->s.proto->on_read(&c->s, pre, prelen);
    d += take;
    n -= take;
  }
  if (n > 0 && c->s.proto && !c->s.closing) c->s.proto->on_read(&c->s, d, n);
  if (conn_draining) conn_drain_one(c); /* a request came in: answered, then the connection closes */
  if (c->s.turn_reqs >= CONN_TURN_REQS && !c->s.closing && !c->read_paused && !c->turn_paused) {
    c->turn_paused = 1;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_prepare_start(&c->flush, conn_on_flush);
  }
}

static void conn_read_pause(conn *c, int paused) {
  if (c->s.closing || c->read_paused == paused) return;
  c->read_paused = paused;
  if (paused)
    uv_read_stop((uv_stream_t *)&c->tcp);
  else if (!conn_frozen && !c->turn_paused)
    uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
}

int conn_pending_output(void) {
  conn *c;
  list_each(c, &conn_all, link)
    if (!c->s.closing && (c->batch || c->s.outq > 0)) return 1;
  return 0;
}

/* hproto.drain_state of c: 0 between requests (nothing read yet counts),
 * 1 a request head still coming, 2 an exchange under way. */
static int conn_drain_state(const conn *c) {
  if (!c->s.proto) return c->sniff_len ? 1 : 0;
  return c->s.proto->drain_state ? c->s.proto->drain_state(&c->s) : 2;
}

/* Between requests with nothing to send: the next program can serve it. */
static int conn_at_boundary(const conn *c) {
  return !c->s.closing && !c->batch && !c->s.outq && !c->drained && conn_drain_state(c) == 0;
}

/* Draining: a connection with an exchange under way finishes it and
 * closes (conn_token_replaced's path: HTTP/1.1 answers with `Connection:
 * close`, HTTP/2 refuses new streams, GOAWAY once the open ones ended);
 * one whose request head is still coming is asked again when it is in. */
static void conn_drain_one(conn *c) {
  if (c->s.closing || c->drained || conn_drain_state(c) != 2) return;
  c->drained = 1;
  if (c->s.proto && c->s.proto->on_revoked) c->s.proto->on_revoked(&c->s);
  else conn_close(c);
}

void conn_drain(int on) {
  conn_draining = on;
  if (!on) return;
  conn *c, *nx;
  list_each_safe(c, nx, &conn_all, link) conn_drain_one(c);
}

int conn_busy(void) {
  conn *c;
  list_each(c, &conn_all, link)
    if (!c->s.closing && !conn_at_boundary(c)) return 1;
  return 0;
}

size_t conn_carry(int *fds, size_t max) {
  size_t n = 0;
  conn *c;
  list_each(c, &conn_all, link) {
    uv_os_fd_t fd;
    if (n < max && conn_at_boundary(c) && uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0) fds[n++] = fd;
  }
  return n;
}

void conn_freeze(int on) {
  conn_frozen = on;
  conn *c;
  list_each(c, &conn_all, link) {
    if (on) uv_read_stop((uv_stream_t *)&c->tcp);
    else if (!c->read_paused && !c->turn_paused) uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
  }
}

static void conn_on_timer(uv_timer_t *t) {
  conn *c = t->data;
  if (c->s.closing) return;
  if (c->s.proto && c->s.proto->on_timeout)
    c->s.proto->on_timeout(&c->s);
  else
    conn_close(c); /* nothing arrived in time to even pick a protocol */
}

static void conn_timer(conn *c, uint64_t ms) {
  if (c->s.closing) return;
  if (ms)
    uv_timer_start(&c->timer, conn_on_timer, ms, 0);
  else
    uv_timer_stop(&c->timer);
}

/* the sink ops: a conn is its sink */
static int conn_op_write(hsink *s, const void *pre, size_t prelen, const uv_buf_t *bufs, unsigned n,
                         void **owned, unsigned nowned) {
  return conn_write_pre((conn *)s, pre, prelen, bufs, n, owned, nowned);
}
static void conn_op_free_later(hsink *s, void *p) { conn_free_later((conn *)s, p); }
static void conn_op_read_pause(hsink *s, int paused) { conn_read_pause((conn *)s, paused); }
static void conn_op_timer(hsink *s, uint64_t ms) { conn_timer((conn *)s, ms); }
static void conn_op_defer(hsink *s, void (*fn)(hsink *s)) { conn_defer((conn *)s, fn); }
static void conn_op_close(hsink *s) { conn_close((conn *)s); }
static void conn_op_trim(hsink *s) {
  (void)s;
  conn_trim_soon();
}
/* While an exchange sends bulk data, the kernel takes only CONN_BULK_LOWAT
 * bytes beyond what the peer's window lets out (TCP_NOTSENT_LOWAT): the
 * rest waits in our queue, where the connection's other answers can still
 * go ahead of it (HTTP/2) instead of behind a socket buffer of megabytes.
 * Not on every connection: the writes it splits cost a stream of small
 * events (process output) more CPU than it gains (docs/internals/profile.md,
 * GetFileStream).  0 gives the system's default (no limit) back. */
#define CONN_BULK_LOWAT (64 * 1024)

static void conn_op_bulk(hsink *s, int on) {
  conn *c = (conn *)s;
  if (on && c->nbulk++ > 0) return;                     /* already on */
  if (!on && (c->nbulk == 0 || --c->nbulk > 0)) return; /* others still on */
  uv_os_fd_t fd;
  int v = on ? CONN_BULK_LOWAT : 0;
  if (!c->s.closing && uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
    setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof v);
}

/* The token its requests authenticated with was replaced (tokhold.h):
 * the protocol closes once its exchanges ended (HTTP/1.1: after the one
 * running, at once when idle; HTTP/2: new streams refused, GOAWAY and
 * close once the open ones ended).  `authed`
 * stays: a unary answer in flight is not cut as if never authenticated. */
static void conn_token_replaced(tokhold *t) {
  conn *c = (conn *)((char *)t - offsetof(conn, tok));
  LOG_DEBUG("conn=%llu: its token was replaced, closing", (unsigned long long)c->s.id);
  if (c->s.proto && c->s.proto->on_revoked) c->s.proto->on_revoked(&c->s);
  else conn_close(c);
}

static void conn_op_authed(hsink *s) {
  conn *c = (conn *)s;
  if (!c->s.closing) tokhold_take(&c->tok, conn_token_replaced);
}

static const hsink_ops conn_sink_ops = {conn_op_write,  conn_op_free_later, conn_op_read_pause,
                                        conn_op_timer,  conn_op_defer,      conn_op_close,
                                        conn_op_trim,   conn_op_bulk,       conn_op_authed,
                                        conn_op_sendfile};

/* A connection on the socket accepted from server, or (server NULL) on
 * fd, carried over by an upgrade. */
static void conn_start(uv_stream_t *server, int fd, const hserve *serve) {
  conn *c = calloc(1, sizeof *c);
  if (!c) {
    if (fd >= 0) close(fd);
    return;
  }
  c->s.ops = &conn_sink_ops;
  c->s.serve = serve;
  uv_tcp_init(conch.loop, &c->tcp);
  uv_timer_init(conch.loop, &c->timer);
  uv_timer_init(conch.loop, &c->defer);
  uv_prepare_init(conch.loop, &c->flush);
  c->handles_open = 4;
  c->tcp.data = c->timer.data = c->defer.data = c;
  c->flush.data = c;
  c->s.id = ++conch.conn_seq;
  int full = conch.nconns >= conch.max_conns;
  int taken = server ? uv_accept(server, (uv_stream_t *)&c->tcp) : uv_tcp_open(&c->tcp, fd);
  if (!server && taken != 0) close(fd);
  if (taken != 0 || full) {
    if (full && ++conch.conns_refused % 1000 == 1)
      LOG_WARN("connection limit reached max=%u refused=%llu", conch.max_conns, conch.conns_refused);
    c->s.closing = 1;
    uv_close((uv_handle_t *)&c->flush, conn_free_cb);
    uv_close((uv_handle_t *)&c->timer, conn_free_cb);
    uv_close((uv_handle_t *)&c->defer, conn_free_cb);
    uv_close((uv_handle_t *)&c->tcp, conn_free_cb);
    return;
  }
  c->counted = 1;
  conch.nconns++;
  list_insert_head(&conn_all, &c->link);
  uv_tcp_nodelay(&c->tcp, 1);
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sl) == 0) {
    if (ss.ss_family == AF_INET6) uv_ip6_name((struct sockaddr_in6 *)&ss, c->s.peer, sizeof c->s.peer);
    else uv_ip4_name((struct sockaddr_in *)&ss, c->s.peer, sizeof c->s.peer);
  }
  conn_timer(c, conch.http_header_ms); /* request headers within 10 s (api.md §1) */
  if (!conn_frozen) uv_read_start((uv_stream_t *)&c->tcp, conn_alloc, conn_on_read);
}

void conn_accept(uv_stream_t *server, const hserve *serve) { conn_start(server, -1, serve); }

void conn_adopt(int fd, const hserve *serve) {
  fcntl(fd, F_SETFD, FD_CLOEXEC);
  conn_start(NULL, fd, serve);
}
