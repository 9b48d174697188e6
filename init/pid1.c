/* pid1 — PID 1 sequencing; see pid1.h. */
#include "init/pid1.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "init/boot.h"
#include "init/bootutil.h"
#include "init/cmdline.h"
#include "init/entrypoint.h"
#include "init/initproto.h"
#include "proc/reaper.h"
#include "server/server.h"
#include "proc/cgroup.h"
#include "proc/service.h"

#define PID1_API_ADDR "0.0.0.0:4064"
#define PID1_PMEM_WAIT_MS 500
#define PID1_PMEM_POLL_MS 10

/* PID 1's state (conch.pid1). */
struct pid1 {
  boot_state boot;
  uv_signal_t sigusr1;
  uv_timer_t pmem_timer;
  uint64_t pmem_deadline;
  int fatal;
};

/* The module's state lives in the daemon context (conch.pid1), allocated
 * on first use; `p1` names it here. */
static struct pid1 *pid1_self(void) {
  if (!conch.pid1) conch.pid1 = daemon_alloc_state(sizeof *conch.pid1, "pid1");
  return conch.pid1;
}
#define p1 (*pid1_self())

static void fatal(const char *why) {
  p1.fatal = 1;
  LOG_ERROR("fatal: %s; PID 1 stays alive (reaping only), the sandbox will never be ready", why);
}

static void on_sigusr1(uv_signal_t *h, int sig) {
  (void)h;
  (void)sig;
  initproto_services_ready();
}

/* Step 13: after the first valid init message was applied. */
static void on_first_message(void *arg) {
  boot_state *b = arg;
  if (b->have_entrypoint) {
    pid_t pid = entrypoint_start(ENTRYPOINT_PATH, initproto_sandbox_id()
                                                      ? initproto_sandbox_id()
                                                      : (b->cmd.have_sandbox_id ? b->cmd.sandbox_id : ""));
    if (pid < 0) LOG_ERROR("rootfs entrypoint not started: %s", strerror((int)-pid));
  }
  int rc = server_listen(PID1_API_ADDR);
  if (rc != 0)
    LOG_ERROR("API listen on %s failed: %s; init messages keep answering not_ready", PID1_API_ADDR,
              uv_strerror(rc));
}

/* The init listeners: conch.init_listen or vsock:4065. */
static const char *listen_spec(size_t i) {
  if (!p1.boot.cmd.have_listen) return i == 0 ? "vsock:4065" : NULL;
  return i < p1.boot.cmd.nlisten ? p1.boot.cmd.listen[i] : NULL;
}

static int listen_kind(int unix_kind, char *err, size_t errlen) {
  const char *s;
  for (size_t i = 0; (s = listen_spec(i)) != NULL; i++) {
    if ((strncmp(s, "unix:", 5) == 0) != unix_kind) continue;
    int rc = initproto_listen(s);
    if (rc != 0) {
      snprintf(err, errlen, "init listener %s: %s", s, strerror(-rc));
      return -1;
    }
  }
  return 0;
}

static int bind_unix_listeners(void *arg, char *err, size_t errlen) {
  (void)arg;
  return listen_kind(1, err, errlen);
}

static void boot_finish(void) {
  boot_state *b = &p1.boot;
  boot_layers(b); /* step 9 */
  initproto_opts o = {0};
  o.apply_network = 1;
  o.apply_restore = 1;
  o.pid1_logs = 1;
  o.console_level = b->cmd.have_console_level ? b->cmd.console_level : LOG_LVL_WARN;
  o.log_cid = b->cmd.have_log_cid ? b->cmd.log_cid : 2;
  o.log_port = b->cmd.have_log_port ? b->cmd.log_port : 0;
  o.on_first = on_first_message;
  o.arg = b;
  initproto_configure(&o);
  char err[512];
  if (boot_prepare_root(b, bind_unix_listeners, NULL, err, sizeof err) != 0) { /* 10–11 */
    fatal(err);
    return;
  }
  o.merge_missing = !b->merge_ready;
  o.services_required = b->services_required;
  initproto_configure(&o);
  if (listen_kind(0, err, sizeof err) != 0) { /* step 12 */
    fatal(err);
    return;
  }
  LOG_INFO("boot complete; waiting for the init message");
}

