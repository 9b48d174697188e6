/* initproto — the init protocol server; see initproto.h.
 *
 * Everything runs on conch.loop.  The only blocking work (rtnetlink and
 * the resolv.conf write) runs in the thread pool on a copy of the
 * validated message; the ready-file check is an async uv_fs_stat.  The
 * module's state is conch.initproto (the daemon context), allocated on
 * first use.
 */
#include "init/initproto.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h> /* before vm_sockets.h: older uapi headers (arm64 cross) need it */
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "server/rpc.h"
#include "core/senv.h"
#include "server/tokhold.h"
#include "server/users.h"
#include "proto/handover.pb-c.h"
#include "init/initmsg.h"
#include "init/restore.h"
#include "init/network.h"
#include "net/service.h"
#include "proc/cgroup.h"

#define IP_RECV_TIMEOUT_MS 2000
#define IP_SEND_TIMEOUT_MS 2000
#define IP_READY_WAIT_MS 1500
#define IP_READY_POLL_MS 10
#define IP_MAX_LISTENERS 4
#define IP_ACCEPT_BACKOFF_MS 100

typedef enum conn_phase { PH_HEADER, PH_BODY, PH_WORK, PH_WAIT, PH_SEND, PH_CLOSED } conn_phase;

typedef struct ip_conn {
  int fd;
  uv_poll_t poll;
  uv_timer_t timer;
  conn_phase phase;
  uint8_t hdr[4];
  size_t got;
  uint32_t len;
  char *body;
  char *resp;
  size_t resp_len, sent;
  /* thread-pool work (rpc_work_submit): apply or revalidate the network */
  int work_pending;
  int work_revalidate;
  network_cfg cfg;
  char *work_result;
  initmsg_plan plan;
  uint64_t t_recv; /* uv_hrtime() when the frame was complete: ages timestampMs */
  /* readiness wait */
  uint64_t deadline;
  uv_fs_t fsreq;
  int fs_pending;
  int handles_open;
} ip_conn;

typedef struct ip_listener {
  int fd;
  uv_poll_t poll; /* poll.data = this listener */
  int polling;
  char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
} ip_listener;

struct initproto {
  initproto_opts opts;
  char resolv_path[256];
  char ready_path[256];
  initproto_state state;
  char *terminal;            /* the sticky response body */
  size_t terminal_len;
  int first_done;
  int sigusr1;
  char *sandbox_id;
  ip_listener *lst[IP_MAX_LISTENERS]; /* malloc'd: freed by their close callback */
  size_t nlst;
  ip_conn *active;
  uv_timer_t *backoff;                /* malloc'd on first use */
  int frozen;                         /* an upgrade is draining: accept nothing */
};

/* The module's state lives in the daemon context (conch.initproto),
 * allocated on first use; `ips` names it here. */
static struct initproto *initproto_self(void) {
  if (!conch.initproto) {
    conch.initproto = daemon_alloc_state(sizeof *conch.initproto, "initproto");
    conch.initproto->state = INITPROTO_AWAITING_NETWORK;
  }
  return conch.initproto;
}
#define ips (*initproto_self())

static void listeners_resume(void);
static void conn_finish(ip_conn *c);

void initproto_configure(const initproto_opts *o) {
  ips.opts = *o;
  initmsg_set_mem_total(proc_cg_mem_total()); /* workloadMemoryMaxBytes ≤ MemTotal */
  snprintf(ips.resolv_path, sizeof ips.resolv_path, "%s", o->resolv_path ? o->resolv_path : "/etc/resolv.conf");
  snprintf(ips.ready_path, sizeof ips.ready_path, "%s",
           o->services_ready_path ? o->services_ready_path : "/run/conch/services-ready");
  ips.opts.resolv_path = ips.resolv_path;
  ips.opts.services_ready_path = ips.ready_path;
}

void initproto_services_ready(void) {
  if (!ips.sigusr1) LOG_INFO("rootfs services reported ready (SIGUSR1)");
  ips.sigusr1 = 1;
}

const char *initproto_sandbox_id(void) { return ips.sandbox_id; }
initproto_state initproto_get_state(void) { return ips.state; }

/* ------------------------------------------------------------ connection */

