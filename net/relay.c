/* net/relay — forwarders of loopback-only listeners to the outward
 * address (api.md §9 "Ports"), on the loop.
 *
 * One forwarder per port listens on <outward>:P and relays each
 * connection to the loopback listener at P.  A relayed connection moves
 * bytes each way through at most two 32 KiB buffers (≤ 64 KiB in flight
 * per direction): a side whose writes are not done stops the other side
 * being read, so a peer that does not read holds 64 KiB, not the sender's
 * whole stream.  The buffers are taken from the daemon's memory budget
 * (rpc_budget_take) while they hold bytes; when the budget is spent a
 * direction waits and retries.  EOF from one side becomes a shutdown(WR)
 * of the other once its bytes are written; the connection closes when
 * both directions are shut or on any error.  At most NET_RELAY_MAX
 * connections: past it an accepted connection is closed at once.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent/log.h"
#include "net/net.h"
#include "net/service.h"

#define NET_RELAY_MAX 1024
#define NET_RELAY_SLOT (32u * 1024)
#define NET_RELAY_SLOTS 2
#define NET_RETRY_MS 20
#define NET_SLOT_CACHE 64 /* empty buffers kept for reuse (2 MiB): no malloc/free per read */

typedef struct relay_conn relay_conn;

typedef struct relay_dir {
  relay_conn *c;
  uv_tcp_t *src, *dst;
  char *slot[NET_RELAY_SLOTS]; /* buffers holding bytes (being written) */
  uv_write_t wr[NET_RELAY_SLOTS];
  int inflight;  /* slots being written */
  int reading;
  int eof;       /* src said EOF */
  int shut;      /* dst shut down (or being) */
  int starved;   /* waits for budget */
  uv_shutdown_t sh;
  struct relay_dir *snext;
} relay_dir;

struct relay_conn {
  uv_tcp_t a, b; /* the client, the loopback listener */
  uv_connect_t creq;
  relay_dir up, down; /* a→b, b→a */
  int handles;
  int closing;
  int shut_done; /* directions whose shutdown completed */
};

typedef struct fwd {
  struct fwd *next;
  uint16_t port;
  int listening; /* the listener is bound and listens */
  int failed_logged;
  uv_tcp_t *lis;
  struct sockaddr_storage target;
  char to[NET_ADDR_MAX + 8];
} fwd;

static char *fwd_addr;
static struct sockaddr_storage fwd_sa;
static fwd *fwds;
static size_t nconns;
static relay_dir *starved;
static uv_timer_t retry_timer;
static int retry_init;
static void *slot_cache[NET_SLOT_CACHE];
static int nslot_cache;

/* A 32 KiB buffer counted in the budget, or NULL (budget spent, no memory). */
static char *slot_get(void) {
  if (rpc_budget_take(NET_RELAY_SLOT) != 0) return NULL;
  char *b = nslot_cache ? slot_cache[--nslot_cache] : malloc(NET_RELAY_SLOT);
  if (!b) rpc_budget_give(NET_RELAY_SLOT);
  return b;
}

static void slot_put(char *b) {
  rpc_budget_give(NET_RELAY_SLOT);
  if (nslot_cache < NET_SLOT_CACHE) slot_cache[nslot_cache++] = b;
  else free(b);
}

const char *net_fwd_addr(void) { return fwd_addr; }

int net_fwd_config(const char *addr) {
  if (!addr) {
    free(fwd_addr);
    fwd_addr = NULL;
    net_fwd_sync(NULL, 0);
    return 0;
  }
  struct sockaddr_storage sa;
  memset(&sa, 0, sizeof sa);
  struct sockaddr_in *s4 = (struct sockaddr_in *)&sa;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&sa;
  if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) s4->sin_family = AF_INET;
  else if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) s6->sin6_family = AF_INET6;
  else return -1;
  char *d = strdup(addr);
  if (!d) return -1;
  free(fwd_addr);
  fwd_addr = d;
  fwd_sa = sa;
  net_fwd_sync(NULL, 0); /* forwarders of another address go; the next scan makes new ones */
  return 0;
}

int net_fwd_covers(int family, const uint8_t *raw) {
  if (!fwd_addr) return 0;
  static const uint8_t zero[16];
  if (family == AF_INET && memcmp(raw, zero, 4) == 0) return 1;
  if (family == AF_INET6 && memcmp(raw, zero, 16) == 0) return 1;
  if (family != fwd_sa.ss_family) return 0;
  if (family == AF_INET) return memcmp(raw, &((struct sockaddr_in *)&fwd_sa)->sin_addr, 4) == 0;
  return memcmp(raw, &((struct sockaddr_in6 *)&fwd_sa)->sin6_addr, 16) == 0;
}

const char *net_fwd_to(uint16_t port) {
  for (fwd *f = fwds; f; f = f->next)
    if (f->port == port && f->listening) return f->to;
  return NULL;
}

/* ---- one relayed connection ---- */

static void relay_read(relay_dir *d);