static void pmem_poll(uv_timer_t *t) {
  if (boot_need_pmem_wait(&p1.boot) && uv_now(conch.loop) < p1.pmem_deadline) return;
  uv_timer_stop(t);
  uv_close((uv_handle_t *)t, NULL);
  if (boot_need_pmem_wait(&p1.boot)) LOG_WARN("/dev/pmem* missing or incomplete after %d ms", PID1_PMEM_WAIT_MS);
  boot_finish();
}

/* An OOM kill in the workload is reported by the end event (oomKilled) and
 * /metrics; the kernel's list of every task of the cgroup, written to a
 * serial console at a few kB/s, stalled the whole guest for seconds per
 * kill of a fork bomb's thousands of processes (microVM, TCG). */
static void quiet_oom_reports(void) {
  int fd = open("/proc/sys/vm/oom_dump_tasks", O_WRONLY | O_CLOEXEC);
  if (fd < 0 || write(fd, "0", 1) != 1) LOG_WARN("cannot set vm.oom_dump_tasks=0: %s", strerror(errno));
  if (fd >= 0) close(fd);
}

void init_pid1_prepare(void) {
  /* step 1: not killable from inside; children reset these before exec */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGHUP, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  conch.is_pid1 = 1;
  conch.loop = uv_default_loop();
}

/* After an upgrade in place: the console's level and the host stream as
 * they were (handed over with the init protocol's options, an init
 * message's consoleLogLevel and logPort included); from the kernel
 * command line again when the older program saved none. */
static void pid1_logs_again(int argc, char **argv) {
  const initproto_opts *o = initproto_get_opts();
  if (o->pid1_logs) {
    if (initproto_get_state() == INITPROTO_READY) log_set_console_level(o->console_level);
    if (o->log_port) {
      char spec[64];
      snprintf(spec, sizeof spec, "vsock:%u:%u", o->log_cid, o->log_port);
      log_stream_set(spec);
    }
    return;
  }
  init_cmdline c;
  init_cmdline_reset(&c);
  for (int i = 1; i < argc; i++) init_cmdline_word(&c, argv[i], strlen(argv[i]));
  size_t n;
  char *cl = boot_read_file("/proc/cmdline", &n);
  if (cl) init_cmdline_parse(&c, cl, n);
  free(cl);
  if (initproto_get_state() == INITPROTO_READY)
    log_set_console_level(c.have_console_level ? c.console_level : LOG_LVL_WARN);
  if (c.have_log_port && c.log_port) {
    char spec[64];
    snprintf(spec, sizeof spec, "vsock:%u:%u", c.have_log_cid ? c.log_cid : 2, c.log_port);
    log_stream_set(spec);
  }
}

int init_pid1_serve(int argc, char **argv) {
  pid1_logs_again(argc, argv);
  uv_signal_init(conch.loop, &p1.sigusr1); /* ref'd: keeps the loop alive forever */
  uv_signal_start(&p1.sigusr1, on_sigusr1, SIGUSR1);
  LOG_INFO("conch-init %s serving as PID 1 after an upgrade in place", CONCH_VERSION);
  for (;;) uv_run(conch.loop, UV_RUN_DEFAULT);
}

int init_pid1_main(int argc, char **argv) {
  init_pid1_prepare();
  if (reaper_init(conch.loop) != 0) LOG_ERROR("reaper_init failed");
  uv_signal_init(conch.loop, &p1.sigusr1); /* ref'd: keeps the loop alive forever */
  uv_signal_start(&p1.sigusr1, on_sigusr1, SIGUSR1);
  LOG_INFO("conch-init %s starting as PID 1", CONCH_VERSION);
  boot_early(&p1.boot, argc, argv); /* steps 2–8 */
  daemon_stdio_fill(); /* /dev/null in place of a stand-in, now that /dev is mounted */
  proc_cg_init(conch.loop, 1);      /* cgroup2 for ProcessService, before the chroot */
  quiet_oom_reports();
  if (boot_need_pmem_wait(&p1.boot)) { /* step 9: wait ≤ 500 ms without sleeping */
    uv_timer_init(conch.loop, &p1.pmem_timer);
    p1.pmem_deadline = uv_now(conch.loop) + PID1_PMEM_WAIT_MS;
    uv_timer_start(&p1.pmem_timer, pmem_poll, PID1_PMEM_POLL_MS, PID1_PMEM_POLL_MS);
  } else {
    boot_finish();
  }
  for (;;) uv_run(conch.loop, UV_RUN_DEFAULT); /* step 14; the SIGUSR1 watcher keeps it alive */
}
