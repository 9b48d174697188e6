/* service — ProcessService RPC handlers; see service.h. */
#include "proc/service.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "core/senv.h"
#include "proc/cgroup.h"
#include "proc/exitfmt.h"
#include "proc/input.h"
#include "proc/plist.h"
#include "proc/prep.h"
#include "proc/proc.h"
#include "proc/validate.h"
#include "proto/agent.pb-c.h"

#define PROC_FG_PREFIX "failed to execute process"
#define PROC_BG_PREFIX "failed to start background process"

static const char *proc_prefix(const struct proc *p) {
  return p->background ? PROC_BG_PREFIX : PROC_FG_PREFIX;
}

/* ---- lookups ---- */
static int proc_tag_busy(struct proc_table *t, const char *tag) {
  struct proc *p;
  list_each(p, &t->table, tlink)
    if ((p->state == PROC_PREP || p->state == PROC_RUNNING) && strcmp(p->tag, tag) == 0) return 1;
  return 0;
}

/* Newest match first: a reused pid or tag finds the latest process. */
static struct proc *proc_find(struct proc_table *t, const Pb__ProcessSelector *sel, int running_only) {
  struct proc *p;
  list_each_rev(p, &t->table, tlink) {
    if (p->state == PROC_PREP) continue;
    if (running_only && p->state != PROC_RUNNING) continue;
    if (sel->pid != 0 ? p->pid == sel->pid : strcmp(p->tag, sel->tag) == 0) return p;
  }
  return NULL;
}

static void proc_finish_not_found(rpc_call *c, const Pb__ProcessSelector *sel) {
  if (sel->pid != 0)
    rpc_finishf(c, RPC_NOT_FOUND, "process pid %d not found", (int)sel->pid);
  else
    rpc_finishf(c, RPC_NOT_FOUND, "process tag \"%s\" not found", sel->tag);
}

/* ---- StartProcess ---- */
__attribute__((format(printf, 4, 5))) static void proc_set_err(struct proc *p, int step, rpc_code code,
                                                             const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  p->prep_step = step;
  p->prep_errcode = (int)code;
  vsnprintf(p->prep_err, sizeof p->prep_err, fmt, ap);
  va_end(ap);
}

static int proc_copy_request(struct proc *p, const Pb__StartProcessRequest *req);

/* Pool thread, a start failing after the script was written: remove it
 * here, before the error reaches the client (not in a later job). */
static void proc_unlink_script_now(struct proc *p) {
  if (!p->script) return;
  proc_script_unlink(p->script_dfd, p->script);
  free(p->script);
  p->script = NULL;
}

/* Thread pool: steps 5 (cwd), 6 (script), 7 (cmd), lookup of 8. */
static int proc_prep_fs(struct proc *p);

