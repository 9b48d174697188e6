/* net/ports — NetworkService: the port table, ListPorts and WatchPorts
 * (api.md §9 "Ports").
 *
 * One scan job at a time (scan.c, in the pool).  The table is rebuilt from
 * each scan and compared with the previous one: what left is `closed`, what
 * came is `opened`, to every stream; a port whose forwarding changed while
 * it listens is `closed` as it was listed and `opened` as it is now.  Scans run every NET_SCAN_MS while a
 * WatchPorts stream is open or forwarding is on, and once per batch of
 * ListPorts calls otherwise; nobody watching and forwarding off → no timer
 * and no job.  A stream that joins gets `start` and the whole table from
 * the first scan that completes after it came, so it never sees a stale
 * table.  Its events wait in a FIFO of at most NET_WATCH_QMAX while the
 * transport has no room: past it the stream ends resource_exhausted.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/list.h"
#include "core/log.h"
#include "net/net.h"
#include "net/service.h"
#include "proto/agent.pb-c.h"

#define NET_WATCH_QMAX 1024
#define NET_OUTQ_MAX (64u * 1024) /* unsent bytes of a stream before asking for room */
#define NET_KEEPALIVE_MS 30000

typedef struct net_port {
  net_sock s;
  int32_t pid, command_pid;
  char *tag;
  char fwd[NET_ADDR_MAX + 8]; /* forwarded_to as listed ("" when not forwarded) */
} net_port;

typedef struct net_ev {
  struct net_ev *next;
  int kind; /* PB__PORT_EVENT__EVENT_* */
  net_port p;
} net_ev;

typedef struct net_watch {
  list_node link; /* in N.watches, newest first */
  rpc_call *call;
  int joined;  /* has had start and the table */
  int drain_armed;
  net_ev *head, *tail;
  size_t qlen;
  uint64_t last_send;
} net_watch;

typedef struct net_list {
  struct net_list *next;
  rpc_call *call;
} net_list;

uv_loop_t *net_loop;
static struct {
  uv_timer_t timer;
  int timer_on;
  net_scan scan;
  int busy;        /* the scan job is out */
  net_port *ports; /* the table, sorted by port, address, inode */
  size_t nports;
  list_node watches;
  net_list *in_job, *queued; /* ListPorts answered by the running job / the next one */
  net_owner_fn lookup;
  uint64_t keepalive_ms;
  int failed_logged;
  int in_done; /* inside net_scan_done: a stream ending there must not drop the table */
} N;

void net_set_owner_lookup(net_owner_fn fn) { N.lookup = fn; }

static int net_port_cmp(const void *a, const void *b) {
  const net_port *x = a, *y = b;
  if (x->s.port != y->s.port) return x->s.port < y->s.port ? -1 : 1;
  int c = strcmp(x->s.addr, y->s.addr);
  if (c) return c;
  return x->s.inode < y->s.inode ? -1 : x->s.inode > y->s.inode;
}

static int net_is_loopback(const net_sock *s) {
  return s->family == AF_INET ? s->raw[0] == 127 : memcmp(s->raw, &in6addr_loopback, 16) == 0;
}

static void net_fill(Pb__ListeningPort *lp, const net_port *p) {
  lp->address = (char *)p->s.addr;
  lp->port = p->s.port;
  lp->pid = p->pid;
  lp->tag = p->tag ? p->tag : "";
  lp->command_pid = p->command_pid;
  lp->forwarded_to = (char *)p->fwd;
}

/* ---- WatchPorts ---- */

static void net_watch_free(net_watch *w) {
  for (net_ev *e = w->head, *n; e; e = n) {
    n = e->next;
    free(e->p.tag);
    free(e);
  }
  list_remove(&w->link);
  free(w);
}

static void net_sched(void);

static void net_watch_end(net_watch *w, rpc_code code, const char *msg) {
  rpc_call *c = w->call;
  rpc_set_user(c, NULL);
  net_watch_free(w);
  rpc_finish(c, code, msg);
  net_sched();
}

static void net_watch_flush(net_watch *w);

static void net_watch_on_drain(rpc_call *c) {
  net_watch *w = rpc_user(c);
  if (!w) return;
  w->drain_armed = 0;
  net_watch_flush(w);
}

/* Send queued events while the transport keeps up; 0, or -1 when w ended. */
static int net_send(net_watch *w, Pb__PortEvent *ev) {
  if (rpc_send(w->call, &ev->base) != 0) {
    net_watch_end(w, RPC_RESOURCE_EXHAUSTED, "out of memory sending port event");
    return -1;
  }
  w->last_send = uv_now(net_loop);
  return 0;
}