static void relay_on_closed(uv_handle_t *h) {
  relay_conn *c = h->data;
  if (--c->handles > 0) return;
  nconns--;
  free(c);
}

static void relay_unstarve(relay_dir *d) {
  for (relay_dir **p = &starved; *p; p = &(*p)->snext)
    if (*p == d) {
      *p = d->snext;
      break;
    }
  d->starved = 0;
}

/* Close both sides (the write requests still out complete with
 * UV_ECANCELED first and give their buffers back). */
static void relay_close(relay_conn *c) {
  if (c->closing) return;
  c->closing = 1;
  if (c->up.starved) relay_unstarve(&c->up);
  if (c->down.starved) relay_unstarve(&c->down);
  uv_close((uv_handle_t *)&c->a, relay_on_closed);
  uv_close((uv_handle_t *)&c->b, relay_on_closed);
}

/* Both directions shut and written: the connection is over. */
static void relay_maybe_done(relay_conn *c) {
  if (c->shut_done == 2 && !c->up.inflight && !c->down.inflight) relay_close(c);
}

static void relay_on_shutdown(uv_shutdown_t *req, int status) {
  relay_dir *d = req->data;
  relay_conn *c = d->c;
  if (c->closing) return;
  if (status < 0) {
    relay_close(c);
    return;
  }
  c->shut_done++;
  relay_maybe_done(c);
}

/* After EOF and the last write: pass the half-close on. */
static void relay_maybe_shut(relay_dir *d) {
  if (!d->eof || d->inflight || d->shut || d->c->closing) return;
  d->shut = 1;
  d->sh.data = d;
  if (uv_shutdown(&d->sh, (uv_stream_t *)d->dst, relay_on_shutdown) != 0) relay_close(d->c);
}

static void relay_on_write(uv_write_t *w, int status) {
  relay_dir *d = w->data;
  int i = (int)(w - d->wr);
  slot_put(d->slot[i]);
  d->slot[i] = NULL;
  d->inflight--;
  if (d->c->closing) return;
  if (status < 0) {
    relay_close(d->c);
    return;
  }
  relay_maybe_shut(d);
  if (!d->eof) relay_read(d);
}

static int relay_free_slot(const relay_dir *d) {
  for (int i = 0; i < NET_RELAY_SLOTS; i++)
    if (!d->slot[i]) return i;
  return -1;
}

static void relay_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  relay_conn *c = h->data;
  relay_dir *d = (uv_tcp_t *)h == &c->a ? &c->up : &c->down;
  int i = relay_free_slot(d);
  buf->base = NULL;
  buf->len = 0;
  if (i < 0 || !(d->slot[i] = slot_get())) return; /* UV_ENOBUFS: read_cb waits */
  buf->base = d->slot[i];
  buf->len = NET_RELAY_SLOT;
}

static void relay_on_retry(uv_timer_t *t) {
  relay_dir *list = starved;
  starved = NULL;
  while (list) {
    relay_dir *d = list;
    list = d->snext;
    d->starved = 0;
    relay_read(d);
  }
}

static void relay_on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf) {
  relay_conn *c = s->data;
  relay_dir *d = (uv_tcp_t *)s == &c->a ? &c->up : &c->down;
  int i = -1;
  for (int k = 0; k < NET_RELAY_SLOTS && buf->base; k++)
    if (d->slot[k] == buf->base) i = k;
  if (n <= 0 && i >= 0) { /* a slot taken for nothing */
    slot_put(d->slot[i]);
    d->slot[i] = NULL;
  }
  if (n == UV_ENOBUFS) { /* both slots in flight, or the budget is spent */
    uv_read_stop(s);
    d->reading = 0;
    if (relay_free_slot(d) >= 0 && !d->starved) { /* the budget: try again soon */
      d->starved = 1;
      d->snext = starved;
      starved = d;
      uv_timer_start(&retry_timer, relay_on_retry, NET_RETRY_MS, 0);
    }
    return;
  }
  if (n == 0) return;
  if (n == UV_EOF) {
    uv_read_stop(s);
    d->reading = 0;
    d->eof = 1;
    relay_maybe_shut(d);
    return;
  }
  if (n < 0) {
    relay_close(c);
    return;
  }
  uv_buf_t b = uv_buf_init(buf->base, (unsigned)n);
  d->wr[i].data = d;
  d->inflight++;
  if (uv_write(&d->wr[i], (uv_stream_t *)d->dst, &b, 1, relay_on_write) != 0) {
    d->inflight--;
    slot_put(d->slot[i]);
    d->slot[i] = NULL;
    relay_close(c);
    return;
  }
  if (relay_free_slot(d) < 0) { /* back-pressure: the other side has not taken what we read */
    uv_read_stop(s);
    d->reading = 0;
  }
}

static void relay_read(relay_dir *d) {
  if (d->reading || d->eof || d->c->closing || relay_free_slot(d) < 0) return;
  if (uv_read_start((uv_stream_t *)d->src, relay_alloc, relay_on_read) == 0) d->reading = 1;
  else relay_close(d->c);
}

