/* handover — the process table across an upgrade in place (core/handover.h,
 * proto/handover.proto; docs/guide/upgrade.md).
 *
 * Save (old program, loop, nothing in flight: proc_handover_busy() is 0):
 * every record but PREP ones goes into the state with what it needs to go
 * on — configuration, outputs (descriptor, offset, retained ring), input
 * (descriptor, the unwritten bytes), deadline, cgroup, exit status and
 * accounting, retention left.  Subscribers are not saved: their
 * connections close with the exec.  A foreground record is adopted: it
 * becomes a background one, its output retained from then on.
 *
 * Restore (new program) in two phases so that a rollback stays possible:
 * proc_handover_restore builds the records without any I/O; once every
 * part of the state was rebuilt, proc_handover_resume starts them
 * (proc_resume: reads, input, reaper, timers).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/handover.h"
#include "core/log.h"
#include "proc/cgroup.h"
#include "proc/input.h"
#include "proc/proc.h"
#include "proc/service.h"
#include "proto/handover.pb-c.h"

typedef Conch__Handover__Proc hproc;

int proc_handover_busy(void) {
  if (proc_cg_busy()) return 1;
  if (!proc_tab) return 0;
  struct proc *p;
  list_each(p, &proc_tab->all, alink)
    if ((p->state == PROC_PREP && !p->released) || p->work_pending || p->acct_pending) return 1;
  return 0;
}

/* ------------------------------------------------------------------ save */

static void ho_save_out(const struct proc *p, const struct proc_out *o, Conch__Handover__Output *m) {
  conch__handover__output__init(m);
  m->kind = (uint32_t)o->kind;
  m->fd = o->open ? o->fd : -1;
  m->done = o->done;
  m->offset = o->offset;
  m->read_since_exit = o->read_since_exit;
  m->pending_at_exit = o->pending_at_exit;
  size_t n = 0;
  for (const struct proc_ring_blk *b = o->ring.head; b; b = b->next) n++;
  if (!n) return;
  Conch__Handover__RingBlock *blk = calloc(n, sizeof *blk);
  m->ring = calloc(n, sizeof *m->ring);
  if (!blk || !m->ring) { /* out of memory: this ring is not carried */
    free(blk);
    free(m->ring);
    m->ring = NULL;
    LOG_WARN("upgrade: out of memory, retained output of pid=%d not carried", (int)p->pid);
    return;
  }
  size_t i = 0;
  for (struct proc_ring_blk *b = o->ring.head; b; b = b->next, i++) {
    conch__handover__ring_block__init(&blk[i]);
    blk[i].off = b->off;
    blk[i].data.data = b->data;
    blk[i].data.len = b->len;
    m->ring[i] = &blk[i];
  }
  m->n_ring = n;
}