static void net_watch_flush(net_watch *w) {
  while (w->head && !w->drain_armed) {
    if ((rpc_outq_bytes(w->call) > NET_OUTQ_MAX || budget_over()) &&
        !rpc_out_room(w->call, NET_OUTQ_MAX, net_watch_on_drain)) {
      w->drain_armed = 1;
      return;
    }
    net_ev *e = w->head;
    Pb__PortEvent ev = PB__PORT_EVENT__INIT;
    Pb__ListeningPort lp = PB__LISTENING_PORT__INIT;
    Pb__WatchPortsStart st = PB__WATCH_PORTS_START__INIT;
    Pb__WatchPortsKeepAlive ka = PB__WATCH_PORTS_KEEP_ALIVE__INIT;
    ev.event_case = e->kind;
    if (e->kind == PB__PORT_EVENT__EVENT_START) ev.start = &st;
    else if (e->kind == PB__PORT_EVENT__EVENT_KEEPALIVE) ev.keepalive = &ka;
    else {
      net_fill(&lp, &e->p);
      if (e->kind == PB__PORT_EVENT__EVENT_OPENED) ev.opened = &lp;
      else ev.closed = &lp;
    }
    w->head = e->next;
    if (!w->head) w->tail = NULL;
    w->qlen--;
    int r = net_send(w, &ev);
    free(e->p.tag);
    free(e);
    if (r) return;
  }
}

/* Queue an event for w; 0, or -1 when w ended (the queue was full). */
static int net_watch_push(net_watch *w, int kind, const net_port *p) {
  if (w->qlen >= NET_WATCH_QMAX) {
    net_watch_end(w, RPC_RESOURCE_EXHAUSTED, "port events are not being read");
    return -1;
  }
  net_ev *e = calloc(1, sizeof *e);
  if (e && p) {
    e->p = *p;
    e->p.tag = p->tag ? strdup(p->tag) : NULL;
  }
  if (!e || (p && p->tag && !e->p.tag)) {
    if (e) free(e);
    net_watch_end(w, RPC_RESOURCE_EXHAUSTED, "out of memory queueing port event");
    return -1;
  }
  e->kind = kind;
  if (w->tail) w->tail->next = e;
  else w->head = e;
  w->tail = e;
  w->qlen++;
  return 0;
}

static void net_watch_on_request(rpc_call *c, const ProtobufCMessage *req) {
  net_watch *w = calloc(1, sizeof *w);
  if (!w) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->call = c;
  w->last_send = uv_now(net_loop);
  list_insert_head(&N.watches, &w->link);
  rpc_set_user(c, w);
  net_sched();
}

static void net_watch_on_cancel(rpc_call *c, rpc_code why) {
  net_watch *w = rpc_user(c);
  if (!w) return;
  rpc_set_user(c, NULL);
  net_watch_free(w);
  net_sched();
}

/* ---- ListPorts ---- */

