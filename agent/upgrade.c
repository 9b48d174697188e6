/* upgrade — pb.AgentService/Upgrade; see upgrade.h.
 *
 * One op per call, the call's user pointer:
 *   LOAD   (pool, as the call's user) stat, open, read + hash + copy into a
 *          memfd, seal it, compare the sha256, check the ELF header;
 *   RUN    per step (--version, then --handover-check N): a pool job
 *          clones the child (root's: NULL call), then on the loop its
 *          stdout is read through a uv_poll, a timer kills it after
 *          UPGRADE_TRIAL_MS, and its status comes from the reaper;
 *   ANSWER rpc_send + rpc_finish, then handover_begin(memfd).
 * Before each step and right before the answer the arrival's checks run
 * again (upgrades disabled meanwhile, another upgrade); the call holds its
 * token like a stream, so a replaced one ends it.
 * Texts: refusals are failed_precondition "upgrade refused: <why>"; file
 * errors as FileService's (fs/status.h).  Every failure closes the memfd:
 * nothing of the agent changed.
 *
 * Lifetime: the op lives while the call, a pool job or a trial run needs
 * it (up_maybe_free).  on_cancel forgets the call, takes a queued job back
 * and kills a running child; the rest ends by itself.
 */
#include "agent/upgrade.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"
#include "agent/parts.h"
#include "core/handover.h"
#include "core/log.h"
#include "core/sha256.h"
#include "fs/path.h"
#include "fs/status.h"
#include "proc/reaper.h"
#include "proc/spawn.h"
#include "proto/agent.pb-c.h"

#define UP_REFUSED "upgrade refused: "
#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U /* Linux 6.3: say so, or vm.memfd_noexec decides (and the kernel warns) */
#endif
#define UP_COPY_CHUNK (1u << 20)

enum { UP_STEP_VERSION, UP_STEP_CHECK };

typedef struct up_op up_op;

/* One trial run: its handles outlive the step until both are closed. */
typedef struct up_run {
  up_op *op;        /* NULL once the op no longer waits for it */
  reaper_inflight inflight;
  pid_t pid;        /* 0: none */
  int out_fd;       /* the stdout pipe's read end, or -1 */
  int exec_errno;   /* the child could not start the program */
  int spawn_rc;
  uv_poll_t poll;
  uv_timer_t timer;
  int poll_on, timer_on, open_handles;
  int exited, status, timed_out;
  size_t out_len;
  char out[UPGRADE_OUT_MAX];
} up_run;

struct up_op {
  rpc_call *call; /* NULL once canceled or finished */
  rpc_work *work; /* the pool job under way, until its done */
  up_run *run;    /* the trial run under way */
  char *path;
  int has_sha;
  uint8_t sha[SHA256_LEN];
  int memfd;
  int step;
  fs_status st; /* LOAD's outcome */
  char version[UPGRADE_VERSION_MAX + 1];
};

static void up_run_step(up_op *o);

static void up_op_free(up_op *o) {
  if (o->memfd >= 0) close(o->memfd);
  free(o->path);
  fs_status_clear(&o->st);
  free(o);
  conch.upgrade_trying = 0;
}

static void up_maybe_free(up_op *o) {
  if (!o->call && !o->work && !o->run) up_op_free(o);
}

/* End the call with an error (if it is still there); the op goes once idle. */
static void up_fail(up_op *o, rpc_code code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void up_fail(up_op *o, rpc_code code, const char *fmt, ...) {
  if (o->call) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    rpc_set_user(o->call, NULL);
    rpc_finish(o->call, code, msg);
    o->call = NULL;
  }
  up_maybe_free(o);
}

static const char *up_errstr(int e, char *buf, size_t n) {
  const char *s = strerror_r(e, buf, n); /* GNU: maybe not in buf */
  if (s != buf) snprintf(buf, n, "%s", s);
  for (char *p = buf; *p; p++)
    if (*p >= 'A' && *p <= 'Z') *p = (char)(*p - 'A' + 'a');
  return buf;
}

/* ------------------------------------------------------------ LOAD (pool) */