static void proc_start_work(void *data) {
  struct proc *p = data;
  if (p->cg) p->cg_err = -proc_cg_create(p->cg, &p->cg_what); /* cgroupfs mkdir takes a global kernel lock */
  if (p->has_limits && (!p->cg || p->cg_err)) { /* limits asked for: no start without them */
    proc_set_err(p, 4, RPC_FAILED_PRECONDITION, "resource limits are not available: cannot set %s: %s",
                 p->cg ? p->cg_what : "a cgroup", strerror(p->cg ? p->cg_err : ENOMEM));
    return;
  }
  if (p->req) { /* taken: copying and freeing 100 000 entries is no work for the loop */
    int r = proc_copy_request(p, p->req);
    protobuf_c_message_free_unpacked(&p->req->base, NULL);
    p->req = NULL;
    if (r != 0) {
      proc_set_err(p, 0, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
  }
  /* the working directory, the script and the lookup as the user: what is
   * created is theirs, and the kernel checks what they may do */
  int as_user = p->ident->uid || p->ident->gid || p->ident->ngroups;
  if (as_user && rpc_fs_become(p->ident) != 0) {
    proc_set_err(p, 5, RPC_INTERNAL, "failed to prepare working directory: cannot act as user %s",
                 p->ident->name);
    return;
  }
  int ok = proc_prep_fs(p) == 0;
  if (as_user) rpc_fs_restore();
  if (ok) proc_launch_spawn(p); /* as root: the child enters its cgroup, then becomes the user */
}

/* Steps 5 (cwd), 6 (script), 7 (cmd) and 8's lookup, with the user's
 * file-system identity.  0, or -1 with the error set. */
static int proc_prep_fs(struct proc *p) {
  char base[4096], clean[4096], err[4400];
  struct stat st; /* as the user (stat, not access: access checks the real uid) */
  if (p->cwd_default && !p->ident->implicit && stat(p->cwd, &st) != 0) { /* api.md §9 */
    free(p->cwd);
    p->cwd = strdup("/");
    if (!p->cwd) {
      proc_set_err(p, 5, RPC_INTERNAL, "failed to prepare working directory: %s", "cannot allocate memory");
      return -1;
    }
  }
  if (!getcwd(base, sizeof base)) strcpy(base, "/");
  if (proc_path_clean(p->cwd, base, clean, sizeof clean) != 0) {
    proc_set_err(p, 5, RPC_INVALID_ARGUMENT, "failed to prepare working directory: mkdir %s: %s", p->cwd,
                 "file name too long");
    return -1;
  }
  char *c2 = strdup(clean);
  if (!c2) {
    proc_set_err(p, 5, RPC_INTERNAL, "failed to prepare working directory: %s", "cannot allocate memory");
    return -1;
  }
  free(p->cwd);
  p->cwd = c2;
  if (proc_mkdir_p(p->cwd, err, sizeof err) != 0) {
    proc_set_err(p, 5, RPC_INVALID_ARGUMENT, "failed to prepare working directory: %s", err);
    return -1;
  }
  if (p->content) {
    char path[4096 + 64];
    int dfd;
    if (proc_script_write(p->cwd, proc_script_ext(p->cmd), p->content, p->content_len, path,
                          sizeof path, &dfd, err, sizeof err) != 0) {
      proc_set_err(p, 6, RPC_INTERNAL, "failed to write script file: %s", err);
      return -1;
    }
    p->script = strdup(path);
    if (p->script)
      p->script_dfd = dfd; /* from now on the script goes with p->script */
    else
      proc_script_unlink(dfd, path);
    p->args = calloc(1, sizeof *p->args);
    if (p->args) p->args[0] = strdup(path);
    if (!p->script || !p->args || !p->args[0]) {
      proc_set_err(p, 6, RPC_INTERNAL, "failed to write script file: %s", "cannot allocate memory");
      return -1;
    }
    p->nargs = 1;
    free(p->content);
    p->content = NULL;
  }
  if (!p->cmd[0]) {
    proc_set_err(p, 7, RPC_INVALID_ARGUMENT, "%s%s",
                 p->background ? "" : PROC_FG_PREFIX ": ", "command is required");
    proc_unlink_script_now(p);
    return -1;
  }
  if (proc_lookup(p->cmd, senv_lookup(p->envp, "PATH"), p->cwd, p->exe, sizeof p->exe, err,
                  sizeof err) != 0) {
    proc_set_err(p, 8, RPC_INVALID_ARGUMENT, "%s: %s", proc_prefix(p), err);
    proc_unlink_script_now(p);
    return -1;
  }
  return 0;
}

static void proc_start_done(void *data, int canceled) {
  struct proc *p = data;
  p->work_pending = 0;
  proc_cg_refill();
  char err[4200], msg[4300];
  if (p->cg && p->cg_err) {
    LOG_WARN("cannot create cgroup %s (%s): %s (process group only)", proc_cg_name(p->cg), p->cg_what,
             strerror(p->cg_err));
    proc_cg_release(p->cg);
    p->cg = NULL;
  }
  if (canceled || p->prep_errcode) p->spawn_rc = 1; /* nothing was spawned */
  int launched = proc_launch_finish(p, err, sizeof err) == 0;
  if (canceled || p->aborted) { /* canceled: no thread could take the work */
    if (launched) { /* the foreground client left while it started */
      LOG_INFO("foreground client gone during start, killing pid=%d kill=%d", (int)p->pid,
               proc_signal(p, SIGKILL));
      return;
    }
    proc_remove_script(p);
    proc_start_fail(p, RPC_CANCELED, "canceled");
    return;
  }
  if (p->prep_errcode) {
    if (p->prep_step < 8)
      LOG_INFO("process start refused step=%d err=\"%s\"", p->prep_step, p->prep_err);
    proc_start_fail(p, (rpc_code)p->prep_errcode, p->prep_err);
    return;
  }
  if (!launched) {
    snprintf(msg, sizeof msg, "%s: %s", proc_prefix(p), err);
    LOG_INFO("process start failed cmd=%s err=\"%s\"", p->cmd, err);
    proc_start_fail(p, RPC_INVALID_ARGUMENT, msg);
    return;
  }
  LOG_INFO("process started pid=%d cmd=%s background=%d tag=%s pty=%d timeout_ms=%lld", (int)p->pid,
           p->cmd, p->background, p->tag, p->has_pty, (long long)p->timeout_ms);
  struct proc_sub *s = list_first_entry(&p->fan.subs, struct proc_sub, link);
  if (s) proc_sub_send_start(s, (int)p->pid);
}

static char *proc_strdup_ok(const char *s, int *ok) {
  char *d = strdup(s ? s : "");
  if (!d) *ok = 0;
  return d;
}

/* The request's fields into the record (loop, or pool for a taken
 * request); 0 or -1 (out of memory).  Strings of a list share one block:
 * freeing 100 000 entries one by one would cost the loop as much again. */
static char *proc_pack(char **dst, const char *const *src, size_t n) {
  size_t bytes = 1;
  for (size_t i = 0; i < n; i++) bytes += strlen(src[i] ? src[i] : "") + 1;
  char *b = malloc(bytes), *w = b;
  for (size_t i = 0; b && i < n; i++) {
    size_t l = strlen(src[i] ? src[i] : "") + 1;
    memcpy(w, src[i] ? src[i] : "", l);
    dst[i] = w;
    w += l;
  }
  return b;
}

static int proc_copy_request(struct proc *p, const Pb__StartProcessRequest *req) {
  int ok = 1;
  p->cmd = proc_strdup_ok(req->cmd, &ok);
  if (req->n_args) {
    p->args = calloc(req->n_args, sizeof *p->args);
    p->args_block = p->args ? proc_pack(p->args, (const char *const *)req->args, req->n_args) : NULL;
    if (!p->args_block) return -1;
    p->nargs = req->n_args;
  }
  size_t n = req->n_env;
  const char **keys = calloc(n + 1, sizeof *keys), **vals = calloc(n + 1, sizeof *vals);
  p->env_keys = calloc(n + 1, sizeof *p->env_keys);
  p->env_vals = calloc(n + 1, sizeof *p->env_vals);
  if (!keys || !vals || !p->env_keys || !p->env_vals) ok = 0;
  for (size_t i = 0; ok && i < n; i++) {
    keys[i] = req->env[i]->key ? req->env[i]->key : "";
    vals[i] = req->env[i]->value ? req->env[i]->value : "";
  }
  if (ok) {
    p->env_kblock = proc_pack(p->env_keys, keys, n);
    p->env_vblock = proc_pack(p->env_vals, vals, n);
    if (!p->env_kblock || !p->env_vblock) ok = 0;
    else p->nenv = n;
  }
  if (ok) p->envp = senv_merge(p->base_env, keys, vals, n);
  free(keys);
  free(vals);
  if (!ok || !p->envp) return -1;
  p->cwd_default = !(req->cwd && req->cwd[0]);
  p->cwd = proc_strdup_ok(p->cwd_default ? p->home : req->cwd, &ok);
  if (ok && req->content && req->content[0]) {
    p->content_len = strlen(req->content);
    p->content = proc_strdup_ok(req->content, &ok);
  }
  if (ok && req->stdin.len) {
    p->stdin_buf = malloc(req->stdin.len);
    if (p->stdin_buf) {
      memcpy(p->stdin_buf, req->stdin.data, req->stdin.len);
      p->stdin_len = req->stdin.len;
    } else {
      ok = 0;
    }
  }
  p->stdin_open = req->stdin_open ? 1 : 0;
  if (ok && req->pty) {
    p->has_pty = 1;
    p->cols = req->pty->cols ? req->pty->cols : PROC_PTY_DEFAULT_COLS;
    p->rows = req->pty->rows ? req->pty->rows : PROC_PTY_DEFAULT_ROWS;
  }
  return ok ? 0 : -1;
}

static void proc_start_on_request(rpc_call *c, const ProtobufCMessage *m) {
  struct proc_table *t = proc_tab;
  const Pb__StartProcessRequest *req = (const Pb__StartProcessRequest *)m;
  char msg[512];
  rpc_code code = proc_validate_start(req, msg, sizeof msg);
  if (code == RPC_OK)
    code = proc_validate_limits(req->limits, /* the CPU count costs 3 syscalls: only for a CPU limit */
                                req->limits && req->limits->cpu_millis ? sysconf(_SC_NPROCESSORS_ONLN) : 1,
                                proc_cg_envelope() ? NULL : proc_cg_why(), msg, sizeof msg);
  if (code != RPC_OK) {
    rpc_finish(c, code, msg);
    return;
  }
  const char *prefix = req->background ? PROC_BG_PREFIX : PROC_FG_PREFIX;
  if (rpc_input_had_nul(c)) {
    rpc_finishf(c, RPC_INVALID_ARGUMENT, "%s: invalid argument (NUL byte in a string field)", prefix);
    return;
  }
  const char *tag = (req->background && req->tag) ? req->tag : "";
  if (tag[0] && proc_tag_busy(t, tag)) {
    rpc_finishf(c, RPC_ALREADY_EXISTS, "background process tag already exists: %s", tag);
    return;
  }
  if (t->nrecords >= PROC_MAX_PROCS) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "too many processes");
    return;
  }
  /* the one-shot stdin counts in the daemon-wide budget from here until
   * the child has read it (input.c) */
  if (req->stdin.len && budget_take(req->stdin.len) != 0) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, PROC_INPUT_BUSY);
    return;
  }
  struct proc *p = proc_new(t);
  if (!p) {
    budget_give(req->stdin.len);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  p->stdin_budget = req->stdin.len;
  int ok = 1;
  p->background = req->background ? 1 : 0;
  p->tag = proc_strdup_ok(tag, &ok);
  /* the sandbox env (bounded by the 16 KiB init message) is read here, on
   * the loop; the request's own fields may be huge (100 000 env entries)
   * and are copied in the pool when the request can be taken */
  p->ident = rpc_ident_hold(rpc_ident_of(c));
  const char *home = senv_get("HOME");
  if (!p->ident->implicit) home = p->ident->home; /* a named user: HOME, USER, LOGNAME are theirs */
  p->home = proc_strdup_ok(home && home[0] ? home : "/root", &ok);
  /* TERM default (a PTY), then the user's, all under the request env */
  const char *bk[4] = {"HOME", "USER", "LOGNAME", "TERM"};
  const char *bv[4] = {p->home, p->ident->name, p->ident->name, "xterm-256color"};
  size_t first = p->ident->implicit ? 3 : 0, nb = (req->pty ? 4 : 3) - first;
  p->base_env = senv_build(bk + first, bv + first, nb);
  p->timeout_ms = rpc_timeout_ms(c);
  if (req->limits) {
    p->limits.memory_max = req->limits->memory_max_bytes;
    p->limits.pids_max = req->limits->pids_max;
    p->limits.cpu_millis = req->limits->cpu_millis;
    p->has_limits = p->limits.memory_max || p->limits.pids_max || p->limits.cpu_millis;
  }
  p->cg = proc_cg_new(&p->limits); /* NULL without cgroups: the process group */
  if (ok && p->base_env) {
    p->req = (Pb__StartProcessRequest *)rpc_take_request(c);
    if (!p->req && proc_copy_request(p, req) != 0) ok = 0;
  }
  if (!ok || !p->base_env || !proc_sub_add(&p->fan, c, !p->background)) {
    proc_release(p);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (p->background) proc_table_add(p); /* reserve the tag */
  p->work_pending = 1;
  reaper_inflight_add(&p->inflight); /* before the pool can clone */
  /* NULL: the job is root's (the cgroup), and takes the user's identity
   * itself for the file-system part */
  if (!rpc_work_submit(NULL, proc_start_work, proc_start_done, p)) {
    p->work_pending = 0;
    int st;
    reaper_inflight_claim(&p->inflight, NULL, NULL, &st); /* nothing spawned: just the slot */
    proc_start_fail(p, RPC_INTERNAL, "cannot queue work");
  }
}

/* ---- Connect ---- */
static void proc_connect_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__ConnectProcessRequest *req = (const Pb__ConnectProcessRequest *)m;
  char msg[128];
  rpc_code code = proc_validate_selector(req->process, msg, sizeof msg);
  if (code != RPC_OK) {
    rpc_finish(c, code, msg);
    return;
  }
  struct proc *p = proc_find(proc_tab, req->process, 0);
  if (!p) {
    proc_finish_not_found(c, req->process);
    return;
  }
  uint64_t from[3];
  if (req->replay) {
    static const char *const names[3] = {"stdout", "stderr", "pty"};
    from[PROC_OUT_STDOUT] = req->replay->stdout;
    from[PROC_OUT_STDERR] = req->replay->stderr;
    from[PROC_OUT_PTY] = req->replay->pty;
    for (int k = PROC_OUT_STDOUT; k <= PROC_OUT_PTY; k++) {
      uint64_t total = proc_out_total(p, k);
      if (from[k] > total) {
        rpc_finishf(c, RPC_OUT_OF_RANGE, "replay offset %llu is beyond the %s output (%llu bytes)",
                    (unsigned long long)from[k], names[k], (unsigned long long)total);
        return;
      }
    }
  } else if (p->state == PROC_ENDED) {
    proc_send_final(c, (int)p->pid, &p->end);
    return;
  }
  struct proc_sub *s = proc_sub_add(&p->fan, c, 0);
  if (!s) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "too many subscribers");
    return;
  }
  proc_sub_send_start(s, (int)p->pid);
  if (!req->replay) return;
  /* the retained bytes, then (same loop turn: nothing in between) live
   * output or, the process having ended, its end event */
  proc_replay(p, s, from);
  if (p->state == PROC_ENDED) proc_fanout_end(&p->fan, (int)p->pid, &p->end);
}

