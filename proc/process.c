/* process — the lifecycle of process records, the one owner of it: the
 * table, creation, state changes, exit, end, retention and removal; see
 * proc.h.  Events go out through the record's fanout (fanout.h). */
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/log.h"
#include "proc/reaper.h"
#include "proc/cgroup.h"
#include "proc/exitfmt.h"
#include "proc/prep.h"
#include "proc/proc.h"
#include "proc/spawn.h"

static void proc_on_close(uv_handle_t *h);
static void proc_check_end(struct proc *p);

struct proc_table *proc_tab;

int proc_table_init(uv_loop_t *loop, uint64_t keepalive_ms, uint64_t retain_ms,
                    int (*input_open)(struct proc *, int), void (*input_shutdown)(struct proc *)) {
  if (proc_tab) return 0;
  struct proc_table *t = calloc(1, sizeof *t);
  if (!t) return UV_ENOMEM;
  t->loop = loop;
  t->keepalive_ms = keepalive_ms;
  t->retain_ms = retain_ms;
  t->input_open = input_open;
  t->input_shutdown = input_shutdown;
  proc_tab = t;
  return 0;
}

struct proc *proc_of_sub(const struct proc_sub *s) {
  return (struct proc *)((char *)s->f - offsetof(struct proc, fan));
}

/* The fanout's callbacks: flow control of the lossless subscriber, and a
 * subscriber gone (the record may be free to go). */
static void proc_on_flow(struct proc_fanout *f, int paused) {
  struct proc *p = (struct proc *)((char *)f - offsetof(struct proc, fan));
  if (paused || p->paused) proc_pause(p, paused);
}

static void proc_on_sub_left(struct proc_fanout *f) {
  proc_check_free((struct proc *)((char *)f - offsetof(struct proc, fan)));
}

struct proc *proc_new(struct proc_table *t) {
  struct proc *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->t = t;
  proc_fanout_init(&p->fan, t->loop, t->keepalive_ms, proc_on_flow, proc_on_sub_left);
  p->state = PROC_PREP;
  p->pid = 0;
  p->spawn_rc = 1; /* nothing spawned yet */
  p->in_fd = -1;
  uv_timer_init(t->loop, &p->timer);
  p->timer.data = p;
  uv_timer_init(t->loop, &p->grace);
  p->grace.data = p;
  p->handles = 2;
  t->nrecords++;
  list_insert_head(&t->all, &p->alink);
  return p;
}

/* ---- retained output (api.md §9) ---- */
static void proc_rings_free(struct proc *p) {
  for (int i = 0; i < p->nout; i++) {
    p->t->ring_mem -= p->out[i].ring.mem;
    proc_ring_clear(&p->out[i].ring);
  }
}

static int proc_ring_cmp(const void *a, const void *b) {
  size_t x = (*(struct proc_ring *const *)a)->mem, y = (*(struct proc_ring *const *)b)->mem;
  return x < y ? 1 : x > y ? -1 : 0;
}

/* Over the budget: down to PROC_RING_SLACK below it.  First the rings of
 * ended records, oldest first; then the largest rings are cut to one
 * level L (block by block: each ends at or below it), the lowest L that
 * brings the total there. */
static void proc_ring_budget(struct proc_table *t) {
  size_t target = PROC_RING_BUDGET - PROC_RING_SLACK;
  size_t k = 0;
  struct proc *q;
  list_each(q, &t->table, tlink) {
    if (t->ring_mem <= target) break;
    if (q->state == PROC_ENDED) proc_rings_free(q);
    else k += (size_t)q->nout;
  }
  if (t->ring_mem <= target) return;
  struct proc_ring **r = malloc((k + 1) * sizeof *r);
  if (!r) { /* cannot choose: give all of it back rather than pass the budget */
    LOG_WARN("out of memory: dropping all retained output");
    list_each(q, &t->table, tlink) proc_rings_free(q);
    return;
  }
  size_t n = 0, total = 0;
  list_each(q, &t->table, tlink)
    for (int i = 0; i < q->nout; i++)
      if (q->out[i].ring.mem) {
        r[n++] = &q->out[i].ring;
        total += q->out[i].ring.mem;
      }
  qsort(r, n, sizeof *r, proc_ring_cmp);
  /* the top i rings cut to the next one's size leave rest + i * next */
  size_t top = 0, level = 0, i = 0;
  while (i < n) {
    top += r[i]->mem;
    i++;
    size_t next = i < n ? r[i]->mem : 0;
    if (total - top + i * next <= target) {
      level = (target - (total - top)) / i;
      break;
    }
  }
  for (size_t j = 0; j < i; j++) {
    size_t before = r[j]->mem;
    while (r[j]->mem > level) proc_ring_drop(r[j]);
    t->ring_mem -= before - r[j]->mem;
  }
  LOG_DEBUG("retained output over budget: %zu of %zu rings cut to %zu bytes, %zu bytes kept", i, n, level,
            t->ring_mem);
  free(r);
}

