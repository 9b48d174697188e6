/* initproto_apply — a received init message checked and applied, or
 * answered with the sticky terminal failure; see initproto_int.h. */
#include "init/initproto_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/log.h"
#include "core/senv.h"
#include "server/rpc.h"
#include "server/tokhold.h"
#include "server/users.h"
#include "init/restore.h"
#include "net/service.h"
#include "proc/cgroup.h"

/* Enter the sticky terminal state with this reason and answer it. */
static void go_terminal(ip_conn *c, const char *reason) {
  LOG_ERROR("init message failed (terminal): %s", reason);
  free(ips.terminal);
  ips.terminal = initmsg_response(0, 0, reason, &ips.terminal_len);
  ips.state = INITPROTO_TERMINAL;
  if (!ips.terminal) {
    LOG_ERROR("init response not sent: out of memory");
    ip_conn_finish(c);
    return;
  }
  ip_conn_respond(c, ips.terminal, ips.terminal_len);
}

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
    ip_conn_maybe_free(c);
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
      ips.opts.log_port = (unsigned)c->plan.log_port;
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
    ip_respond_simple(c, 1, 0, NULL);
    return;
  }
  LOG_INFO("init message applied guest_ip=%s/%u env=%zu network=%s", ipbuf, c->plan.prefix_len,
           c->plan.nenv, ips.opts.apply_network ? "applied" : "skipped");
  ips.state = INITPROTO_NETWORK_APPLIED;
  if (!ips.first_done) {
    ips.first_done = 1;
    if (ips.opts.on_first) ips.opts.on_first(ips.opts.arg);
  }
  if (c->phase == PH_WORK) ip_wait_start(c);
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

void ip_apply_frame(ip_conn *c) {
  char err[160];
  char *bad = NULL;
  c->t_recv = uv_hrtime();
  int rc = initmsg_process(c->body, c->len, &c->plan, &bad, err, sizeof err);
  if (rc < 0) {
    ip_conn_reject(c, err);
    return;
  }
  if (ips.state == INITPROTO_TERMINAL) {
    free(bad);
    LOG_WARN("init message answered with the earlier terminal failure");
    ip_conn_respond(c, ips.terminal, ips.terminal_len);
    return;
  }
  if (rc == 1) {
    go_terminal(c, bad);
    free(bad);
    return;
  }
  switch (ips.state) {
    case INITPROTO_AWAITING_NETWORK: start_work(c, 0); break;
    case INITPROTO_NETWORK_APPLIED: ip_wait_start(c); break;
    case INITPROTO_READY: start_work(c, 1); break;
    case INITPROTO_TERMINAL: break;
  }
}