static int ho_save_one(struct proc *p, hproc *m, uint64_t now_mono, uint64_t now_uv) {
  conch__handover__proc__init(m);
  m->state = p->state == PROC_RUNNING ? CONCH__HANDOVER__PROC__STATE__RUNNING
             : p->state == PROC_EXITED ? CONCH__HANDOVER__PROC__STATE__EXITED
                                       : CONCH__HANDOVER__PROC__STATE__ENDED;
  m->pid = p->pid;
  m->adopted = !p->background;
  m->tag = p->tag ? p->tag : "";
  m->cmd = p->cmd ? p->cmd : "";
  m->args = p->args;
  m->n_args = p->nargs;
  m->env_keys = p->env_keys;
  m->n_env_keys = p->nenv;
  m->env_vals = p->env_vals;
  m->n_env_vals = p->nenv;
  m->cwd = p->cwd ? p->cwd : "";
  if (p->ident && !p->ident->implicit) {
    m->user = (char *)p->ident->name;
    m->uid = p->ident->uid;
    m->gid = p->ident->gid;
  }
  m->started_at = p->started_at;
  m->pty = p->has_pty;
  m->cols = p->cols;
  m->rows = p->rows;
  Conch__Handover__Output *outs = calloc((size_t)p->nout + 1, sizeof *outs);
  m->out = calloc((size_t)p->nout + 1, sizeof *m->out);
  if (!outs || !m->out) {
    free(outs);
    free(m->out);
    return -1;
  }
  for (int i = 0; i < p->nout; i++) {
    ho_save_out(p, &p->out[i], &outs[i]);
    m->out[i] = &outs[i];
  }
  m->n_out = (size_t)p->nout;
  m->in_fd = p->in_open && !p->has_pty ? p->in_fd : -1;
  m->stdin_open = p->stdin_open;
  m->in_closed = p->in_closed;
  size_t pend = 0;
  m->pending_input.data = proc_input_pending(p, &pend);
  if (pend && !m->pending_input.data) return -1;
  m->pending_input.len = pend;
  m->timeout_ms = p->timeout_ms;
  m->timed_out = p->timed_out;
  if (p->state == PROC_RUNNING && p->timeout_ms > 0 && !p->timed_out)
    m->deadline_mono_ms = now_mono + (p->deadline_at > now_uv ? p->deadline_at - now_uv : 1);
  m->has_limits = p->has_limits;
  m->cgroup_fd = -1;
  if (p->cg) proc_cg_save_one(p->cg, m);
  m->lingering = p->lingering;
  m->reaped = p->reaped;
  m->wstatus = p->wstatus;
  if (p->state != PROC_RUNNING) m->exit_mono_ms = now_mono - (now_uv > p->exit_ms ? now_uv - p->exit_ms : 0);
  m->finished_at = p->finished_at;
  m->cpu_user_usec = p->end.cpu_user_usec;
  m->cpu_system_usec = p->end.cpu_system_usec;
  m->memory_peak = p->end.memory_peak;
  m->oom_killed = p->end.oom_killed;
  m->left_running = p->end.left_running;
  if (p->state == PROC_ENDED && uv_is_active((const uv_handle_t *)&p->timer))
    m->retain_until_mono_ms = now_mono + uv_timer_get_due_in(&p->timer) + 1;
  m->script = p->script;
  m->script_dfd = p->script ? p->script_dfd : -1;
  m->dropped = proc_fanout_dropped(&p->fan);
  return 0;
}

int proc_handover_save(Conch__Handover__State *st) {
  st->cgroups = calloc(1, sizeof *st->cgroups);
  if (!st->cgroups) return -1;
  conch__handover__cgroups__init(st->cgroups);
  proc_cg_save(st->cgroups);
  if (!proc_tab) return 0;
  size_t n = 0;
  struct proc *p;
  list_each(p, &proc_tab->all, alink) n++;
  hproc *recs = calloc(n + 1, sizeof *recs);
  st->procs = calloc(n + 1, sizeof *st->procs);
  if (!recs || !st->procs) {
    free(recs);
    return -1;
  }
  uint64_t now_mono = uv_hrtime() / 1000000u, now_uv = uv_now(proc_tab->loop);
  size_t k = 0;
  list_each(p, &proc_tab->all, alink) {
    if (p->state == PROC_PREP) {
      if (!p->released) LOG_WARN("upgrade: a command still starting is not carried (cmd=%s)", p->cmd ? p->cmd : "");
      continue;
    }
    if (p->released && !p->lingering) continue; /* going: nothing of it to carry */
    st->procs[k] = &recs[k];
    if (ho_save_one(p, &recs[k], now_mono, now_uv) != 0) {
      st->n_procs = k + 1; /* freed by proc_handover_save_free */
      return -1;
    }
    k++;
  }
  st->n_procs = k;
  return 0;
}