/* A background output event into its channel's ring. */
static void proc_retain(struct proc *p, struct proc_out *o, const uint8_t *buf, size_t n) {
  struct proc_table *t = p->t;
  size_t before = o->ring.mem;
  if (proc_ring_append(&o->ring, o->offset, buf, n, PROC_RING_MAX) != 0)
    LOG_WARN("out of memory: output of pid=%d no longer retained before offset %llu", (int)p->pid,
             (unsigned long long)o->offset);
  t->ring_mem = t->ring_mem - before + o->ring.mem;
  if (t->ring_mem > PROC_RING_BUDGET) proc_ring_budget(t);
}

static const struct proc_out *proc_out_of(const struct proc *p, int kind) {
  for (int i = 0; i < p->nout; i++)
    if (p->out[i].kind == kind) return &p->out[i];
  return NULL;
}

uint64_t proc_out_total(const struct proc *p, int kind) {
  const struct proc_out *o = proc_out_of(p, kind);
  return o ? o->offset : 0;
}

void proc_replay(struct proc *p, struct proc_sub *s, const uint64_t from[3]) {
  for (int kind = PROC_OUT_STDOUT; kind <= PROC_OUT_PTY; kind++) {
    const struct proc_out *o = proc_out_of(p, kind);
    if (!o) continue;
    for (struct proc_ring_blk *b = o->ring.head; b; b = b->next) {
      if (b->off + b->len <= from[kind]) continue;
      size_t skip = from[kind] > b->off ? (size_t)(from[kind] - b->off) : 0;
      proc_sub_send_replay(s, kind, b->data + skip, b->len - skip, b->off + skip, proc_ring_blk_ref(b));
    }
  }
}

static void proc_free(struct proc *p) {
  free(p->tag);
  free(p->cmd);
  if (p->args_block)
    free(p->args_block);
  else
    for (size_t i = 0; i < p->nargs; i++) free(p->args[i]);
  free(p->args);
  free(p->env_kblock);
  free(p->env_vblock);
  free(p->env_keys);
  free(p->env_vals);
  free(p->base_env);
  free(p->home);
  rpc_ident_release(p->ident);
  if (p->req) protobuf_c_message_free_unpacked((ProtobufCMessage *)p->req, NULL);
  free(p->cwd);
  if (p->script) close(p->script_dfd); /* never removed: out of memory */
  free(p->script);
  free(p->content);
  free(p->stdin_buf);
  budget_give(p->stdin_budget);
  free(p->envp);
  free(p->buf);
  proc_rings_free(p);
  proc_cg_release(p->cg); /* never started (PREP failure) */
  p->t->nrecords--;
  list_remove(&p->alink);
  free(p);
}

void proc_check_free(struct proc *p) {
  if (p->released && p->handles == 0 && !p->work_pending && p->fan.nsubs == 0 && !list_linked(&p->tlink) &&
      p->ninputs == 0 && p->pins == 0 && !p->acct_pending && !p->lingering)
    proc_free(p);
}

void proc_pin(struct proc *p) { p->pins++; }

void proc_unpin(struct proc *p) {
  p->pins--;
  proc_check_free(p);
}

static void proc_on_close(uv_handle_t *h) {
  struct proc *p = h->data;
  p->handles--;
  proc_check_free(p);
}

void proc_table_add(struct proc *p) {
  if (!list_linked(&p->tlink)) list_insert_tail(&p->t->table, &p->tlink);
}

static void proc_table_unlink(struct proc *p) {
  if (!list_linked(&p->tlink)) return;
  struct proc_table *t = p->t;
  if (p->retained) {
    p->retained = 0;
    t->nretained--;
  }
  list_remove(&p->tlink);
}