/* ---- SendSignal ---- */

/* A running process (background by pid or tag, foreground by pid), or
 * one whose leader exited with processes left in its cgroup (§9). */
static struct proc *proc_find_signalable(struct proc_table *t, const Pb__ProcessSelector *sel) {
  struct proc *p = proc_find(t, sel, 1);
  if (p) return p;
  if (sel->pid != 0)
    list_each(p, &t->fg, flink)
      if (p->state == PROC_RUNNING && p->pid == sel->pid) return p;
  list_each(p, &t->linger, llink) /* newest first */
    if (sel->pid != 0 ? p->pid == sel->pid : (p->background && strcmp(p->tag, sel->tag) == 0)) return p;
  return NULL;
}

/* process.all: every command's processes, in the pool (cgroup.kill or a
 * walk of every cgroup.procs); records outside any cgroup by group. */
struct proc_signal_all {
  rpc_call *c; /* NULL once canceled */
  int sig;
  int r;
};

static void proc_signal_all_run(void *data) {
  struct proc_signal_all *a = data;
  a->r = proc_cg_signal_all(a->sig);
}

static void proc_signal_all_done(void *data, int canceled) {
  struct proc_signal_all *a = data;
  if (a->sig == SIGKILL) proc_cg_spare_discard();
  if (a->c) {
    rpc_set_user(a->c, NULL);
    LOG_INFO("signal sent to every command signal=%d result=%d", a->sig, a->r);
    Pb__SendSignalResponse resp = PB__SEND_SIGNAL_RESPONSE__INIT;
    rpc_finish(a->c, rpc_send(a->c, &resp.base) == 0 ? RPC_OK : RPC_INTERNAL, NULL);
  }
  free(a);
}