static void conn_handle_closed(uv_handle_t *h) {
  ip_conn *c = h->data;
  if (--c->handles_open > 0) return;
  if (c->work_pending || c->fs_pending) return; /* freed by their callbacks */
  free(c->body);
  free(c->resp);
  free(c->work_result);
  initmsg_plan_free(&c->plan);
  free(c);
}

static void conn_maybe_free(ip_conn *c) {
  if (c->phase == PH_CLOSED && c->handles_open == 0 && !c->work_pending && !c->fs_pending) {
    free(c->body);
    free(c->resp);
    free(c->work_result);
    initmsg_plan_free(&c->plan);
    free(c);
  }
}

/* Close the connection (with or without having answered) and let the next
 * one in. */
static void conn_finish(ip_conn *c) {
  if (c->phase == PH_CLOSED) return;
  c->phase = PH_CLOSED;
  uv_close((uv_handle_t *)&c->poll, conn_handle_closed); /* stops polling the fd first */
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
  close(c->fd);
  c->fd = -1;
  if (ips.active == c) ips.active = NULL;
  listeners_resume();
}

static void conn_reject(ip_conn *c, const char *why) {
  LOG_WARN("init message rejected without response: %s", why);
  conn_finish(c);
}

static void conn_on_io(uv_poll_t *p, int status, int events);

static void conn_send_timeout(uv_timer_t *t) {
  ip_conn *c = t->data;
  LOG_WARN("init response not sent: send timeout after %d ms", IP_SEND_TIMEOUT_MS);
  conn_finish(c);
}

static void conn_try_send(ip_conn *c) {
  while (c->sent < c->resp_len) {
    ssize_t w = send(c->fd, c->resp + c->sent, c->resp_len - c->sent, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        uv_poll_start(&c->poll, UV_WRITABLE, conn_on_io);
        return;
      }
      LOG_WARN("init response not sent: %s", strerror(errno));
      conn_finish(c);
      return;
    }
    c->sent += (size_t)w;
  }
  conn_finish(c);
}

/* Queue the response: 4-byte length + body. */
static void conn_respond(ip_conn *c, const char *body, size_t len) {
  c->resp = malloc(len + 4);
  if (!c->resp) {
    LOG_ERROR("init response not sent: out of memory");
    conn_finish(c);
    return;
  }
  c->resp[0] = (char)(len >> 24);
  c->resp[1] = (char)(len >> 16);
  c->resp[2] = (char)(len >> 8);
  c->resp[3] = (char)len;
  memcpy(c->resp + 4, body, len);
  c->resp_len = len + 4;
  c->sent = 0;
  c->phase = PH_SEND;
  uv_timer_stop(&c->timer);
  uv_timer_start(&c->timer, conn_send_timeout, IP_SEND_TIMEOUT_MS, 0);
  conn_try_send(c);
}

static void respond_simple(ip_conn *c, int ready, int retryable, const char *msg) {
  size_t len;
  char *body = initmsg_response(ready, retryable, msg, &len);
  if (!body) {
    LOG_ERROR("init response not sent: out of memory");
    conn_finish(c);
    return;
  }
  conn_respond(c, body, len);
  free(body);
}

/* Enter the sticky terminal state with this reason and answer it. */
static void go_terminal(ip_conn *c, const char *reason) {
  LOG_ERROR("init message failed (terminal): %s", reason);
  free(ips.terminal);
  ips.terminal = initmsg_response(0, 0, reason, &ips.terminal_len);
  ips.state = INITPROTO_TERMINAL;
  if (!ips.terminal) {
    LOG_ERROR("init response not sent: out of memory");
    conn_finish(c);
    return;
  }
  conn_respond(c, ips.terminal, ips.terminal_len);
}

/* ---------------------------------------------------------- readiness */

static int ready_now(int file_exists) {
  if (!conch.api_serving || ips.opts.merge_missing) return 0;
  if (!ips.opts.services_required) return 1;
  return ips.sigusr1 || file_exists;
}

static int needs_file_check(void) {
  return conch.api_serving && !ips.opts.merge_missing && ips.opts.services_required && !ips.sigusr1;
}

static void wait_decide(ip_conn *c, int file_exists);

static void wait_fs_cb(uv_fs_t *req) {
  ip_conn *c = req->data;
  int exists = req->result == 0;
  uv_fs_req_cleanup(req);
  c->fs_pending = 0;
  if (c->phase != PH_WAIT) {
    conn_maybe_free(c);
    return;
  }
  wait_decide(c, exists);
}