void proc_release(struct proc *p) {
  if (p->released) return;
  p->released = 1;
  proc_rings_free(p); /* retention lives as long as the record is findable */
  proc_table_unlink(p);
  proc_fg_unlink(p);
  p->t->input_shutdown(p);
  if (!uv_is_closing((uv_handle_t *)&p->timer)) uv_close((uv_handle_t *)&p->timer, proc_on_close);
  if (!uv_is_closing((uv_handle_t *)&p->grace)) uv_close((uv_handle_t *)&p->grace, proc_on_close);
  /* outputs still open are discarding a grandchild's output until EOF */
  proc_check_free(p);
}

/* ---- script removal on the thread pool ---- */
struct proc_unlink_work {
  char *path;
  int dfd; /* the script's directory: a cwd renamed meanwhile still finds it */
};
static void proc_unlink_run(void *data) {
  struct proc_unlink_work *u = data;
  int r = proc_script_unlink(u->dfd, u->path);
  if (r != 0) LOG_WARN("cannot remove script path=%s errno=%d", u->path, -r);
}
static void proc_unlink_done(void *data, int canceled) {
  struct proc_unlink_work *u = data;
  if (canceled) proc_unlink_run(u); /* no thread could take it: here */
  free(u->path);
  free(u);
}
void proc_remove_script(struct proc *p) {
  if (!p->script) return;
  struct proc_unlink_work *u = calloc(1, sizeof *u);
  if (!u) return; /* ENOMEM: the file stays (logged by nobody: nothing to log with) */
  u->path = p->script;
  u->dfd = p->script_dfd;
  p->script = NULL;
  if (!rpc_work_submit(NULL, proc_unlink_run, proc_unlink_done, u)) {
    close(u->dfd);
    free(u->path);
    free(u);
  }
}

int proc_signal(struct proc *p, int sig) {
  if (p->pid <= 0) return -ESRCH;
  if (p->cg) return proc_cg_signal(p->cg, sig); /* after the reap too: what is left of the tree */
  if (p->reaped) return -ESRCH;
  if (kill(-p->pid, sig) != 0) return -errno;
  return 0;
}

/* ---- outputs ---- */
static void proc_out_close(struct proc_out *o) {
  if (!o->open) return;
  o->open = 0;
  o->done = 1;
  o->reading = 0;
  uv_close((uv_handle_t *)&o->h, proc_on_close);
  close(o->fd); /* safe: uv_close() already took it out of epoll */
  o->fd = -1;
}

static void proc_out_read_start(struct proc_out *o);

void proc_pause(struct proc *p, int paused) {
  p->paused = paused;
  for (int i = 0; i < p->nout; i++) {
    struct proc_out *o = &p->out[i];
    if (!o->open) continue;
    if (paused && !o->done) {
      if (o->reading) uv_poll_stop(&o->h);
      o->reading = 0;
    } else {
      proc_out_read_start(o);
    }
  }
}

/* Reads per readiness callback before yielding to the rest of the loop. */
#define PROC_READS_PER_WAKE 16

/* Our own read loop rather than uv_read_start(): libuv's stream layer takes
 * POLLHUP after a short read as EOF, which is right for a pipe but loses
 * data on a PTY master (the slave closed while bytes are still queued in
 * the tty layer).  Here EOF is a read() of 0, or EIO from a PTY master. */
static void proc_on_readable(uv_poll_t *h, int status, int events) {
  struct proc_out *o = (struct proc_out *)h;
  struct proc *p = o->p;
  size_t cap = p->has_pty ? PROC_PTY_READ_MAX : PROC_READ_MAX;
  for (int i = 0; i < PROC_READS_PER_WAKE && o->open; i++) {
    uint8_t *direct = !o->done && proc_fanout_direct(&p->fan) ? malloc(PROC_HEADROOM + cap) : NULL;
    ssize_t n = read(o->fd, direct ? (char *)direct + PROC_HEADROOM : p->buf, cap);
    if (direct && n <= 0) free(direct);
    if (n > 0) {
      if (p->state == PROC_EXITED) o->read_since_exit += (uint64_t)n;
      uint64_t at = o->offset;
      if (direct) {
        o->offset += (uint64_t)n;
        proc_fanout_data_packed(&p->fan, o->kind, direct, (size_t)n, at);
      } else if (!o->done) {
        if (p->background) proc_retain(p, o, (const uint8_t *)p->buf, (size_t)n);
        o->offset += (uint64_t)n;
        proc_fanout_data(&p->fan, o->kind, p->buf, (size_t)n, at);
      }
      if (!o->reading) return; /* paused by flow control */
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n < 0 && errno != EIO)
      LOG_DEBUG("process output read error pid=%d errno=%d", (int)p->pid, errno);
    proc_out_close(o);
    proc_check_end(p);
    return;
  }
}