static void proc_signal_cancel(rpc_call *c, rpc_code why) {
  struct proc_signal_all *a = rpc_user(c);
  if (a) a->c = NULL; /* the job runs on; its done frees it */
}

static void proc_signal_all(rpc_call *c, int sig) {
  struct proc_table *t = proc_tab;
  struct proc *p;
  list_each(p, &t->table, tlink)
    if (p->state == PROC_RUNNING && !p->cg) kill(-p->pid, sig);
  list_each(p, &t->fg, flink)
    if (p->state == PROC_RUNNING && !p->cg) kill(-p->pid, sig);
  struct proc_signal_all *a = proc_cg_enabled() ? calloc(1, sizeof *a) : NULL;
  if (a) {
    a->c = c;
    a->sig = sig;
    rpc_set_user(c, a);
    if (rpc_work_submit(NULL, proc_signal_all_run, proc_signal_all_done, a)) return;
    rpc_set_user(c, NULL);
    free(a);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (proc_cg_enabled()) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  Pb__SendSignalResponse resp = PB__SEND_SIGNAL_RESPONSE__INIT;
  rpc_finish(c, rpc_send(c, &resp.base) == 0 ? RPC_OK : RPC_INTERNAL, NULL);
}

static void proc_signal_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__SendSignalRequest *req = (const Pb__SendSignalRequest *)m;
  char msg[128];
  int all = req->process && req->process->all;
  rpc_code code = all ? RPC_OK : proc_validate_selector(req->process, msg, sizeof msg);
  if (code == RPC_OK) code = proc_validate_signal(req->signal, msg, sizeof msg);
  if (code != RPC_OK) {
    rpc_finish(c, code, msg);
    return;
  }
  if (all) {
    proc_signal_all(c, req->signal);
    return;
  }
  struct proc *p = proc_find_signalable(proc_tab, req->process);
  if (!p) {
    proc_finish_not_found(c, req->process);
    return;
  }
  int r = proc_signal(p, req->signal);
  if (r == -ESRCH) {
    proc_finish_not_found(c, req->process);
    return;
  }
  if (r != 0) {
    char eb[96];
    rpc_finishf(c, RPC_INTERNAL, "failed to send signal: %s", proc_errstr(-r, eb, sizeof eb));
    return;
  }
  LOG_INFO("signal sent pid=%d tag=%s signal=%d", (int)p->pid, p->tag, (int)req->signal);
  Pb__SendSignalResponse resp = PB__SEND_SIGNAL_RESPONSE__INIT;
  rpc_finish(c, rpc_send(c, &resp.base) == 0 ? RPC_OK : RPC_INTERNAL, NULL);
}