static void up_load(void *data) {
  up_op *o = data;
  const char *p = o->path;
  struct stat sb;
  if (stat(p, &sb) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&o->st, RPC_NOT_FOUND, "file not found: %s", p);
    else
      fs_status_os(&o->st, "stat file", p, e);
    return;
  }
  if (!S_ISREG(sb.st_mode)) { /* before open: a FIFO or a device is never opened */
    fs_status_set(&o->st, RPC_INVALID_ARGUMENT, "not a regular file: %s", p);
    return;
  }
  if ((unsigned long long)sb.st_size > UPGRADE_MAX_BYTES) {
    fs_status_set(&o->st, RPC_INVALID_ARGUMENT, "file too large: %s", p);
    return;
  }
  int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&o->st, RPC_NOT_FOUND, "file not found: %s", p);
    else
      fs_status_os(&o->st, "open file", p, e);
    return;
  }
  uint8_t *buf = NULL;
  if (fstat(fd, &sb) != 0) {
    fs_status_os(&o->st, "stat file", p, errno);
    goto out;
  }
  if (!S_ISREG(sb.st_mode)) { /* replaced since the stat */
    fs_status_set(&o->st, RPC_INVALID_ARGUMENT, "not a regular file: %s", p);
    goto out;
  }
  o->memfd = memfd_create("conch-init-upgrade", MFD_CLOEXEC | MFD_ALLOW_SEALING | MFD_EXEC);
  if (o->memfd < 0 && (errno == EINVAL || errno == EACCES)) /* before 6.3; vm.memfd_noexec = 2: the exec says */
    o->memfd = memfd_create("conch-init-upgrade", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  buf = malloc(UP_COPY_CHUNK);
  if (o->memfd < 0 || !buf) {
    fs_status_os(&o->st, "copy file", p, o->memfd < 0 ? errno : ENOMEM);
    goto out;
  }
  sha256_ctx h;
  sha256_init(&h);
  size_t total = 0;
  for (;;) {
    ssize_t n = read(fd, buf, UP_COPY_CHUNK);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      fs_status_os(&o->st, "read file", p, errno);
      goto out;
    }
    if (n == 0) break;
    total += (size_t)n;
    if (total > UPGRADE_MAX_BYTES) { /* it grew while read */
      fs_status_set(&o->st, RPC_INVALID_ARGUMENT, "file too large: %s", p);
      goto out;
    }
    sha256_update(&h, buf, (size_t)n);
    for (ssize_t off = 0; off < n;) {
      ssize_t w = write(o->memfd, buf + off, (size_t)(n - off));
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) {
        fs_status_os(&o->st, "copy file", p, errno);
        goto out;
      }
      off += w;
    }
  }
  /* from here on the copy cannot change: it is what was hashed and what runs */
  if (fcntl(o->memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0) {
    fs_status_os(&o->st, "copy file", p, errno);
    goto out;
  }
  uint8_t digest[SHA256_LEN];
  sha256_final(&h, digest);
  if (o->has_sha && memcmp(digest, o->sha, SHA256_LEN) != 0) {
    fs_status_set(&o->st, RPC_INVALID_ARGUMENT, "sha256 mismatch: %s", p);
    goto out;
  }
  uint8_t hdr[64];
  ssize_t hn = pread(o->memfd, hdr, sizeof hdr, 0);
  char why[128];
  if (upgrade_elf_check(hdr, hn > 0 ? (size_t)hn : 0, why, sizeof why) != 0)
    fs_status_set(&o->st, RPC_FAILED_PRECONDITION, UP_REFUSED "%s", why);
out:
  free(buf);
  close(fd);
  if (o->st.code != RPC_OK && o->memfd >= 0) {
    close(o->memfd);
    o->memfd = -1;
  }
}

static void up_load_done(void *data, int canceled) {
  up_op *o = data;
  o->work = NULL;
  if (!o->call) {
    up_maybe_free(o);
    return;
  }
  if (canceled) {
    up_fail(o, RPC_INTERNAL, "upgrade was canceled");
    return;
  }
  if (o->st.code != RPC_OK) {
    up_fail(o, o->st.code, "%s", o->st.msg ? o->st.msg : "out of memory");
    return;
  }
  o->step = UP_STEP_VERSION;
  up_run_step(o);
}

