/* net/relay — forwarders of loopback-only listeners to the outward
 * address (api.md §9 "Ports"), on the loop.
 *
 * One forwarder per port listens on <outward>:P and relays each
 * connection to the loopback listener at P.  Each direction of a relayed
 * connection is a pipe of 64 KiB between the two sockets, filled and
 * drained with splice(2): the bytes never cross user space (a copy
 * through a user buffer ran at 0.39× of a direct connection, splice at
 * tests/bench/README.md's figure).  A pipe that is full stops its source
 * being read, so a peer that does not read holds 64 KiB per direction,
 * not the sender's stream; what a pipe holds is taken from the daemon's
 * memory budget (budget_take) before it is read, and a direction that
 * finds the budget spent waits and retries.  EOF from one side becomes a
 * shutdown(SHUT_WR) of the other once the pipe is empty; the connection
 * closes when both directions are shut, or on any error.  At most
 * NET_RELAY_MAX connections: past it an accepted connection is closed at
 * once.  Sockets and listeners are raw descriptors watched by uv_poll.
 *
 * Outside clients must not take the API's room: what all relays' pipes
 * hold together is capped at a quarter of the memory budget.  A direction
 * that would pass the cap first resets (RST) the relay that has held
 * bytes without moving any for the longest, at least NET_RELAY_STALL_MS
 * (counted: /metrics relaysReset), else waits as for the budget.  A
 * relayed connection that moves nothing for NET_RELAY_IDLE_MS (10 min;
 * CONCH_RELAY_IDLE_MS, tests shorten it) is closed.  `conns` is kept in
 * the order of last activity, oldest first, for both.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/list.h"
#include "core/log.h"
#include "net/net.h"
#include "net/service.h"

#include "net/relay_int.h"

char *fwd_addr;
struct sockaddr_storage fwd_sa;
fwd *fwds;
static size_t nconns;
list_node conns;   /* every relayed connection not closing, oldest activity first */
size_t relay_held; /* what every relay's pipes hold */
static unsigned long long relays_reset;
static uv_timer_t idle_timer;
static uint64_t idle_ms;
static list_node starved; /* newest first */
static uv_timer_t retry_timer;
static int retry_init;
static uint64_t relayed; /* connections relayed since start (/metrics) */
static int steer_state; /* 0 not tried for this address, 1 on, -1 off (unavailable or CONCH_FORWARD_STEER=0) */

const char *net_fwd_addr(void) { return fwd_addr; }

int net_fwd_config(const char *addr) {
  if (!addr) {
    free(fwd_addr);
    fwd_addr = NULL;
    net_fwd_sync(NULL, 0);
    net_steer_stop();
    steer_state = 0;
    return 0;
  }
  struct sockaddr_storage sa;
  memset(&sa, 0, sizeof sa);
  struct sockaddr_in *s4 = (struct sockaddr_in *)&sa;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)&sa;
  if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) s4->sin_family = AF_INET;
  else if (inet_pton(AF_INET6, addr, &s6->sin6_addr) == 1) s6->sin6_family = AF_INET6;
  else return -1;
  if (fwd_addr && memcmp(&sa, &fwd_sa, sizeof sa) == 0) return 0; /* the same address again: forwarders stay */
  char *d = strdup(addr);
  if (!d) return -1;
  free(fwd_addr);
  fwd_addr = d;
  fwd_sa = sa;
  net_fwd_sync(NULL, 0); /* forwarders of another address go; the next scan makes new ones */
  net_steer_stop();      /* the program names the address */
  steer_state = 0;
  return 0;
}

int net_fwd_family(void) { return fwd_addr ? fwd_sa.ss_family : 0; }

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

static int relay_starved(const relay_dir *d) { return list_linked(&d->slink); }

size_t net_relays_held(void) { return relay_held; }
unsigned long long net_relays_reset(void) { return relays_reset; }

/* The relays' part of the budget: a quarter (half of what producers that
 * wait may fill). */
static size_t relay_cap(void) { return budget_out_limit() / 2; }

/* c moved bytes (or started): the newest activity. */
static void relay_touch(relay_conn *c) {
  c->active = uv_now(net_loop);
  list_remove(&c->link);
  list_insert_tail(&conns, &c->link);
}

static void relay_on_closed(uv_handle_t *h) {
  relay_conn *c = h->data;
  if (--c->handles > 0) return;
  int fds[] = {c->a, c->b, c->up.pr, c->up.pw, c->down.pr, c->down.pw};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    if (fds[i] >= 0) close(fds[i]);
  nconns--;
  free(c);
}