/* ---- cancel ---- */
static void proc_on_cancel(rpc_call *c, rpc_code why) {
  struct proc_sub *s = rpc_user(c);
  if (!s) return;
  /* foreground: the client went away; not when its token was replaced
   * (api.md §4: running processes are not touched) */
  if (s->lossless && why != RPC_UNAUTHENTICATED) proc_starter_gone(proc_of_sub(s), why);
  proc_sub_remove(s);
}

static const rpc_method proc_methods[] = {
    {"/pb.ProcessService/StartProcess", RPC_SERVER_STREAM, &pb__start_process_request__descriptor,
     &pb__process_event__descriptor, RPC_F_OWN_DEADLINE, proc_start_on_request, NULL, NULL,
     proc_on_cancel},
    {"/pb.ProcessService/Connect", RPC_SERVER_STREAM, &pb__connect_process_request__descriptor,
     &pb__process_event__descriptor, RPC_F_DRAIN_END, proc_connect_on_request, NULL, NULL, proc_on_cancel},
    {"/pb.ProcessService/List", RPC_UNARY, &pb__list_processes_request__descriptor,
     &pb__list_processes_response__descriptor, 0, proc_list_on_request, NULL, NULL,
     proc_list_cancel},
    {"/pb.ProcessService/SendSignal", RPC_UNARY, &pb__send_signal_request__descriptor,
     &pb__send_signal_response__descriptor, 0, proc_signal_on_request, NULL, NULL,
     proc_signal_cancel},
};