void proc_handover_save_free(Conch__Handover__State *st) {
  for (size_t i = 0; i < st->n_procs; i++) {
    hproc *m = st->procs[i];
    for (size_t j = 0; j < m->n_out; j++) {
      if (m->out[j]->n_ring) free(m->out[j]->ring[0]);
      free(m->out[j]->ring);
    }
    if (m->n_out) free(m->out[0]);
    free(m->out);
    free(m->pending_input.data);
  }
  if (st->n_procs) free(st->procs[0]);
  free(st->procs);
  free(st->cgroups);
  st->procs = NULL;
  st->n_procs = 0;
  st->cgroups = NULL;
}

/* --------------------------------------------------------------- restore */

int proc_handover_restore_cgroups(uv_loop_t *loop, const Conch__Handover__State *st) {
  return st->cgroups ? proc_cg_restore(loop, st->cgroups) : 0;
}

/* What phase 2 needs of each record. */
typedef struct ho_pending {
  struct proc *p;
  uint64_t deadline_left, cg_deadline_left, retain_left;
} ho_pending;
static ho_pending *ho_recs; /* one per record of the state; p NULL: not restored */
static size_t ho_nrecs;
static int ho_ran; /* proc_handover_restore ran (abandon: what ho_recs says was taken) */

static char *ho_strdup(const char *s) { return strdup(s ? s : ""); }

static char *ho_block(char **v, size_t n, char **out) {
  size_t total = 1;
  for (size_t i = 0; i < n; i++) total += strlen(v[i]) + 1;
  char *b = malloc(total), *at = b;
  if (!b) return NULL;
  for (size_t i = 0; i < n; i++) {
    size_t l = strlen(v[i]) + 1;
    memcpy(at, v[i], l);
    out[i] = at;
    at += l;
  }
  return b;
}