/* ------------------------------------------------------------ the trial runs */

static void up_run_closed(uv_handle_t *h) {
  up_run *r = h->data;
  if (--r->open_handles == 0) free(r);
}

/* The run is over for the op: close its handles, free it once closed. */
static void up_run_release(up_run *r) {
  r->op = NULL;
  if (r->out_fd >= 0 && !r->poll_on) close(r->out_fd);
  if (r->poll_on) { /* uv_poll does not own the descriptor: close after the handle */
    uv_close((uv_handle_t *)&r->poll, up_run_closed);
    close(r->out_fd);
  }
  r->out_fd = -1;
  if (r->timer_on) uv_close((uv_handle_t *)&r->timer, up_run_closed);
  if (r->open_handles == 0) free(r);
}

/* Read what stdout has now (kept up to UPGRADE_OUT_MAX, the rest dropped).
 * 1 at end of file or on an error, else 0. */
static int up_run_read(up_run *r) {
  char sink[4096];
  for (;;) {
    char *dst = r->out_len < sizeof r->out ? r->out + r->out_len : sink;
    size_t room = r->out_len < sizeof r->out ? sizeof r->out - r->out_len : sizeof sink;
    ssize_t n = read(r->out_fd, dst, room);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno != EAGAIN;
    if (n == 0) return 1;
    if (dst != sink) r->out_len += (size_t)n;
  }
}

static void up_run_on_readable(uv_poll_t *h, int status, int events) {
  up_run *r = h->data;
  if (status < 0 || up_run_read(r)) uv_poll_stop(h); /* the exit decides */
}

static void up_step_done(up_op *o, up_run *r);

static void up_run_on_exit(pid_t pid, int wstatus, const struct rusage *ru, void *arg) {
  up_run *r = arg;
  r->exited = 1;
  r->status = wstatus;
  kill(-pid, SIGKILL); /* what it left behind in its group */
  if (r->out_fd >= 0) up_run_read(r); /* written before it exited: in the pipe now */
  up_op *o = r->op;
  if (o) {
    o->run = NULL;
    up_step_done(o, r);
  }
  up_run_release(r);
}

static void up_run_kill(up_run *r) {
  if (r->pid > 0 && !r->exited) {
    kill(-r->pid, SIGKILL);
    kill(r->pid, SIGKILL);
  }
}

static void up_run_on_timeout(uv_timer_t *t) {
  up_run *r = t->data;
  r->timed_out = 1;
  up_run_kill(r);
}

static void up_spawn_work(void *data) {
  up_op *o = data;
  up_run *r = o->run;
  char arg[16];
  snprintf(arg, sizeof arg, "%u", (unsigned)HANDOVER_FORMAT);
  char *argv_version[] = {"conch-init", "--version", NULL};
  char *argv_check[] = {"conch-init", "--handover-check", arg, NULL};
  /* the agent's own business, not the workload's: no cgroup, user or
   * terminal; stdin and stderr /dev/null, only PATH in the env */
  static char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  proc_spawn_opts so = {.path = "the new program",
                        .argv = o->step == UP_STEP_VERSION ? argv_version : argv_check,
                        .envp = envp,
                        .cwd = "/",
                        .inflight_pid = &r->inflight.pid,
                        .use_exec_fd = 1,
                        .exec_fd = o->memfd,
                        .null_in_err = 1};
  proc_spawn_result sr;
  char err[128];
  r->out_fd = -1;
  r->exec_errno = 0;
  r->spawn_rc = 0;
  if (proc_spawn(&so, &sr, err, sizeof err) == 0) {
    r->out_fd = sr.out_r;
  } else {
    r->exec_errno = sr.error ? sr.error : ENOEXEC;
    r->spawn_rc = sr.failed_pid ? 0 : -1; /* a child whose exec failed: the reaper has it */
  }
}