/* §6's four and §9's input calls (proc/input.c), in one array for the router. */
static rpc_method proc_all_methods[sizeof proc_methods / sizeof proc_methods[0] + 4];

const rpc_method *proc_service_methods(size_t *n) {
  size_t a = sizeof proc_methods / sizeof proc_methods[0];
  memcpy(proc_all_methods, proc_methods, sizeof proc_methods);
  memcpy(proc_all_methods + a, proc_input_methods, sizeof proc_input_methods);
  *n = a + 4;
  return proc_all_methods;
}

static uint64_t proc_env_ms(const char *name, uint64_t def) {
  const char *v = getenv(name);
  if (!v || !*v) return def;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  return *end ? def : (uint64_t)x;
}

int proc_init(uv_loop_t *loop) {
  if (proc_tab) return 0;
  int e = proc_table_init(loop, proc_env_ms("CONCH_PROC_KEEPALIVE_MS", PROC_KEEPALIVE_MS),
                          proc_env_ms("CONCH_PROC_RETAIN_MS", PROC_RETAIN_MS), proc_input_open,
                          proc_input_shutdown);
  if (e) return e;

  umask(022);
  /* Standalone (not PID 1): become the reaper of our descendants' orphans,
   * as PID 1 is, so they never linger as zombies of someone else. */
  if (getpid() != 1) prctl(PR_SET_CHILD_SUBREAPER, 1);
  /* PID 1 sets its cgroups up after the boot mounts (init/pid1.c) */
  const char *cgv = getenv("CONCH_PROC_CGROUPS");
  if (getpid() != 1 && !(cgv && strcmp(cgv, "0") == 0)) proc_cg_init(loop, 0);
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGPIPE, &sa, NULL);
  }
  return 0;
}