static int ho_restore_one(const hproc *m, uint64_t now_mono, ho_pending *hp) {
  struct proc_table *t = proc_tab;
  if (m->n_out > 2 || m->n_env_keys != m->n_env_vals || m->pid <= 0) return -1;
  struct proc *p = proc_new(t);
  if (!p) return -1;
  /* The state lists the records newest first, as t->all did; proc_new put
   * this one in front: behind those restored before it instead, so that
   * t->all keeps the old order and the next upgrade saves them newest first
   * again (proc_handover_resume adds them to the table oldest first: the
   * start order List shows). */
  list_remove(&p->alink);
  list_insert_tail(&t->all, &p->alink);
  hp->p = p;
  p->released = 0;
  p->pid = m->pid;
  p->state = m->state == CONCH__HANDOVER__PROC__STATE__RUNNING  ? PROC_RUNNING
             : m->state == CONCH__HANDOVER__PROC__STATE__EXITED ? PROC_EXITED
                                                                : PROC_ENDED;
  p->tag = ho_strdup(m->tag);
  p->cmd = ho_strdup(m->cmd);
  p->cwd = ho_strdup(m->cwd);
#ifndef CONCH_STATIC /* test seam: the record tagged "broken" fails half-built (tests/integration/test_upgrade_state.py) */
  const char *fault = getenv("CONCH_FAULT");
  if (fault && strcmp(fault, "handover_proc_record") == 0 && p->tag && strcmp(p->tag, "broken") == 0) return -1;
#endif
  p->args = calloc(m->n_args + 1, sizeof *p->args);
  p->env_keys = calloc(m->n_env_keys + 1, sizeof *p->env_keys);
  p->env_vals = calloc(m->n_env_vals + 1, sizeof *p->env_vals);
  if (!p->tag || !p->cmd || !p->cwd || !p->args || !p->env_keys || !p->env_vals) return -1;
  p->nargs = m->n_args;
  if (!(p->args_block = ho_block(m->args, m->n_args, p->args))) return -1;
  p->nenv = m->n_env_keys;
  if (!(p->env_kblock = ho_block(m->env_keys, m->n_env_keys, p->env_keys))) return -1;
  if (!(p->env_vblock = ho_block(m->env_vals, m->n_env_vals, p->env_vals))) return -1;
  p->ident = rpc_ident_restored(m->user, m->uid, m->gid);
  p->started_at = m->started_at;
  p->has_pty = m->pty;
  p->cols = m->cols;
  p->rows = m->rows;
  p->nout = (int)m->n_out;
  for (size_t i = 0; i < m->n_out; i++) {
    const Conch__Handover__Output *mo = m->out[i];
    struct proc_out *o = &p->out[i];
    if (mo->kind > PROC_OUT_PTY) return -1;
    o->p = p;
    o->kind = (int)mo->kind;
    o->fd = mo->fd;
    o->done = mo->done;
    o->offset = mo->offset;
    o->read_since_exit = mo->read_since_exit;
    o->pending_at_exit = mo->pending_at_exit;
    for (size_t j = 0; j < mo->n_ring; j++) { /* in pieces a ring block holds */
      const Conch__Handover__RingBlock *b = mo->ring[j];
      for (size_t at = 0; at < b->data.len; at += PROC_RING_BLOCK) {
        size_t len = b->data.len - at < PROC_RING_BLOCK ? b->data.len - at : PROC_RING_BLOCK;
        size_t before = o->ring.mem;
        if (proc_ring_append(&o->ring, b->off + at, b->data.data + at, len, PROC_RING_MAX) != 0) return -1;
        t->ring_mem = t->ring_mem - before + o->ring.mem;
      }
    }
  }
  p->in_fd = m->in_fd;
  p->stdin_open = m->stdin_open;
  p->in_closed = m->in_closed;
  if (m->pending_input.len) {
    if (!(p->stdin_buf = malloc(m->pending_input.len))) return -1;
    memcpy(p->stdin_buf, m->pending_input.data, m->pending_input.len);
    p->stdin_len = m->pending_input.len;
  }
  p->timeout_ms = m->timeout_ms;
  p->timed_out = m->timed_out;
  if (m->deadline_mono_ms) hp->deadline_left = m->deadline_mono_ms > now_mono ? m->deadline_mono_ms - now_mono : 1;
  p->has_limits = m->has_limits;
  p->limits = (proc_cg_limits){.memory_max = m->memory_max, .pids_max = m->pids_max, .cpu_millis = m->cpu_millis};
  hp->cg_deadline_left = m->cg_deadline_left_ms;
  p->reaped = m->reaped;
  p->wstatus = m->wstatus;
  p->end.wstatus = m->wstatus;
  p->end.cpu_user_usec = m->cpu_user_usec;
  p->end.cpu_system_usec = m->cpu_system_usec;
  p->end.memory_peak = m->memory_peak;
  p->end.oom_killed = m->oom_killed;
  p->end.left_running = m->left_running;
  p->finished_at = m->finished_at;
  uint64_t now_uv = uv_now(t->loop);
  if (p->state != PROC_RUNNING) {
    uint64_t ago = now_mono > m->exit_mono_ms ? now_mono - m->exit_mono_ms : 0;
    p->exit_ms = now_uv > ago ? now_uv - ago : 0;
  }
  if (m->retain_until_mono_ms)
    hp->retain_left = m->retain_until_mono_ms > now_mono ? m->retain_until_mono_ms - now_mono : 1;
  else if (p->state == PROC_ENDED)
    hp->retain_left = t->retain_ms;
  if (m->script && m->script[0] && m->script_dfd > 0) {
    if (!(p->script = strdup(m->script))) return -1;
    p->script_dfd = m->script_dfd;
  }
  p->fan.dropped_total = m->dropped;
  /* last: nothing after it can fail, so an adopted cgroup is never undone */
  if (m->cgroup_fd > 0 && m->cgroup[0] && !(p->cg = proc_cg_adopt(m->cgroup, m->cgroup_fd, &p->limits))) return -1;
  p->lingering = m->lingering && p->cg;
  return 0;
}

/* A record ho_restore_one could not finish: freed whole, none of the
 * state's descriptors closed (a rollback needs them; abandon closes them). */