static const char *up_step_name(const up_op *o) {
  return o->step == UP_STEP_VERSION ? "--version" : "--handover-check";
}

static void up_spawn_done(void *data, int canceled) {
  up_op *o = data;
  up_run *r = o->run;
  o->work = NULL;
  int st = 0;
  int got = reaper_inflight_claim(&r->inflight, up_run_on_exit, r, &st);
  r->pid = __atomic_load_n(&r->inflight.pid, __ATOMIC_ACQUIRE);
  if (canceled || r->pid <= 0 || got < 0) { /* no child, or one nobody can wait for */
    char eb[96];
    int e = canceled ? ECANCELED : got < 0 ? ENOMEM : r->exec_errno;
    if (got < 0) up_run_kill(r); /* reaped as an orphan */
    o->run = NULL;
    up_run_release(r);
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "cannot run it: %s", up_errstr(e, eb, sizeof eb));
    return;
  }
  if (!o->call) up_run_kill(r); /* canceled meanwhile: the exit ends it */
  if (r->out_fd >= 0 && uv_poll_init(conch.loop, &r->poll, r->out_fd) == 0) {
    r->poll.data = r;
    r->poll_on = 1;
    r->open_handles++;
    uv_poll_start(&r->poll, UV_READABLE, up_run_on_readable);
  }
  uv_timer_init(conch.loop, &r->timer);
  r->timer.data = r;
  r->timer_on = 1;
  r->open_handles++;
  uv_timer_start(&r->timer, up_run_on_timeout, UPGRADE_TRIAL_MS, 0);
  if (got == 1) up_run_on_exit(r->pid, st, &r->inflight.ru, r); /* exited before the claim */
}

static void up_run_step(up_op *o) {
  up_run *r = calloc(1, sizeof *r);
  if (!r) {
    up_fail(o, RPC_INTERNAL, "queue upgrade failed");
    return;
  }
  r->op = o;
  r->out_fd = -1;
  o->run = r;
  reaper_inflight_add(&r->inflight); /* before the pool can clone */
  o->work = rpc_work_submit(NULL, up_spawn_work, up_spawn_done, o); /* NULL: as root */
  if (!o->work) {
    int st;
    reaper_inflight_claim(&r->inflight, NULL, NULL, &st); /* nothing spawned: just the slot */
    o->run = NULL;
    free(r);
    up_fail(o, RPC_INTERNAL, "queue upgrade failed");
  }
}

/* The checks of the call's arrival, again: an init message may have
 * disabled upgrades while the trial ran (a replaced token ends the call by
 * itself: RPC_F_HOLDS_TOKEN).  0 when the upgrade may go on; else the call
 * is ended and -1. */
static int up_still_allowed(up_op *o) {
  if (conch.no_upgrade || conch.init_no_upgrade) {
    up_fail(o, RPC_PERMISSION_DENIED, "upgrade is disabled");
    return -1;
  }
  if (handover_busy()) { /* (one op at a time: cannot happen today) */
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "an upgrade is under way");
    return -1;
  }
  return 0;
}

static void up_answer(up_op *o) {
  rpc_call *c = o->call;
  if (up_still_allowed(o) != 0) return;
  Pb__UpgradeResponse m = PB__UPGRADE_RESPONSE__INIT;
  m.from_version = (char *)CONCH_VERSION;
  m.to_version = o->version;
  if (rpc_send(c, &m.base) != 0) {
    up_fail(o, RPC_INTERNAL, "cannot send the answer");
    return;
  }
  rpc_set_user(c, NULL);
  rpc_finish(c, RPC_OK, NULL);
  o->call = NULL;
  int fd = o->memfd;
  o->memfd = -1;
  LOG_INFO("upgrade from %s to %s (%s): handing over", CONCH_VERSION, o->version, o->path);
  char ver[sizeof o->version];
  memcpy(ver, o->version, sizeof ver);
  up_maybe_free(o); /* conch.upgrade_trying = 0: handover_busy() from now on */
  if (handover_begin(fd, ver) != 0) {
    LOG_ERROR("upgrade to %s: handover_begin failed: %s", ver, strerror(errno));
    close(fd);
  }
}