/* ---- stop (serve's SIGTERM/SIGINT) ---- */

static struct {
  uv_timer_t timer;
  int phase; /* 0 idle, 1 SIGTERM sent, 2 SIGKILL sent, 3 done */
  uint64_t since;
  void (*done)(void);
} proc_stopping;

/* 1 while a command starts, runs or has processes left in its cgroup. */
static int proc_stop_live(void) {
  struct proc_table *t = proc_tab;
  if (!list_empty(&t->linger)) return 1;
  struct proc *p;
  list_each(p, &t->all, alink) if (p->state == PROC_PREP || p->state == PROC_RUNNING) return 1;
  return 0;
}

static void proc_stop_cg_run(void *data) { proc_cg_signal_all((int)(intptr_t)data); }
static void proc_stop_cg_done(void *data, int canceled) {}

/* sig to every command: its cgroup's processes (SIGKILL: the base's
 * cgroup.kill), or its process group while its leader runs. */
static void proc_stop_signal(int sig) {
  struct proc *p;
  list_each(p, &proc_tab->all, alink) if (p->state == PROC_RUNNING && !p->cg) kill(-p->pid, sig);
  if (proc_cg_enabled()) rpc_work_submit(NULL, proc_stop_cg_run, proc_stop_cg_done, (void *)(intptr_t)sig);
}

static void proc_stop_tick(uv_timer_t *h) {
  uint64_t now = uv_now(h->loop);
  int live = proc_stop_live();
  if (live && proc_stopping.phase == 1 && now - proc_stopping.since >= PROC_STOP_GRACE_MS) {
    LOG_INFO("stopping: commands still running after %d ms: SIGKILL", PROC_STOP_GRACE_MS);
    proc_stop_signal(SIGKILL);
    proc_stopping.phase = 2;
    proc_stopping.since = now;
    return;
  }
  if (live && !(proc_stopping.phase == 2 && now - proc_stopping.since >= PROC_STOP_KILL_WAIT_MS)) return;
  uv_timer_stop(h);
  uv_close((uv_handle_t *)h, NULL);
  proc_stopping.done();
}

int proc_stop(void (*done)(void)) {
  if (proc_stopping.phase) return -1;
  if (!proc_tab || !proc_stop_live()) {
    proc_stopping.phase = 3; /* done */
    done();
    return 0;
  }
  proc_stopping.done = done;
  proc_stopping.phase = 1;
  proc_stopping.since = uv_now(proc_tab->loop);
  LOG_INFO("stopping: SIGTERM to every command");
  proc_stop_signal(SIGTERM);
  uv_timer_init(proc_tab->loop, &proc_stopping.timer);
  uv_timer_start(&proc_stopping.timer, proc_stop_tick, 20, 20);
  return 0;
}

uint64_t proc_started_total(void) { return proc_tab ? proc_tab->started : 0; }

/* Counted when asked (a scrape), not at each start and exit. */
unsigned proc_running(void) {
  unsigned n = 0;
  struct proc *p;
  if (proc_tab)
    list_each(p, &proc_tab->all, alink) n += p->state == PROC_RUNNING;
  return n;
}