static void wait_tick(uv_timer_t *t);

/* Ready → answer ready; deadline passed → not_ready; else keep polling. */
static void wait_decide(ip_conn *c, int file_exists) {
  if (ready_now(file_exists)) {
    if (ips.state != INITPROTO_READY) {
      LOG_INFO("sandbox ready");
      if (ips.opts.pid1_logs) log_set_console_level(ips.opts.console_level); /* the boot stayed fully logged */
    }
    ips.state = INITPROTO_READY;
    uv_timer_stop(&c->timer);
    respond_simple(c, 1, 0, NULL);
    return;
  }
  if (uv_now(conch.loop) >= c->deadline) {
    uv_timer_stop(&c->timer);
    respond_simple(c, 0, 1, "sandbox services are not ready");
    return;
  }
  if (!uv_is_active((uv_handle_t *)&c->timer))
    uv_timer_start(&c->timer, wait_tick, IP_READY_POLL_MS, IP_READY_POLL_MS);
}

static void wait_check(ip_conn *c) {
  if (c->fs_pending) return; /* a stat is in flight; its callback decides */
  if (needs_file_check()) {
    c->fsreq.data = c;
    if (uv_fs_stat(conch.loop, &c->fsreq, ips.ready_path, wait_fs_cb) == 0) {
      c->fs_pending = 1;
      return;
    }
  }
  wait_decide(c, 0);
}

static void wait_tick(uv_timer_t *t) { wait_check(t->data); }

static void wait_start(ip_conn *c) {
  c->phase = PH_WAIT;
  c->deadline = uv_now(conch.loop) + IP_READY_WAIT_MS;
  wait_check(c);
}

/* ------------------------------------------------------------ applying */

/* -1 out of memory, else 1 when the token changed, 0 when it is the same. */
static int apply_identity(const initmsg_plan *p) {
  for (size_t i = 0; i < p->nenv; i++)
    if (senv_set(p->env_k[i], p->env_v[i]) != 0) return -1;
  char *sid = strdup(p->sandbox_id);
  if (!sid) return -1;
  free(ips.sandbox_id);
  ips.sandbox_id = sid;
  snprintf(conch.sandbox_id, sizeof conch.sandbox_id, "%s", sid);
  /* a replaced token ends what the previous one opened (api.md §4: a clone
   * restored from a checkpoint serves nothing to its origin's clients) */
  if (!daemon_set_token(p->token, p->token_len)) return 0;
  tokhold_revoke_stale();
  return 1;
}

/* boot.md §13: defaultUser resolved in the sandbox root's files, after the
 * workload keys (the pool: the files are read here). */
static void work_user(ip_conn *c) {
  const char *u = c->plan.default_user;
  if (c->work_result || !u) return;
  const rpc_ident *id = NULL;
  users_status st = users_resolve_now(u, &id);
  if (st != USERS_OK) {
    c->work_result = strdup(st == USERS_ERROR ? "cannot read the user database" : "invalid defaultUser");
    return;
  }
  rpc_ident_release(id);
}

static void work_run(void *data) {
  ip_conn *c = data;
  if (!ips.opts.apply_network) { /* standalone: only the default user to resolve */
    work_user(c);
    return;
  }
  c->work_result = c->work_revalidate ? network_revalidate(&c->cfg) : network_apply(&c->cfg);
  /* boot.md §12, sticky: an absent key keeps what was applied (a memory.max
   * below the workload's usage reclaims in this write: the pool's job) */
  const initmsg_plan *p = &c->plan;
  if (!c->work_result && (p->workload_memory_max || p->workload_pids_max)) {
    int e = proc_cg_workload_set(p->workload_memory_max, p->workload_pids_max);
    if (e == -ENOSYS)
      LOG_INFO("workload keys ignored: no workload envelope (%s)", proc_cg_why());
    else if (e)
      LOG_WARN("workload keys not applied: %s", strerror(-e));
    else
      LOG_INFO("workload limits set memory.max=%llu pids.max=%llu (0: kept)",
               (unsigned long long)p->workload_memory_max, (unsigned long long)p->workload_pids_max);
  }
  work_user(c);
}