static void proc_out_read_start(struct proc_out *o) {
  if (!o->open || o->reading) return;
  if (uv_poll_start(&o->h, UV_READABLE, proc_on_readable) == 0) o->reading = 1;
}

static int proc_out_open(struct proc *p, int idx, int fd, int kind) {
  struct proc_out *o = &p->out[idx];
  o->p = p;
  o->kind = kind;
  o->fd = fd;
  if (uv_poll_init(p->t->loop, &o->h, fd) != 0) {
    close(fd);
    o->fd = -1;
    o->done = 1;
    return -1;
  }
  o->h.data = p;
  p->handles++;
  o->open = 1;
  proc_out_read_start(o);
  return 0;
}

/* ---- end ---- */
static void proc_on_retention_end(uv_timer_t *h) {
  struct proc *p = h->data;
  if (p->lingering) return; /* restarted when its cgroup empties (api.md §9: "plus 60 s") */
  proc_release(p);
}

/* ---- the linger list: leader reaped, processes left ---- */
static void proc_linger_link(struct proc *p) {
  p->lingering = 1;
  list_insert_head(&p->t->linger, &p->llink);
}

static void proc_linger_unlink(struct proc *p) {
  if (!p->lingering) return;
  list_remove(&p->llink);
  p->lingering = 0;
}

static uint64_t proc_tv_usec(struct timeval tv) { return (uint64_t)tv.tv_sec * 1000000u + (uint64_t)tv.tv_usec; }

/* The pool read the cgroup's accounting: it replaces wait4's figures. */
static void proc_on_cg_exit(void *arg, const proc_cg_usage *u, int lingering) {
  struct proc *p = arg;
  if (u->have_cpu) {
    p->end.cpu_user_usec = u->user_usec;
    p->end.cpu_system_usec = u->system_usec;
  }
  if (u->have_memory) p->end.memory_peak = u->memory_peak;
  p->end.oom_killed = u->oom_killed;
  p->end.left_running = u->nprocs;
  p->acct_pending = 0;
  if (lingering) {
    proc_linger_link(p);
    LOG_INFO("process leader exited with processes left pid=%d left_running=%d", (int)p->pid, u->nprocs);
  } else {
    p->cg = NULL;
  }
  proc_check_end(p);
  proc_check_free(p);
}

static void proc_on_cg_empty(void *arg) {
  struct proc *p = arg;
  p->cg = NULL;
  proc_linger_unlink(p);
  if (p->retained && !p->released) uv_timer_start(&p->timer, proc_on_retention_end, p->t->retain_ms, 0);
  proc_check_free(p);
}

void proc_usage_now(struct proc_cg *cg, pid_t pid, proc_end_info *u) {
  memset(u, 0, sizeof *u);
  if (cg) {
    proc_cg_usage cu;
    proc_cg_read_usage(cg, &cu);
    u->cpu_user_usec = cu.user_usec;
    u->cpu_system_usec = cu.system_usec;
    u->memory_peak = cu.memory_peak;
    u->oom_killed = cu.oom_killed;
    if (cu.have_cpu && cu.have_memory) return;
  }
  /* the leader alone, from /proc: utime and stime (fields 14, 15), VmHWM */
  char path[64], b[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "re");
  if (!f) return;
  size_t n = fread(b, 1, sizeof b - 1, f);
  fclose(f);
  b[n] = 0;
  const char *e = strrchr(b, ')'); /* the command name may hold anything */
  unsigned long long ut = 0, st = 0;
  long hz = sysconf(_SC_CLK_TCK);
  if (e && hz > 0 &&
      sscanf(e + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) == 2 &&
      !(cg && u->cpu_user_usec + u->cpu_system_usec)) {
    u->cpu_user_usec = ut * 1000000u / (unsigned long long)hz;
    u->cpu_system_usec = st * 1000000u / (unsigned long long)hz;
  }
  if (u->memory_peak) return;
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  f = fopen(path, "re");
  if (!f) return;
  while (fgets(b, sizeof b, f))
    if (strncmp(b, "VmHWM:", 6) == 0) {
      u->memory_peak = strtoull(b + 6, NULL, 10) * 1024;
      break;
    }
  fclose(f);
}