static void ho_unbuild(struct proc *p) {
  p->cg = NULL;
  p->lingering = 0;
  free(p->script);
  p->script = NULL;
  p->in_fd = -1;
  p->in_closed = 1;
  p->stdin_open = 0;
  for (int i = 0; i < p->nout; i++) p->out[i].fd = -1;
  p->state = PROC_ENDED;
  proc_release(p);
}

int proc_handover_restore(const Conch__Handover__State *st, uint64_t now_mono, char *err, size_t errn) {
  if (!proc_tab && st->n_procs == 0) return 0;
  if (!proc_tab) {
    snprintf(err, errn, "the process service is not running");
    return -1;
  }
  ho_recs = calloc(st->n_procs + 1, sizeof *ho_recs);
  if (!ho_recs) {
    snprintf(err, errn, "out of memory");
    return -1;
  }
  ho_ran = 1;
  size_t failed = 0;
  for (size_t i = 0; i < st->n_procs; i++) { /* each on its own: a failed one is dropped whole */
    if (ho_restore_one(st->procs[i], now_mono, &ho_recs[i]) != 0) {
      if (ho_recs[i].p) ho_unbuild(ho_recs[i].p);
      ho_recs[i] = (ho_pending){0};
      if (!failed++)
        snprintf(err, errn, "process record %zu (pid %d) cannot be restored", i, (int)st->procs[i]->pid);
    }
    ho_nrecs = i + 1;
  }
  return failed ? -1 : 0; /* a rollback, if one can run; else abandon drops the failed ones */
}

/* Close the descriptors of a record of the state that was not restored. */
static void ho_close_record(const hproc *m) {
  int fds[] = {m->in_fd, m->cgroup_fd, m->script_dfd, m->n_out > 0 ? m->out[0]->fd : -1,
               m->n_out > 1 ? m->out[1]->fd : -1};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++)
    if (fds[i] > 2) close(fds[i]);
  LOG_WARN("upgrade: process record pid=%d tag=%s dropped: it could not be restored (its descriptors closed)",
           (int)m->pid, m->tag ? m->tag : "");
}

void proc_handover_abandon(const Conch__Handover__State *st) {
  for (size_t i = 0; i < st->n_procs; i++)
    if (!ho_ran || !ho_recs || i >= ho_nrecs || !ho_recs[i].p) ho_close_record(st->procs[i]);
  if (!ho_ran && st->cgroups) { /* the hierarchy was not taken either */
    int fds[] = {st->cgroups->parent_fd, st->cgroups->base_fd, st->cgroups->spare_fd};
    for (size_t i = 0; i < 3; i++)
      if (fds[i] > 2 && !proc_cg_enabled()) close(fds[i]);
  }
}

void proc_handover_resume(void) {
  if (!ho_recs) return;
  /* oldest first, as List orders the table */
  for (size_t i = ho_nrecs; i-- > 0;) {
    ho_pending *hp = &ho_recs[i];
    if (hp->p) proc_resume(hp->p, hp->deadline_left, hp->cg_deadline_left, hp->retain_left);
  }
  free(ho_recs);
  ho_recs = NULL;
  ho_nrecs = 0;
  ho_ran = 0;
}

void proc_handover_keep_fds(const Conch__Handover__State *st) {
  if (st->cgroups) {
    handover_keep_fd(st->cgroups->parent_fd);
    handover_keep_fd(st->cgroups->base_fd);
    handover_keep_fd(st->cgroups->spare_fd);
  }
  for (size_t i = 0; i < st->n_procs; i++) {
    const hproc *p = st->procs[i];
    for (size_t j = 0; j < p->n_out; j++) handover_keep_fd(p->out[j]->fd);
    handover_keep_fd(p->in_fd);
    handover_keep_fd(p->cgroup_fd);
    handover_keep_fd(p->script_dfd);
  }
}