static void work_done(void *data, int canceled) {
  ip_conn *c = data;
  c->work_pending = 0;
  if (c->phase != PH_WORK) { /* closed meanwhile (initproto_close) */
    conn_maybe_free(c);
    return;
  }
  if (canceled) { /* no thread could take it */
    go_terminal(c, "internal error: network work cancelled");
    return;
  }
  if (c->work_result) {
    go_terminal(c, c->work_result);
    return;
  }
  if (c->plan.default_user) /* sticky: an absent key keeps the last one */
    snprintf(conch.default_user, sizeof conch.default_user, "%s", c->plan.default_user);
  if (c->plan.allow_upgrade >= 0) /* sticky likewise; serve --no-upgrade wins either way */
    conch.init_no_upgrade = !c->plan.allow_upgrade;
  if (ips.opts.pid1_logs) { /* sticky likewise */
    if (c->plan.console_level >= 0) {
      ips.opts.console_level = c->plan.console_level;
      if (ips.state == INITPROTO_READY) log_set_console_level(c->plan.console_level);
    }
    if (c->plan.log_port >= 0) {
      char spec[64] = "";
      if (c->plan.log_port > 0) snprintf(spec, sizeof spec, "vsock:%u:%lld", ips.opts.log_cid, c->plan.log_port);
      log_stream_set(spec);
    }
  }
  int token_changed = apply_identity(&c->plan);
  if (token_changed < 0) {
    go_terminal(c, "invalid sandbox environment: out of memory");
    return;
  }
  if (ips.opts.apply_restore) restore_apply(&c->plan, (int64_t)((uv_hrtime() - c->t_recv) / 1000000));
  char ipbuf[16];
  snprintf(ipbuf, sizeof ipbuf, "%u.%u.%u.%u", c->plan.guest_ip >> 24, (c->plan.guest_ip >> 16) & 255,
           (c->plan.guest_ip >> 8) & 255, c->plan.guest_ip & 255);
  /* loopback listeners forwarded to the guest IP (api.md §9 "Ports"): where
   * this message manages the network, on unless it says no */
  if (ips.opts.apply_network && c->plan.guest_ip)
    net_forward_set(c->plan.forward_local_ports != 0 ? ipbuf : NULL);
  if (c->work_revalidate) {
    LOG_INFO("init message re-applied: network %s, token %s",
             ips.opts.apply_network ? "revalidated" : "not managed here",
             token_changed ? "replaced" : "unchanged");
    respond_simple(c, 1, 0, NULL);
    return;
  }
  LOG_INFO("init message applied guest_ip=%s/%u env=%zu network=%s", ipbuf, c->plan.prefix_len,
           c->plan.nenv, ips.opts.apply_network ? "applied" : "skipped");
  ips.state = INITPROTO_NETWORK_APPLIED;
  if (!ips.first_done) {
    ips.first_done = 1;
    if (ips.opts.on_first) ips.opts.on_first(ips.opts.arg);
  }
  if (c->phase == PH_WORK) wait_start(c);
}

static void start_work(ip_conn *c, int revalidate) {
  c->phase = PH_WORK;
  c->work_revalidate = revalidate;
  c->cfg = (network_cfg){
      .ip = c->plan.guest_ip,
      .gw = c->plan.gateway,
      .prefix = c->plan.prefix_len,
      .resolv = c->plan.resolv,
      .resolv_len = c->plan.resolv_len,
      .resolv_path = ips.resolv_path,
      .do_links = 1,
  };
  if (!ips.opts.apply_network && !c->plan.default_user) { /* standalone default: nothing to touch */
    c->work_result = NULL;
    c->work_pending = 1;
    work_done(c, 0);
    return;
  }
  if (!rpc_work_submit(NULL, work_run, work_done, c)) {
    go_terminal(c, "internal error: cannot queue network work");
    return;
  }
  c->work_pending = 1;
}

/* A complete frame arrived. */
static void conn_on_frame(ip_conn *c) {
  uv_timer_stop(&c->timer);
  uv_poll_stop(&c->poll);
  char err[160];
  char *bad = NULL;
  c->t_recv = uv_hrtime();
  int rc = initmsg_process(c->body, c->len, &c->plan, &bad, err, sizeof err);
  if (rc < 0) {
    conn_reject(c, err);
    return;
  }
  if (ips.state == INITPROTO_TERMINAL) {
    free(bad);
    LOG_WARN("init message answered with the earlier terminal failure");
    conn_respond(c, ips.terminal, ips.terminal_len);
    return;
  }
  if (rc == 1) {
    go_terminal(c, bad);
    free(bad);
    return;
  }
  switch (ips.state) {
    case INITPROTO_AWAITING_NETWORK: start_work(c, 0); break;
    case INITPROTO_NETWORK_APPLIED: wait_start(c); break;
    case INITPROTO_READY: start_work(c, 1); break;
    case INITPROTO_TERMINAL: break;
  }
}