static void proc_end(struct proc *p) {
  p->state = PROC_ENDED;
  uv_timer_stop(&p->grace);
  uint64_t dropped = proc_fanout_dropped(&p->fan);
  proc_exit_info ei;
  proc_exit_describe(p->wstatus, &ei);
  LOG_INFO("process ended pid=%d tag=%s background=%d exit_code=%d error=\"%s\" dropped_events=%llu "
           "oom_killed=%d left_running=%d",
           (int)p->pid, p->tag ? p->tag : "", p->background, (int)ei.exit_code, ei.error,
           (unsigned long long)dropped, p->end.oom_killed, p->end.left_running);
  proc_fanout_end(&p->fan, (int)p->pid, &p->end);
  if (p->background && list_linked(&p->tlink) && p->t->retain_ms > 0) {
    struct proc_table *t = p->t;
    struct proc *q;
    if (t->nretained >= PROC_RETAIN_MAX) /* the oldest retained record goes early */
      list_each(q, &t->table, tlink)
        if (q->retained) {
          proc_release(q);
          break;
        }
    p->retained = 1;
    t->nretained++;
    uv_timer_start(&p->timer, proc_on_retention_end, p->t->retain_ms, 0);
  } else {
    proc_release(p);
  }
}

static int proc_outputs_done(struct proc *p) {
  for (int i = 0; i < p->nout; i++)
    if (!p->out[i].done) return 0;
  return 1;
}

static void proc_check_end(struct proc *p) {
  if (p->state == PROC_EXITED && proc_outputs_done(p) && !p->acct_pending) proc_end(p);
}

static int64_t proc_fd_pending(struct proc_out *o) {
  int n = 0;
  if (o->fd < 0 || ioctl(o->fd, FIONREAD, &n) != 0) return 0;
  return n;
}

static void proc_on_grace(uv_timer_t *h) {
  struct proc *p = h->data;
  uint64_t since = uv_now(p->t->loop) - p->exit_ms;
  for (int i = 0; i < p->nout; i++) {
    struct proc_out *o = &p->out[i];
    if (o->done || !o->open) continue;
    if (p->paused) continue; /* the client reads slowly: keep every byte */
    int64_t pending = proc_fd_pending(o);
    /* Silent = nothing buffered and nothing read since the last tick.  A
     * PTY needs two such ticks: its master's FIONREAD does not count bytes
     * still in the tty flip buffer (moved by a kernel worker after reads). */
    if (pending == 0 && o->read_since_exit == o->read_at_tick)
      o->silent_ticks++;
    else
      o->silent_ticks = 0;
    o->read_at_tick = o->read_since_exit;
    if (o->silent_ticks >= (o->kind == PROC_OUT_PTY ? 2 : 1) ||
        (since >= PROC_EXIT_LINGER_MS && o->read_since_exit >= (uint64_t)o->pending_at_exit)) {
      o->done = 1; /* quiet: from now on read and discard until EOF */
      LOG_DEBUG("output quiet pid=%d kind=%d pending=%lld read=%llu since=%llu", (int)p->pid, o->kind, (long long)pending, (unsigned long long)o->read_since_exit, (unsigned long long)since);
      proc_out_read_start(o);
    }
  }
  if (proc_outputs_done(p) && !p->acct_pending) {
    uv_timer_stop(&p->grace);
    proc_end(p);
  }
}