static void up_step_done(up_op *o, up_run *r) {
  if (!o->call) {
    up_maybe_free(o);
    return;
  }
  if (up_still_allowed(o) != 0) return;
  const char *step = up_step_name(o);
  char eb[96];
  if (r->timed_out) {
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "%s timed out after %d s", step, UPGRADE_TRIAL_MS / 1000);
    return;
  }
  if (r->exec_errno) {
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "cannot run it: %s", up_errstr(r->exec_errno, eb, sizeof eb));
    return;
  }
  if (WIFSIGNALED(r->status)) {
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "%s was killed by signal %d", step, WTERMSIG(r->status));
    return;
  }
  int code = WIFEXITED(r->status) ? WEXITSTATUS(r->status) : -1;
  if (o->step == UP_STEP_VERSION) {
    if (code != 0) {
      up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "%s exited with status %d", step, code);
      return;
    }
    if (upgrade_parse_version(r->out, r->out_len, o->version) != 0) {
      up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "--version printed no conch-init version");
      return;
    }
    o->step = UP_STEP_CHECK;
    up_run_step(o);
    return;
  }
  if (code != 0) {
    up_fail(o, RPC_FAILED_PRECONDITION, UP_REFUSED "it cannot read state format %u", (unsigned)HANDOVER_FORMAT);
    return;
  }
  up_answer(o);
}

/* ------------------------------------------------------------ the call */

static void up_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__UpgradeRequest *req = (const Pb__UpgradeRequest *)m;
  if (conch.no_upgrade || conch.init_no_upgrade) {
    rpc_finish(c, RPC_PERMISSION_DENIED, "upgrade is disabled");
    return;
  }
  char err[160];
  const char *p = req->path ? req->path : "";
  if (rpc_input_had_nul(c)) {
    snprintf(err, sizeof err, "filepath contains a NUL byte for %s", "upgrade");
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  if (fs_path_check(p, strlen(p), "upgrade", err, sizeof err) != 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  uint8_t sha[SHA256_LEN];
  const char *hex = req->sha256 ? req->sha256 : "";
  if (hex[0] && sha256_from_hex(hex, strlen(hex), sha) != 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "sha256 must be 64 hex digits");
    return;
  }
  if (conch.upgrade_trying || handover_busy()) {
    rpc_finish(c, RPC_FAILED_PRECONDITION, UP_REFUSED "an upgrade is under way");
    return;
  }
  up_op *o = calloc(1, sizeof *o);
  if (o) o->path = strdup(p);
  if (!o || !o->path) {
    free(o);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  o->call = c;
  o->memfd = -1;
  o->has_sha = hex[0] != 0;
  memcpy(o->sha, sha, sizeof sha);
  conch.upgrade_trying = 1;
  rpc_set_user(c, o);
  o->work = rpc_work_submit(c, up_load, up_load_done, o); /* as the call's user: FileService's rules */
  if (!o->work) up_fail(o, RPC_INTERNAL, "queue upgrade failed");
}

static void up_on_cancel(rpc_call *c, rpc_code why) {
  up_op *o = rpc_user(c);
  if (!o) return;
  o->call = NULL;
  if (o->work && rpc_work_cancel(o->work) == 0) {
    /* done(canceled) follows and frees */
  }
  if (o->run) up_run_kill(o->run);
  up_maybe_free(o);
}

static const rpc_method up_methods[] = {
    {
        .path = "/pb.AgentService/Upgrade",
        .kind = RPC_UNARY,
        .input = &pb__upgrade_request__descriptor,
        .output = &pb__upgrade_response__descriptor,
        .on_request = up_on_request,
        .on_cancel = up_on_cancel,
        .flags = RPC_F_HOLDS_TOKEN, /* seconds of trial: a replaced token ends it */
    },
};

const rpc_method *upgrade_service_methods(size_t *n) {
  *n = sizeof up_methods / sizeof *up_methods;
  return up_methods;
}