static void relay_close(relay_conn *c) {
  if (c->closing) return;
  c->closing = 1;
  list_remove(&c->link);
  list_remove(&c->up.slink); /* (also out of a retry's batch: not stepped again) */
  list_remove(&c->down.slink);
  budget_give(c->up.held + c->down.held);
  relay_held -= c->up.held + c->down.held;
  c->up.held = c->down.held = 0;
  uv_close((uv_handle_t *)&c->pa, relay_on_closed);
  uv_close((uv_handle_t *)&c->pb, relay_on_closed);
}

static void relay_on_retry(uv_timer_t *t);

/* The relays' cap is reached: reset the relay (not self) that has held
 * bytes without moving any for longest, if one has for NET_RELAY_STALL_MS;
 * 1 when one was. */
static int relay_reset_stalled(relay_conn *self) {
  uint64_t now = uv_now(net_loop);
  relay_conn *c;
  list_each(c, &conns, link) {
    if (now - c->active < NET_RELAY_STALL_MS) break; /* the rest moved later */
    if (c == self || !(c->up.held + c->down.held)) continue;
    relays_reset++;
    if (relays_reset % 100 == 1) /* (one line per 100: a flood of clients would flood the log) */
      LOG_INFO("relayed connection reset: the relays hold %zu bytes, their cap; it moved nothing for %llu ms "
             "(%llu reset so far)", relay_held, (unsigned long long)(now - c->active), relays_reset);
    struct linger lg = {1, 0}; /* RST: its bytes are dropped, both ends told */
    setsockopt(c->a, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    setsockopt(c->b, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    relay_close(c);
    return 1;
  }
  return 0;
}

/* Move what can move in one direction; -1 on an error (the caller closes). */
static int relay_pump(relay_dir *d) {
  for (int k = 0; k < NET_PUMP_ROUNDS; k++) {
    int moved = 0;
    if (d->held) {
      ssize_t n = splice(d->pr, NULL, d->dst, NULL, d->held, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        d->held -= (size_t)n;
        relay_held -= (size_t)n;
        budget_give((size_t)n);
        relay_touch(d->c);
        moved = 1;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return -1;
      }
    }
    if (!d->eof && !relay_starved(d) && d->held < NET_PIPE_CAP) {
      size_t room = NET_PIPE_CAP - d->held;
      if (relay_held + room > relay_cap()) relay_reset_stalled(d->c);
      if (relay_held + room > relay_cap() || budget_take(room) != 0) { /* no room: try again soon */
        list_insert_head(&starved, &d->slink);
        uv_timer_start(&retry_timer, relay_on_retry, NET_RETRY_MS, 0);
        break;
      }
      ssize_t n = splice(d->src, NULL, d->pw, NULL, room, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      budget_give(n > 0 ? room - (size_t)n : room);
      if (n > 0) {
        d->held += (size_t)n;
        relay_held += (size_t)n;
        relay_touch(d->c);
        moved = 1;
      } else if (n == 0) {
        d->eof = 1;
      } else if (errno != EAGAIN && errno != EINTR) {
        return -1;
      }
    }
    if (!moved) break;
  }
  if (d->eof && !d->held && !d->shut) { /* pass the half-close on */
    d->shut = 1;
    if (shutdown(d->dst, SHUT_WR) != 0 && errno != ENOTCONN) return -1;
  }
  return 0;
}

static void relay_on_poll(uv_poll_t *h, int status, int events);

/* Watch what each side needs: readable while its pipe has room, writable
 * while the pipe towards it holds bytes. */
static void relay_watch(relay_conn *c) {
  unsigned ea = 0, eb = 0;
  if (!c->up.eof && !relay_starved(&c->up) && c->up.held < NET_PIPE_CAP) ea |= UV_READABLE;
  if (!c->down.eof && !relay_starved(&c->down) && c->down.held < NET_PIPE_CAP) eb |= UV_READABLE;
  if (c->up.held) eb |= UV_WRITABLE;
  if (c->down.held) ea |= UV_WRITABLE;
  if (ea != c->ev_a) {
    if (ea) uv_poll_start(&c->pa, (int)ea, relay_on_poll);
    else uv_poll_stop(&c->pa);
    c->ev_a = ea;
  }
  if (eb != c->ev_b) {
    if (eb) uv_poll_start(&c->pb, (int)eb, relay_on_poll);
    else uv_poll_stop(&c->pb);
    c->ev_b = eb;
  }
}

static void relay_step(relay_conn *c) {
  if (relay_pump(&c->up) != 0 || relay_pump(&c->down) != 0) {
    relay_close(c);
    return;
  }
  if (c->up.shut && c->down.shut) {
    relay_close(c);
    return;
  }
  relay_watch(c);
}

static void relay_on_retry(uv_timer_t *t) {
  list_node batch = {0}; /* those starved so far; a step may starve them anew */
  list_splice_tail(&batch, &starved);
  relay_dir *d;
  while ((d = list_first_entry(&batch, relay_dir, slink))) {
    list_remove(&d->slink);
    relay_step(d->c); /* may close d->c: relay_close takes its other direction out of the batch */
  }
}

static void relay_on_poll(uv_poll_t *h, int status, int events) {
  relay_conn *c = h->data;
  if (c->closing) return;
  if (!c->connected) { /* the connect to the loopback listener finished */
    int err = 0;
    socklen_t len = sizeof err;
    if (status < 0 || getsockopt(c->b, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
      relay_close(c);
      return;
    }
    c->connected = 1;
    c->ev_b = UV_WRITABLE;
  } else if (status < 0) {
    relay_close(c);
    return;
  }
  relay_step(c);
}

static int relay_pipe(relay_dir *d) {
  int p[2];
  if (pipe2(p, O_NONBLOCK | O_CLOEXEC) != 0) return -1;
  d->pr = p[0];
  d->pw = p[1];
  fcntl(d->pw, F_SETPIPE_SZ, NET_PIPE_CAP);
  return 0;
}

static void relay_free_on_close(uv_handle_t *h) { free(h->data); }

/* c's sockets and pipes are set: watch its sockets (nothing started yet),
 * count it, list it.  0; -1 when a socket cannot be watched (then c is
 * the caller's to free); -2 when the second cannot (then c is freed once
 * the first one's handle closes).  Its descriptors stay the caller's. */
int relay_link(relay_conn *c) {
  c->up.src = c->down.dst = c->a;
  c->up.dst = c->down.src = c->b;
  if (uv_poll_init_socket(net_loop, &c->pa, c->a) != 0) return -1;
  c->pa.data = c;
  if (uv_poll_init_socket(net_loop, &c->pb, c->b) != 0) {
    uv_close((uv_handle_t *)&c->pa, relay_free_on_close);
    return -2;
  }
  c->pb.data = c;
  c->handles = 2;
  nconns++;
  c->active = uv_now(net_loop);
  list_insert_tail(&conns, &c->link);
  return 0;
}

/* A new client socket a for forwarder f: connect to the loopback listener. */
void net_forward_counts(unsigned *ports, uint64_t *nrelayed, uint64_t *nsteered) {
  unsigned n = 0;
  for (fwd *f = fwds; f; f = f->next) n += f->listening || f->steered;
  *ports = n;
  *nrelayed = relayed;
  *nsteered = net_steer_count();
}

static void relay_start(fwd *f, int a) {
  relayed++;
  relay_conn *c = nconns < NET_RELAY_MAX ? calloc(1, sizeof *c) : NULL;
  if (!c) { /* over the bound (or out of memory): closed at once */
    close(a);
    return;
  }
  c->a = a;
  c->b = c->up.pr = c->up.pw = c->down.pr = c->down.pw = -1;
  c->up = (relay_dir){.c = c, .pr = -1, .pw = -1};
  c->down = (relay_dir){.c = c, .pr = -1, .pw = -1};
  c->b = socket(f->target.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  /* the leg to the loopback listener never meets a network: reno (built
   * in, always allowed) rather than a pacing default such as bbr, whose
   * pacing made each relayed upload GiB cost the agent twice the CPU
   * (tests/bench/README.md, ports.sh); the client's leg keeps the
   * system's choice: it is the real network */
  if (c->b >= 0) setsockopt(c->b, IPPROTO_TCP, TCP_CONGESTION, "reno", 4);
  int linked = -1;
  if (c->b < 0 || relay_pipe(&c->up) != 0 || relay_pipe(&c->down) != 0 ||
      (connect(c->b, (struct sockaddr *)&f->target,
               f->target.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6)) != 0 &&
       errno != EINPROGRESS) ||
      (linked = relay_link(c)) != 0) {
    int fds[] = {c->a, c->b, c->up.pr, c->up.pw, c->down.pr, c->down.pw};
    for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
      if (fds[i] >= 0) close(fds[i]);
    if (linked != -2) free(c);
    return;
  }
  setsockopt(c->a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(c->b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  c->ev_b = UV_WRITABLE; /* the connect: nothing is read before it is done */
  uv_poll_start(&c->pb, UV_WRITABLE, relay_on_poll);
}

static void fwd_on_accept(uv_poll_t *h, int status, int events) {
  fwd *f = h->data;
  if (status < 0) return;
  for (int i = 0; i < NET_ACCEPTS; i++) {
    int a = accept4(f->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (a < 0) return; /* EAGAIN, or out of descriptors: the next wake-up tries again */
    relay_start(f, a);
  }
}

/* ---- forwarders ---- */

static void fwd_closed(uv_handle_t *h) {
  close(((fwd *)h->data)->fd);
  free(h->data);
  free(h);
}

/* Stop listening and free f (its connections go on). */
static void fwd_free(fwd *f) {
  if (f->steered) net_steer_clear(f->port);
  if (f->listening) LOG_INFO("port %u: forwarding stopped", f->port);
  if (f->lis) uv_close((uv_handle_t *)f->lis, fwd_closed);
  else free(f);
}

/* f listens on fd: watch it for connections (from the next loop turn;
 * start 0: once net_fwd_resume runs). */
int fwd_listen_on(fwd *f, int fd, uv_poll_t *p, int start) {
  if (uv_poll_init_socket(net_loop, p, fd) != 0) return -1;
  p->data = f;
  if (start) uv_poll_start(p, UV_READABLE, fwd_on_accept);
  f->fd = fd;
  f->lis = p;
  f->listening = 1;
  f->failed_logged = 0;
  return 0;
}

/* A new forwarder of port (not listening yet), first in fwds; NULL when out of memory. */
fwd *fwd_new(uint16_t port) {
  fwd *f = calloc(1, sizeof *f);
  if (!f) return NULL;
  f->port = port;
  f->fd = -1;
  if (fwd_sa.ss_family == AF_INET6) snprintf(f->to, sizeof f->to, "[%s]:%u", fwd_addr, f->port);
  else snprintf(f->to, sizeof f->to, "%s:%u", fwd_addr, f->port);
  f->next = fwds;
  fwds = f;
  return f;
}

/* f relays to the loopback listener at raw (family), port f->port. */
void fwd_target(fwd *f, int family, const uint8_t *raw) {
  memset(&f->target, 0, sizeof f->target);
  if (family == AF_INET) {
    struct sockaddr_in *s = (struct sockaddr_in *)&f->target;
    s->sin_family = AF_INET;
    s->sin_port = htons(f->port);
    memcpy(&s->sin_addr, raw, 4);
  } else {
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)&f->target;
    s->sin6_family = AF_INET6;
    s->sin6_port = htons(f->port);
    memcpy(&s->sin6_addr, raw, 16);
  }
}

/* Bind and listen; a failure is logged once and tried again next sync. */
static void fwd_start(fwd *f) {
  struct sockaddr_storage sa = fwd_sa;
  socklen_t len = sizeof(struct sockaddr_in);
  if (sa.ss_family == AF_INET) ((struct sockaddr_in *)&sa)->sin_port = htons(f->port);
  else {
    ((struct sockaddr_in6 *)&sa)->sin6_port = htons(f->port);
    len = sizeof(struct sockaddr_in6);
  }
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), one = 1;
  const char *step = "socket";
  if (fd >= 0) {
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one); /* a restarted agent rebinds at once */
    if (sa.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    step = bind(fd, (struct sockaddr *)&sa, len) != 0 ? "bind" : listen(fd, 511) != 0 ? "listen" : NULL;
  }
  uv_poll_t *p = step ? NULL : malloc(sizeof *p);
  if (p && fwd_listen_on(f, fd, p, 1) != 0) {
    free(p);
    p = NULL;
    step = "watch";
  }
  if (!p) {
    if (!f->failed_logged)
      LOG_WARN("port %u: cannot forward to %s: %s: %s (retried)", f->port, f->to, step ? step : "malloc",
               strerror(errno));
    f->failed_logged = 1;
    if (fd >= 0) close(fd);
    return;
  }
  LOG_INFO("port %u: forwarded to %s", f->port, f->to);
}

/* Close the relays that moved nothing for idle_ms. */
static void relay_on_idle(uv_timer_t *t) {
  uint64_t now = uv_now(net_loop);
  relay_conn *c, *nx;
  size_t n = 0;
  list_each_safe(c, nx, &conns, link) {
    if (now - c->active < idle_ms) break; /* the rest moved later */
    relay_close(c);
    n++;
  }
  if (n) LOG_INFO("%zu relayed connections closed: nothing moved for %llu ms", n, (unsigned long long)idle_ms);
}

/* The budget's retry timer and the idle check, made once the loop is known. */
static void relay_retry_init(void) {
  if (retry_init || !net_loop) return;
  uv_timer_init(net_loop, &retry_timer);
  uv_unref((uv_handle_t *)&retry_timer);
  const char *v = getenv("CONCH_RELAY_IDLE_MS");
  idle_ms = v && atoll(v) > 0 ? (uint64_t)atoll(v) : NET_RELAY_IDLE_MS;
  uint64_t every = idle_ms / 10 < 100 ? 100 : idle_ms / 10 > 10000 ? 10000 : idle_ms / 10;
  uv_timer_init(net_loop, &idle_timer);
  uv_unref((uv_handle_t *)&idle_timer);
  uv_timer_start(&idle_timer, relay_on_idle, every, every);
  retry_init = 1;
}

/* 1 when connections can be steered (steer.c), starting it the first time. */
static int steer_ready(void) {
  if (steer_state) return steer_state > 0;
  const char *v = getenv("CONCH_FORWARD_STEER");
  if (v && strcmp(v, "0") == 0) {
    LOG_INFO("forwarded connections are relayed (CONCH_FORWARD_STEER=0)");
    steer_state = -1;
    return 0;
  }
  int r = net_steer_start(&fwd_sa);
  if (r != 0) LOG_INFO("forwarded connections are relayed: the kernel cannot steer them (sk_lookup): %s", strerror(-r));
  else LOG_INFO("forwarded connections are handed to their listeners by the kernel (sk_lookup)");
  steer_state = r == 0 ? 1 : -1;
  return r == 0;
}

/* Connections to f's port go straight to w's listener when it can be
 * taken; otherwise (or until then) f relays them.  Runs inside the scan's
 * completion (net_scan_done), never while a scan walks /proc: the copy of
 * the listener net_steer_set holds for a moment would otherwise make it
 * look like one of ours.  A descriptor that is no longer the listener
 * (its holder exited, closed or moved it) asks for the owner to be looked
 * up again, once per listener; anything else is final for that listener. */
static void fwd_steer(fwd *f, net_fwd_want *w) {
  if (!w->inode || f->steered == w->inode || f->steer_fail == w->inode || !steer_ready()) return;
  int r = w->pid > 0 ? net_steer_set(f->port, w->family, w->pid, w->fd, w->inode) : -ESRCH;
  if (r == 0) {
    f->steered = w->inode;
    LOG_INFO("port %u: connections to %s handed to the listener of pid %d", f->port, f->to, (int)w->pid);
    return;
  }
  if (f->steered) net_steer_clear(f->port); /* a listener replaced by one we cannot take */
  f->steered = 0;
  int stale = w->pid > 0 && (r == -ESRCH || r == -EBADF || r == -ESTALE);
  if (stale && f->relooked != w->inode) {
    f->relooked = w->inode;
    w->relook = 1;
    return;
  }
  f->steer_fail = w->inode;
  LOG_INFO("port %u: connections to %s relayed: the listener cannot be steered to: %s", f->port, f->to,
           w->pid > 0 ? strerror(-r) : "no process holding it is visible");
}

void net_fwd_sync(net_fwd_want *want, size_t n) {
  relay_retry_init();
  for (fwd **p = &fwds; *p;) { /* stop what is no longer wanted */
    fwd *f = *p;
    int keep = 0;
    for (size_t i = 0; i < n && !keep; i++) keep = want[i].port == f->port;
    if (keep) {
      p = &f->next;
      continue;
    }
    *p = f->next;
    fwd_free(f);
  }
  for (size_t i = 0; fwd_addr && i < n; i++) {
    if (want[i].port == 4064 || want[i].port == 4065) continue; /* the agent's own ports */
    fwd *f = fwds;
    while (f && f->port != want[i].port) f = f->next;
    if (!f && !(f = fwd_new(want[i].port))) return;
    fwd_target(f, want[i].family, want[i].raw);
    if (!f->listening) fwd_start(f);
    if (f->listening) fwd_steer(f, &want[i]); /* never a port the forwarder does not hold */
  }
}

void net_fwd_resume(void) {
  relay_retry_init();
  for (fwd *f = fwds; f; f = f->next)
    if (f->lis && !uv_is_active((uv_handle_t *)f->lis)) uv_poll_start(f->lis, UV_READABLE, fwd_on_accept);
  relay_conn *c, *nx;
  list_each_safe(c, nx, &conns, link) {
    if (c->cut_at_resume) {
      LOG_WARN("upgrade: a relayed connection cut: its pipes do not fit the memory budget");
      relay_close(c);
    } else if (!c->connected) { /* its connect goes on */
      c->ev_b = UV_WRITABLE;
      uv_poll_start(&c->pb, UV_WRITABLE, relay_on_poll);
    } else {
      relay_step(c);
    }
  }
}