static void relay_on_connect(uv_connect_t *req, int status) {
  relay_conn *c = req->data;
  if (c->closing) return;
  if (status < 0) {
    relay_close(c);
    return;
  }
  uv_tcp_nodelay(&c->a, 1);
  uv_tcp_nodelay(&c->b, 1);
  relay_read(&c->up);
  relay_read(&c->down);
}

static void fwd_on_conn(uv_stream_t *lis, int status) {
  fwd *f = lis->data;
  if (status < 0) return;
  relay_conn *c = nconns < NET_RELAY_MAX ? calloc(1, sizeof *c) : NULL;
  if (!c) { /* over the bound (or out of memory): accept and close at once */
    uv_tcp_t *t = malloc(sizeof *t);
    if (!t) return;
    uv_tcp_init(net_loop, t);
    if (uv_accept(lis, (uv_stream_t *)t) == 0) LOG_DEBUG("port %u: relayed connections at the bound", f->port);
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    return;
  }
  nconns++;
  uv_tcp_init(net_loop, &c->a);
  uv_tcp_init(net_loop, &c->b);
  c->handles = 2;
  c->a.data = c->b.data = c;
  c->up = (relay_dir){.c = c, .src = &c->a, .dst = &c->b};
  c->down = (relay_dir){.c = c, .src = &c->b, .dst = &c->a};
  c->creq.data = c;
  if (uv_accept(lis, (uv_stream_t *)&c->a) != 0 ||
      uv_tcp_connect(&c->creq, &c->b, (struct sockaddr *)&f->target, relay_on_connect) != 0)
    relay_close(c);
}

/* ---- forwarders ---- */

static void fwd_stop(fwd *f) {
  if (f->lis) uv_close((uv_handle_t *)f->lis, (uv_close_cb)free);
  f->lis = NULL;
  if (f->listening) LOG_INFO("port %u: forwarding stopped", f->port);
  f->listening = 0;
}

/* Bind and listen; a failure is logged once and tried again next sync. */
static void fwd_start(fwd *f) {
  struct sockaddr_storage sa = fwd_sa;
  if (sa.ss_family == AF_INET) ((struct sockaddr_in *)&sa)->sin_port = htons(f->port);
  else ((struct sockaddr_in6 *)&sa)->sin6_port = htons(f->port);
  uv_tcp_t *t = malloc(sizeof *t);
  if (!t) return;
  uv_tcp_init(net_loop, t);
  t->data = f;
  int r = uv_tcp_bind(t, (struct sockaddr *)&sa, sa.ss_family == AF_INET6 ? UV_TCP_IPV6ONLY : 0);
  if (r == 0) r = uv_listen((uv_stream_t *)t, 511, fwd_on_conn);
  if (r != 0) {
    if (!f->failed_logged)
      LOG_WARN("port %u: cannot forward to %s: %s (retried)", f->port, f->to, uv_strerror(r));
    f->failed_logged = 1;
    uv_close((uv_handle_t *)t, (uv_close_cb)free);
    return;
  }
  f->lis = t;
  f->listening = 1;
  LOG_INFO("port %u: forwarded to %s", f->port, f->to);
}

void net_fwd_sync(const net_fwd_want *want, size_t n) {
  if (!retry_init && net_loop) {
    uv_timer_init(net_loop, &retry_timer);
    uv_unref((uv_handle_t *)&retry_timer);
    retry_init = 1;
  }
  /* stop what is no longer wanted */
  for (fwd **p = &fwds; *p;) {
    fwd *f = *p;
    int keep = 0;
    for (size_t i = 0; i < n && !keep; i++) keep = want[i].port == f->port;
    if (keep) {
      p = &f->next;
      continue;
    }
    fwd_stop(f);
    *p = f->next;
    free(f);
  }
  for (size_t i = 0; fwd_addr && i < n; i++) {
    if (want[i].port == 4064 || want[i].port == 4065) continue; /* the agent's own ports */
    fwd *f = fwds;
    while (f && f->port != want[i].port) f = f->next;
    if (!f) {
      f = calloc(1, sizeof *f);
      if (!f) return;
      f->port = want[i].port;
      if (fwd_sa.ss_family == AF_INET6) snprintf(f->to, sizeof f->to, "[%s]:%u", fwd_addr, f->port);
      else snprintf(f->to, sizeof f->to, "%s:%u", fwd_addr, f->port);
      f->next = fwds;
      fwds = f;
    }
    memset(&f->target, 0, sizeof f->target);
    if (want[i].family == AF_INET) {
      struct sockaddr_in *s = (struct sockaddr_in *)&f->target;
      s->sin_family = AF_INET;
      s->sin_port = htons(f->port);
      memcpy(&s->sin_addr, want[i].raw, 4);
    } else {
      struct sockaddr_in6 *s = (struct sockaddr_in6 *)&f->target;
      s->sin6_family = AF_INET6;
      s->sin6_port = htons(f->port);
      memcpy(&s->sin6_addr, want[i].raw, 16);
    }
    if (!f->listening) fwd_start(f);
  }
}