static void proc_on_exit(pid_t pid, int wstatus, const struct rusage *ru, void *arg) {
  struct proc *p = arg;
  p->reaped = 1;
  p->wstatus = wstatus;
  p->end.wstatus = wstatus;
  p->end.cpu_user_usec = proc_tv_usec(ru->ru_utime);
  p->end.cpu_system_usec = proc_tv_usec(ru->ru_stime);
  p->end.memory_peak = (uint64_t)ru->ru_maxrss * 1024;
  p->state = PROC_EXITED;
  p->exit_ms = uv_now(p->t->loop);
  p->finished_at = time(NULL);
  uv_timer_stop(&p->timer);
  /* DECISION (api.md §6 timeouts): a timeout bounds the whole tree, so a
   * deadline still ahead goes with the cgroup and kills the leftovers */
  uint64_t left = 0;
  if (p->timeout_ms > 0 && !p->timed_out)
    left = p->deadline_at > p->exit_ms ? p->deadline_at - p->exit_ms : 1;
  proc_fg_unlink(p);
  p->t->input_shutdown(p); /* input calls waiting for bytes fail; no more input */
  proc_remove_script(p);
  for (int i = 0; i < p->nout; i++) {
    struct proc_out *o = &p->out[i];
    if (o->open && !o->done) o->pending_at_exit = proc_fd_pending(o);
  }
  if (!proc_outputs_done(p))
    uv_timer_start(&p->grace, proc_on_grace, PROC_EXIT_GRACE_MS, PROC_EXIT_GRACE_MS);
  if (p->cg) {
    p->acct_pending = 1; /* the end waits for proc_on_cg_exit (maybe called at once) */
    proc_cg_exited(p->cg, left, proc_on_cg_exit, proc_on_cg_empty, p);
  } else {
    proc_check_end(p);
  }
}

static void proc_on_timeout(uv_timer_t *h) {
  struct proc *p = h->data;
  if (p->state != PROC_RUNNING) return;
  p->timed_out = 1;
  int r = proc_signal(p, SIGKILL);
  LOG_INFO("process timed out pid=%d timeout_ms=%lld kill=%d", (int)p->pid, (long long)p->timeout_ms, r);
  if (!p->background) {
    /* foreground: no end event, the stream ends with deadline_exceeded */
    proc_fanout_fail(&p->fan, RPC_DEADLINE_EXCEEDED, "process execution timed out: context deadline exceeded");
  }
}

void proc_launch_spawn(struct proc *p) {
  size_t argc = p->nargs + 1;
  char **argv = calloc(argc + 1, sizeof *argv);
  p->buf = malloc(PROC_READ_MAX);
  if (!argv || !p->buf) {
    free(argv);
    snprintf(p->spawn_err, sizeof p->spawn_err, "fork/exec %s: cannot allocate memory", p->exe);
    p->spawn_rc = -1;
    return;
  }
  argv[0] = p->cmd;
  for (size_t i = 0; i < p->nargs; i++) argv[i + 1] = p->args[i];
  proc_spawn_opts o = {
      .path = p->exe,
      .argv = argv,
      .envp = p->envp,
      .cwd = p->cwd,
      .pty = p->has_pty,
      .cols = (unsigned short)p->cols,
      .rows = (unsigned short)p->rows,
      .has_stdin = p->stdin_len > 0 || p->stdin_open,
      .use_cgroup = proc_cg_fd(p->cg) >= 0,
      .cgroup_fd = proc_cg_fd(p->cg),
      .inflight_pid = &p->inflight.pid,
  };
  const rpc_ident *id = p->ident;
  if (id && (id->uid || id->gid || id->ngroups)) { /* the child becomes the user (api.md §9) */
    o.set_ids = 1;
    o.uid = id->uid;
    o.gid = id->gid;
    o.ngroups = id->ngroups;
    o.groups = id->groups;
  }
  p->spawn_rc = proc_spawn(&o, &p->sr, p->spawn_err, sizeof p->spawn_err) == 0 ? 0 : -1;
  free(argv);
  free(p->envp);
  p->envp = NULL;
}

static void proc_on_failed_exec(pid_t pid, int wstatus, const struct rusage *ru, void *arg) {}

