/* initproto_wait — a connection waits (up to 1.5 s) for the sandbox to
 * be ready: the API serving, the merge root there and, where required, the
 * rootfs services (SIGUSR1 or the ready file); see initproto_int.h. */
#include "init/initproto_int.h"

#include "core/daemon.h"
#include "core/log.h"

#define IP_READY_WAIT_MS 1500
#define IP_READY_POLL_MS 10

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
    ip_conn_maybe_free(c);
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
    ip_respond_simple(c, 1, 0, NULL);
    return;
  }
  if (uv_now(conch.loop) >= c->deadline) {
    uv_timer_stop(&c->timer);
    ip_respond_simple(c, 0, 1, "sandbox services are not ready");
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

void ip_wait_start(ip_conn *c) {
  c->phase = PH_WAIT;
  c->deadline = uv_now(conch.loop) + IP_READY_WAIT_MS;
  wait_check(c);
}