static void conn_read(ip_conn *c) {
  for (;;) {
    char *dst;
    size_t want;
    if (c->phase == PH_HEADER) {
      dst = (char *)c->hdr + c->got;
      want = 4 - c->got;
    } else {
      dst = c->body + c->got;
      want = c->len - c->got;
    }
    ssize_t r = recv(c->fd, dst, want, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      char why[96];
      snprintf(why, sizeof why, "read error: %s", strerror(errno));
      conn_reject(c, why);
      return;
    }
    if (r == 0) {
      char why[96];
      snprintf(why, sizeof why, "truncated frame (%s: got %zu of %u bytes)",
               c->phase == PH_HEADER ? "header" : "body", c->got,
               c->phase == PH_HEADER ? 4u : c->len);
      conn_reject(c, why);
      return;
    }
    c->got += (size_t)r;
    if (c->phase == PH_HEADER && c->got == 4) {
      c->len = (uint32_t)c->hdr[0] << 24 | (uint32_t)c->hdr[1] << 16 | (uint32_t)c->hdr[2] << 8 | c->hdr[3];
      if (c->len < 1 || c->len > INITMSG_MAX_FRAME) {
        char why[96];
        snprintf(why, sizeof why, "frame size %u outside [1, %d]", c->len, INITMSG_MAX_FRAME);
        conn_reject(c, why);
        return;
      }
      c->body = malloc(c->len);
      if (!c->body) {
        conn_reject(c, "out of memory");
        return;
      }
      c->phase = PH_BODY;
      c->got = 0;
    } else if (c->phase == PH_BODY && c->got == c->len) {
      conn_on_frame(c);
      return;
    }
  }
}

static void conn_on_io(uv_poll_t *p, int status, int events) {
  ip_conn *c = p->data;
  if (c->phase == PH_CLOSED) return;
  if (c->phase == PH_SEND) {
    if (status < 0) {
      LOG_WARN("init response not sent: %s", uv_strerror(status));
      conn_finish(c);
      return;
    }
    conn_try_send(c);
    return;
  }
  if (c->phase == PH_HEADER || c->phase == PH_BODY) {
    if (status < 0) {
      conn_reject(c, uv_strerror(status));
      return;
    }
    (void)events;
    conn_read(c);
  }
}

static void conn_recv_timeout(uv_timer_t *t) {
  ip_conn *c = t->data;
  char why[96];
  snprintf(why, sizeof why, "receive timeout after %d ms", IP_RECV_TIMEOUT_MS);
  conn_reject(c, why);
}

static void conn_start(int fd) {
  ip_conn *c = calloc(1, sizeof *c);
  if (!c) {
    LOG_ERROR("init connection dropped: out of memory");
    close(fd);
    return;
  }
  c->fd = fd;
  c->phase = PH_HEADER;
  if (uv_poll_init_socket(conch.loop, &c->poll, fd) != 0) {
    LOG_ERROR("init connection dropped: cannot watch socket");
    close(fd);
    free(c);
    return;
  }
  uv_timer_init(conch.loop, &c->timer);
  c->poll.data = c->timer.data = c;
  c->handles_open = 2;
  ips.active = c;
  uv_timer_start(&c->timer, conn_recv_timeout, IP_RECV_TIMEOUT_MS, 0);
  uv_poll_start(&c->poll, UV_READABLE, conn_on_io);
}

/* ------------------------------------------------------------ listeners */

static void listeners_pause(void) {
  for (size_t i = 0; i < ips.nlst; i++)
    if (ips.lst[i]->polling) {
      uv_poll_stop(&ips.lst[i]->poll);
      ips.lst[i]->polling = 0;
    }
}

static void on_accept(uv_poll_t *p, int status, int events);