static void net_list_answer(rpc_call *c) {
  Pb__ListPortsResponse resp = PB__LIST_PORTS_RESPONSE__INIT;
  Pb__ListeningPort *lps = calloc(N.nports + 1, sizeof *lps);
  Pb__ListeningPort **pp = calloc(N.nports + 1, sizeof *pp);
  if (!lps || !pp) {
    free(lps);
    free(pp);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  for (size_t i = 0; i < N.nports; i++) {
    pb__listening_port__init(&lps[i]);
    net_fill(&lps[i], &N.ports[i]);
    pp[i] = &lps[i];
  }
  resp.n_ports = N.nports;
  resp.ports = pp;
  int r = rpc_send(c, &resp.base);
  free(lps);
  free(pp);
  if (r != 0) rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
  else rpc_finish(c, RPC_OK, NULL);
}

static void net_list_on_request(rpc_call *c, const ProtobufCMessage *req) {
  net_list *l = calloc(1, sizeof *l);
  if (!l) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  l->call = c;
  l->next = N.queued;
  N.queued = l;
  rpc_set_user(c, l);
  net_sched();
}

static void net_list_on_cancel(rpc_call *c, rpc_code why) {
  net_list *l = rpc_user(c);
  if (l) l->call = NULL; /* freed when its scan is done */
}

/* ---- scans ---- */

static void net_scan_work(void *data) { net_scan_run(data); }
static void net_scan_done(void *data, int canceled);

static void net_on_timer(uv_timer_t *t) { net_sched(); }

/* Start a scan when one is wanted and none runs; keep the timer while
 * someone watches or forwards. */
static void net_sched(void) {
  if (!net_loop) return; /* the service is not registered (unit tests of init/) */
  int live = !list_empty(&N.watches) || net_fwd_addr();
  if (live && !N.timer_on) {
    uv_timer_start(&N.timer, net_on_timer, NET_SCAN_MS, NET_SCAN_MS);
    N.timer_on = 1;
  } else if (!live && N.timer_on) {
    uv_timer_stop(&N.timer);
    N.timer_on = 0;
  }
  if (N.in_done) return; /* net_scan_done calls again when it is through */
  if (!live && N.nports && !N.busy && !N.queued) { /* nobody needs the table: it goes stale */
    for (size_t i = 0; i < N.nports; i++) free(N.ports[i].tag);
    free(N.ports);
    N.ports = NULL;
    N.nports = 0;
  }
  /* keepalives: from the timer, so no stream needs a timer of its own */
  uint64_t now = uv_now(net_loop);
  net_watch *w, *n;
  list_each_safe(w, n, &N.watches, link) {
    if (N.keepalive_ms && w->joined && !w->head && now - w->last_send >= N.keepalive_ms) {
      if (net_watch_push(w, PB__PORT_EVENT__EVENT_KEEPALIVE, NULL) == 0) net_watch_flush(w);
    }
  }
  if (N.busy) return;
  int want = N.queued != NULL;
  if (!want && live) want = 1;
  if (!want) return;
  N.in_job = N.queued;
  N.queued = NULL;
  N.busy = 1;
  if (!rpc_work_submit(NULL, net_scan_work, net_scan_done, &N.scan)) net_scan_done(&N.scan, 1);
}

/* The new table from the scan, its owners' commands looked up (new ones only). */
static net_port *net_build(size_t *np) {
  net_port *v = calloc(N.scan.nsocks + 1, sizeof *v);
  if (!v) return NULL;
  size_t n = 0;
  for (size_t i = 0; i < N.scan.nsocks; i++) {
    const net_sock *s = &N.scan.socks[i];
    const net_owner *o = net_owner_find(&N.scan, s->inode);
    if (o && o->own) continue;
    net_port *p = &v[n++];
    p->s = *s;
    p->pid = o ? o->pid : 0;
  }
  qsort(v, n, sizeof *v, net_port_cmp);
  /* tags: carried over from the old table for the same socket, else asked */
  size_t j = 0;
  for (size_t i = 0; i < n; i++) {
    net_port *p = &v[i];
    while (j < N.nports && net_port_cmp(&N.ports[j], p) < 0) j++;
    if (j < N.nports && net_port_cmp(&N.ports[j], p) == 0) {
      p->tag = N.ports[j].tag;
      N.ports[j].tag = NULL;
      p->command_pid = N.ports[j].command_pid;
      continue;
    }
    const net_owner *o = net_owner_find(&N.scan, p->s.inode);
    const char *tag = NULL;
    int32_t cp = 0;
    if (o && o->pid && N.lookup && N.lookup(o->cgroup, o->pgid, &tag, &cp)) {
      p->tag = tag && *tag ? strdup(tag) : NULL;
      p->command_pid = cp;
    }
  }
  *np = n;
  return v;
}

static void net_emit(int kind, const net_port *p) {
  net_watch *w, *n;
  list_each_safe(w, n, &N.watches, link) {
    if (w->joined && net_watch_push(w, kind, p) == 0) net_watch_flush(w);
  }
}

static void net_scan_done(void *data, int canceled) {
  N.busy = 0;
  N.in_done = 1;
  if (canceled) N.scan.err = ENOMEM;
  if (N.scan.err && !N.failed_logged) {
    LOG_WARN("port scan failed: %s", strerror(N.scan.err));
    N.failed_logged = 1;
  }
  LOG_DEBUG("port scan listeners=%zu owners=%zu fd_dirs_read=%zu", N.scan.nsocks, N.scan.nowners,
            N.scan.walked);
  size_t n = 0;
  net_port *v = N.scan.err ? NULL : net_build(&n);
  if (v) {
    /* forwarders first, so that `opened` says where a port is forwarded */
    net_fwd_want *want = calloc(n + 1, sizeof *want);
    size_t nw = 0;
    for (size_t i = 0; want && net_fwd_addr() && i < n; i++) {
      const net_sock *s = &v[i].s;
      if (!net_is_loopback(s)) continue;
      if (nw && want[nw - 1].port == s->port) {
        /* two loopback listeners at one port: the one of the outward
         * address's family, which a connection can be steered to */
        if (want[nw - 1].family == net_fwd_family() || s->family != net_fwd_family()) continue;
        nw--;
      } else {
        int covered = 0; /* something listens on the outward address at this port already */
        for (size_t k = 0; k < n && !covered; k++)
          covered = v[k].s.port == s->port && !net_is_loopback(&v[k].s) && net_fwd_covers(v[k].s.family, v[k].s.raw);
        if (covered) continue;
      }
      memset(&want[nw], 0, sizeof want[nw]);
      want[nw].port = s->port;
      want[nw].family = s->family;
      memcpy(want[nw].raw, s->raw, 16);
      const net_owner *o = net_owner_find(&N.scan, s->inode);
      want[nw].inode = s->inode;
      want[nw].pid = o ? o->pid : 0;
      want[nw].fd = o && o->pid ? o->fd : -1;
      nw++;
    }
    if (want) net_fwd_sync(want, nw);
    for (size_t k = 0; want && k < nw; k++)
      if (want[k].relook) net_owner_forget(&N.scan, want[k].inode); /* the next scan walks /proc for it */
    free(want);
    for (size_t k = 0; k < n; k++) { /* where each port is forwarded now */
      const char *f = net_is_loopback(&v[k].s) ? net_fwd_to(v[k].s.port) : NULL;
      snprintf(v[k].fwd, sizeof v[k].fwd, "%s", f ? f : "");
    }
    /* what left is `closed`, what came `opened`; a port still listening
     * whose forwarding changed (a forwarder bound on a retry, stopped, or
     * forwarding turned on, off or moved) is `closed` as it was listed,
     * then `opened` as it is now */
    size_t i = 0, j = 0;
    while (i < N.nports || j < n) {
      int c = i == N.nports ? 1 : j == n ? -1 : net_port_cmp(&N.ports[i], &v[j]);
      if (c < 0) net_emit(PB__PORT_EVENT__EVENT_CLOSED, &N.ports[i++]);
      else if (c > 0) net_emit(PB__PORT_EVENT__EVENT_OPENED, &v[j++]);
      else {
        if (strcmp(N.ports[i].fwd, v[j].fwd) != 0) {
          net_port was = v[j]; /* the same socket (its tag moved to v[j] in net_build) */
          memcpy(was.fwd, N.ports[i].fwd, sizeof was.fwd);
          net_emit(PB__PORT_EVENT__EVENT_CLOSED, &was);
          net_emit(PB__PORT_EVENT__EVENT_OPENED, &v[j]);
        }
        i++, j++;
      }
    }
    for (i = 0; i < N.nports; i++) free(N.ports[i].tag);
    free(N.ports);
    N.ports = v;
    N.nports = n;
  }
  net_watch *w, *wn;
  list_each_safe(w, wn, &N.watches, link) {
    if (w->joined) continue;
    w->joined = 1;
    if (net_watch_push(w, PB__PORT_EVENT__EVENT_START, NULL)) continue;
    int gone = 0;
    for (size_t i = 0; i < N.nports && !gone; i++)
      gone = net_watch_push(w, PB__PORT_EVENT__EVENT_OPENED, &N.ports[i]) != 0;
    if (!gone) net_watch_flush(w);
  }
  for (net_list *l = N.in_job, *nx; l; l = nx) {
    nx = l->next;
    if (l->call) {
      rpc_set_user(l->call, NULL);
      if (N.scan.err) rpc_finishf(l->call, RPC_INTERNAL, "list ports: %s", strerror(N.scan.err));
      else net_list_answer(l->call);
    }
    free(l);
  }
  N.in_job = NULL;
  N.in_done = 0;
  if (N.queued || (list_empty(&N.watches) && !net_fwd_addr())) net_sched(); /* the next batch, or drop the table */
}

int net_forward_set(const char *addr) {
  if (net_fwd_config(addr) != 0) return -1;
  net_sched(); /* forwarding on: scans run from now on */
  return 0;
}

const char *net_forward_get(void) { return net_fwd_addr(); }

void net_handover_resume(void) {
  net_fwd_resume();
  if (net_fwd_addr()) net_sched(); /* forwarding on: scans run */
}

static const rpc_method net_methods[] = {
    {
        .path = "/pb.NetworkService/ListPorts",
        .kind = RPC_UNARY,
        .input = &pb__list_ports_request__descriptor,
        .output = &pb__list_ports_response__descriptor,
        .on_request = net_list_on_request,
        .on_cancel = net_list_on_cancel,
    },
    {
        .path = "/pb.NetworkService/WatchPorts",
        .kind = RPC_SERVER_STREAM,
        .input = &pb__watch_ports_request__descriptor,
        .output = &pb__port_event__descriptor,
        .on_request = net_watch_on_request,
        .on_cancel = net_watch_on_cancel,
        .flags = RPC_F_DRAIN_END,
    },
};

const rpc_method *net_service_methods(uv_loop_t *loop, size_t *n) {
  net_loop = loop;
  uv_timer_init(loop, &N.timer);
  uv_unref((uv_handle_t *)&N.timer);
  N.keepalive_ms = NET_KEEPALIVE_MS;
  const char *v = getenv("CONCH_NET_WATCH_KEEPALIVE_MS");
  if (v && atol(v) >= 0) N.keepalive_ms = (uint64_t)atol(v);
  *n = sizeof net_methods / sizeof *net_methods;
  return net_methods;
}
