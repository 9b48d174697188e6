/* initproto — the init protocol server's state and configuration; see
 * initproto.h, and initproto_int.h for the other files. */
#include "init/initproto_int.h"

#include <stdio.h>

#include "core/daemon.h"
#include "core/log.h"
#include "init/initmsg.h"
#include "proc/cgroup.h"

struct initproto *initproto_self(void) {
  if (!conch.initproto) {
    conch.initproto = daemon_alloc_state(sizeof *conch.initproto, "initproto");
    conch.initproto->state = INITPROTO_AWAITING_NETWORK;
  }
  return conch.initproto;
}

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
const initproto_opts *initproto_get_opts(void) { return &ips.opts; }