static void listeners_resume(void) {
  if (ips.active || ips.frozen) return;
  if (ips.backoff && uv_is_active((uv_handle_t *)ips.backoff)) return;
  for (size_t i = 0; i < ips.nlst; i++)
    if (!ips.lst[i]->polling) {
      uv_poll_start(&ips.lst[i]->poll, UV_READABLE, on_accept);
      ips.lst[i]->polling = 1;
    }
}

static void backoff_done(uv_timer_t *t) {
  (void)t;
  listeners_resume();
}

static void on_accept(uv_poll_t *p, int status, int events) {
  ip_listener *l = p->data;
  (void)events;
  if (ips.active) {
    listeners_pause();
    return;
  }
  if (status < 0) {
    LOG_WARN("init listener error: %s", uv_strerror(status));
    return;
  }
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
    LOG_WARN("init listener accept failed: %s (pausing %d ms)", strerror(errno), IP_ACCEPT_BACKOFF_MS);
    listeners_pause();
    if (!ips.backoff && (ips.backoff = malloc(sizeof *ips.backoff)) != NULL)
      uv_timer_init(conch.loop, ips.backoff);
    if (ips.backoff)
      uv_timer_start(ips.backoff, backoff_done, IP_ACCEPT_BACKOFF_MS, 0);
    else
      listeners_resume();
    return;
  }
  listeners_pause();
  conn_start(fd);
}

static int listen_unix(const char *path, ip_listener *l) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t pl = strlen(path);
  if (pl == 0 || pl >= sizeof sa.sun_path) return -ENAMETOOLONG;
  memcpy(sa.sun_path, path, pl + 1);
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return -EEXIST;
    if (unlink(path) != 0) return -errno;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
  return fd;
}

static int listen_vsock(const char *port_s) {
  char *end;
  errno = 0;
  unsigned long port = strtoul(port_s, &end, 10);
  if (errno || end == port_s || *end || port > 0xffffffffUL || port_s[0] == '-') return -EINVAL;
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = (unsigned)port};
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

int initproto_listen(const char *spec) {
  if (!conch.loop) return -EINVAL;
  if (ips.nlst == IP_MAX_LISTENERS) return -EMFILE;
  if (!ips.resolv_path[0]) {
    initproto_opts zero = {0};
    initproto_configure(&zero);
  }
  ip_listener *l = calloc(1, sizeof *l);
  if (!l) return -ENOMEM;
  int fd;
  if (strncmp(spec, "unix:", 5) == 0)
    fd = listen_unix(spec + 5, l);
  else if (strncmp(spec, "vsock:", 6) == 0)
    fd = listen_vsock(spec + 6);
  else
    fd = -EINVAL;
  if (fd < 0) {
    free(l);
    return fd;
  }
  l->fd = fd;
  int rc = uv_poll_init_socket(conch.loop, &l->poll, fd);
  if (rc != 0) {
    close(fd);
    if (l->unix_path[0]) unlink(l->unix_path);
    free(l);
    return rc;
  }
  l->poll.data = l;
  ips.lst[ips.nlst++] = l;
  LOG_INFO("listening for init messages on %s", spec);
  listeners_resume();
  return 0;
}

/* Close callback for handles that are the first member of a malloc'd
 * block (ip_listener.poll is not: it uses data). */
static void free_handle_owner(uv_handle_t *h) {
  if (h->type == UV_POLL)
    free(h->data);
  else
    free(h);
}