int proc_launch_finish(struct proc *p, char *err, size_t errn) {
  int st = 0;
  if (p->spawn_rc != 0) { /* the exec failed (its child is the reaper's) or nothing ran */
    if (reaper_inflight_claim(&p->inflight, proc_on_failed_exec, NULL, &st) < 0)
      LOG_WARN("cannot watch failed child pid=%d", (int)p->sr.failed_pid);
    snprintf(err, errn, "%s", p->spawn_err);
    return -1;
  }
  proc_spawn_result r = p->sr;
  int gone = reaper_inflight_claim(&p->inflight, proc_on_exit, p, &st);
  if (gone < 0) {
    if (p->cg) proc_cg_signal(p->cg, SIGKILL); else kill(-r.pid, SIGKILL); /* reaped later as an orphan */
    if (r.in_w >= 0) close(r.in_w);
    if (r.out_r >= 0) close(r.out_r);
    if (r.err_r >= 0) close(r.err_r);
    snprintf(err, errn, "fork/exec %s: cannot allocate memory", p->exe);
    return -1;
  }
  if (p->cg && !r.in_cgroup) { /* (not with today's spawn) the process group it is */
    LOG_WARN("process not started in its cgroup pid=%d", (int)r.pid);
    proc_cg_release(p->cg);
    p->cg = NULL;
  }
  p->pid = r.pid;
  p->state = PROC_RUNNING;
  p->t->started++;
  p->started_at = time(NULL);
  if (p->has_pty) {
    p->nout = 1;
    proc_out_open(p, 0, r.out_r, PROC_OUT_PTY);
  } else {
    p->nout = 2;
    proc_out_open(p, 0, r.out_r, PROC_OUT_STDOUT);
    proc_out_open(p, 1, r.err_r, PROC_OUT_STDERR);
  }
  p->t->input_open(p, r.in_w); /* ENOMEM: the one-shot bytes are lost, EOF as before */
  if (!p->background) proc_fg_link(p);
  if (p->timeout_ms > 0) {
    p->deadline_at = uv_now(p->t->loop) + (uint64_t)p->timeout_ms;
    uv_timer_start(&p->timer, proc_on_timeout, (uint64_t)p->timeout_ms, 0);
  }
  if (gone == 1) proc_on_exit(r.pid, st, &p->inflight.ru, p); /* it exited before we could watch it */
  return 0;
}

void proc_start_fail(struct proc *p, rpc_code code, const char *msg) {
  proc_remove_script(p);
  proc_fanout_fail(&p->fan, code, msg);
  proc_release(p);
}

void proc_starter_gone(struct proc *p, rpc_code why) {
  if (p->state == PROC_PREP) {
    p->aborted = 1;
  } else if (p->state == PROC_RUNNING) {
    int r = proc_signal(p, SIGKILL);
    LOG_INFO("foreground client gone, killing process group pid=%d why=%s kill=%d", (int)p->pid,
             rpc_code_name(why), r);
  }
}

/* ---- foreground list ---- */
void proc_fg_link(struct proc *p) {
  if (!list_linked(&p->flink)) list_insert_head(&p->t->fg, &p->flink);
}

void proc_fg_unlink(struct proc *p) { list_remove(&p->flink); }

/* ---- upgrade in place ---- */
void proc_resume(struct proc *p, uint64_t deadline_left, uint64_t cg_deadline_left, uint64_t retain_left) {
  struct proc_table *t = p->t;
  p->background = 1;
  if (!p->buf) p->buf = malloc(PROC_READ_MAX);
  proc_table_add(p);
  for (int i = 0; i < p->nout; i++) {
    struct proc_out *o = &p->out[i];
    int fd = o->fd;
    o->fd = -1;
    if (fd > 0 && p->buf) proc_out_open(p, i, fd, o->kind); /* done ones are read and discarded until EOF */
    else o->done = 1;
  }
  if (p->state == PROC_RUNNING) {
    int in = p->in_fd;
    p->in_fd = -1;
    if (t->input_open(p, p->has_pty ? -1 : in) != 0) LOG_WARN("pending input of pid=%d lost", (int)p->pid);
    if (reaper_watch(p->pid, proc_on_exit, p) != 0) LOG_ERROR("cannot watch pid=%d after the upgrade", (int)p->pid);
    if (p->timeout_ms > 0 && !p->timed_out) {
      p->deadline_at = uv_now(t->loop) + deadline_left;
      uv_timer_start(&p->timer, proc_on_timeout, deadline_left ? deadline_left : 1, 0);
    }
    return;
  }
  if (p->lingering) { /* its cgroup still holds processes */
    p->lingering = 0;
    proc_linger_link(p);
    proc_cg_adopt_lingering(p->cg, cg_deadline_left, proc_on_cg_empty, p);
  } else if (p->cg) { /* (the leader was reaped: its cgroup went with the accounting) */
    proc_cg_release(p->cg);
    p->cg = NULL;
  }
  if (p->state == PROC_EXITED) {
    if (proc_outputs_done(p)) proc_check_end(p);
    else uv_timer_start(&p->grace, proc_on_grace, PROC_EXIT_GRACE_MS, PROC_EXIT_GRACE_MS);
    return;
  }
  /* ENDED: findable for what was left of its retention */
  p->retained = 1;
  t->nretained++;
  if (!p->lingering) uv_timer_start(&p->timer, proc_on_retention_end, retain_left ? retain_left : 1, 0);
}