void initproto_close(void) {
  for (size_t i = 0; i < ips.nlst; i++) {
    ip_listener *l = ips.lst[i];
    uv_close((uv_handle_t *)&l->poll, free_handle_owner);
    close(l->fd);  /* after uv_close: the poll watcher is already stopped */
    l->fd = -1;
    if (l->unix_path[0]) unlink(l->unix_path);
  }
  ips.nlst = 0;
  if (ips.backoff) uv_close((uv_handle_t *)ips.backoff, free_handle_owner);
  if (ips.active) {
    ip_conn *c = ips.active;
    ips.active = NULL;
    c->phase = PH_CLOSED;
    uv_close((uv_handle_t *)&c->poll, conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
    close(c->fd);
  }
  free(ips.terminal);
  free(ips.sandbox_id);
  memset(&ips, 0, sizeof ips);
  ips.state = INITPROTO_AWAITING_NETWORK;
}

/* ------------------------------------------------------------ upgrade */

int initproto_listening(void) { return conch.initproto && ips.nlst > 0; }

void initproto_freeze(int on) {
  ips.frozen = on;
  if (on) listeners_pause();
  else listeners_resume();
}

int initproto_busy(void) { return conch.initproto && ips.active != NULL; }

int initproto_handover_save(Conch__Handover__Init *m) {
  if (!conch.initproto) return 0;
  m->present = 1;
  m->state = (uint32_t)ips.state;
  m->terminal.data = (uint8_t *)ips.terminal;
  m->terminal.len = ips.terminal ? ips.terminal_len : 0;
  m->first_done = ips.first_done;
  m->services_ready = ips.sigusr1;
  m->sandbox_id = ips.sandbox_id;
  m->apply_network = ips.opts.apply_network;
  m->apply_restore = ips.opts.apply_restore;
  m->merge_missing = ips.opts.merge_missing;
  m->services_required = ips.opts.services_required;
  m->resolv_path = ips.resolv_path;
  m->ready_path = ips.ready_path;
  if (!ips.nlst) return 0;
  Conch__Handover__InitListener *l = calloc(ips.nlst, sizeof *l);
  m->listeners = calloc(ips.nlst, sizeof *m->listeners);
  if (!l || !m->listeners) {
    free(l);
    free(m->listeners);
    m->listeners = NULL;
    return -1;
  }
  for (size_t i = 0; i < ips.nlst; i++) {
    conch__handover__init_listener__init(&l[i]);
    l[i].fd = ips.lst[i]->fd;
    l[i].unix_path = ips.lst[i]->unix_path;
    m->listeners[i] = &l[i];
  }
  m->n_listeners = ips.nlst;
  return 0;
}

void initproto_handover_save_free(Conch__Handover__Init *m) {
  if (m->n_listeners) free(m->listeners[0]);
  free(m->listeners);
  m->listeners = NULL;
  m->n_listeners = 0;
}

int initproto_handover_restore(const Conch__Handover__Init *m) {
  if (!m || !m->present) return 0;
  initproto_configure(&(initproto_opts){.apply_network = m->apply_network,
                                        .apply_restore = m->apply_restore,
                                        .merge_missing = m->merge_missing,
                                        .services_required = m->services_required,
                                        .resolv_path = m->resolv_path,
                                        .services_ready_path = m->ready_path});
  ips.state = m->state <= INITPROTO_TERMINAL ? (initproto_state)m->state : INITPROTO_TERMINAL;
  if (m->terminal.len) {
    if (!(ips.terminal = malloc(m->terminal.len))) return -1;
    memcpy(ips.terminal, m->terminal.data, m->terminal.len);
    ips.terminal_len = m->terminal.len;
  }
  ips.first_done = m->first_done;
  ips.sigusr1 = m->services_ready;
  if (m->sandbox_id && m->sandbox_id[0] && !(ips.sandbox_id = strdup(m->sandbox_id))) return -1;
  for (size_t i = 0; i < m->n_listeners && ips.nlst < IP_MAX_LISTENERS; i++) {
    ip_listener *l = calloc(1, sizeof *l);
    if (!l) return -1;
    l->fd = m->listeners[i]->fd;
    snprintf(l->unix_path, sizeof l->unix_path, "%s", m->listeners[i]->unix_path);
    ips.lst[ips.nlst++] = l;
  }
  ips.frozen = 1; /* until initproto_handover_resume */
  return 0;
}

void initproto_handover_abandon(const Conch__Handover__Init *m) {
  for (size_t i = 0; m && i < m->n_listeners; i++) {
    int fd = m->listeners[i]->fd, taken = 0;
    for (size_t j = 0; j < ips.nlst && !taken; j++) taken = ips.lst[j]->fd == fd;
    if (!taken && fd > 2) {
      LOG_WARN("upgrade: init listener fd=%d not taken: closed", fd);
      close(fd);
    }
  }
}

void initproto_handover_resume(void) {
  size_t k = 0;
  for (size_t i = 0; i < ips.nlst; i++) {
    ip_listener *l = ips.lst[i];
    if (uv_poll_init_socket(conch.loop, &l->poll, l->fd) != 0) {
      LOG_ERROR("init listener fd=%d lost after the upgrade", l->fd);
      close(l->fd);
      free(l);
      continue;
    }
    l->poll.data = l;
    ips.lst[k++] = l;
  }
  ips.nlst = k;
  ips.frozen = 0;
  listeners_resume();
}
