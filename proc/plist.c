/* plist — ProcessService/List; see plist.h.
 *
 * The answer is built on the loop (pointers into the records, O(processes))
 * but for the env entries, which the pool points at the records' strings
 * (immutable while pinned), so that the loop's share does not grow with
 * the size of the processes' environments.  Each process's usage
 * is read in the pool too (cgroup files, or /proc without cgroups: 4000
 * processes are 8000 file reads), where the answer is then encoded, with
 * the records and their cgroups pinned.  An empty list is answered at
 * once. */
#include "proc/plist.h"

#include <stdlib.h>
#include <time.h>

#include "proc/cgroup.h"
#include "proc/exitfmt.h"
#include "proc/proc.h"
#include "proto/agent.pb-c.h"

struct proc_list {
  rpc_call *c; /* NULL once the call was canceled */
  int json;
  Pb__ListProcessesResponse resp;
  Pb__ProcessInfo *infos;
  Pb__ProcessInfo **iptr;
  Pb__ProcessConfig *cfgs;
  Pb__PTY *ptys;
  Pb__ProcessConfig__EnvEntry *envs; /* made in the pool */
  Pb__ProcessConfig__EnvEntry **eptr;
  char (*stamps)[32];
  char (*fstamps)[32];
  Pb__ResourceUsage *usages;
  struct proc_cg **cgs; /* pinned, or NULL: /proc of pids[i] */
  pid_t *pids;
  struct proc **pinned;
  size_t npinned;
  uint8_t *enc; /* the pool's encoding */
  size_t enc_len;
};

static void proc_list_free(struct proc_list *l) {
  for (size_t i = 0; i < l->npinned; i++) {
    if (l->cgs[i]) proc_cg_unpin(l->cgs[i]);
    proc_unpin(l->pinned[i]);
  }
  free(l->pinned);
  free(l->cgs);
  free(l->pids);
  free(l->usages);
  free(l->fstamps);
  free(l->infos);
  free(l->iptr);
  free(l->cfgs);
  free(l->ptys);
  free(l->envs);
  free(l->eptr);
  free(l->stamps);
  free(l->enc);
  free(l);
}

static void proc_list_answer(rpc_call *c, int sent) {
  if (sent == 0)
    rpc_finish(c, RPC_OK, NULL);
  else /* larger than 16 MiB (thousands of processes with huge configs), or out of memory */
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "process list exceeds maximum message size 16777216 bytes");
}

/* The env entries of every process, pointing into the pinned records;
 * 0, or -1 when out of memory. */
static int proc_list_envs(struct proc_list *l) {
  size_t nenv = 0;
  for (size_t i = 0; i < l->npinned; i++) nenv += l->cfgs[i].n_env;
  l->envs = malloc((nenv + 1) * sizeof *l->envs);
  l->eptr = malloc((nenv + 1) * sizeof *l->eptr);
  if (!l->envs || !l->eptr) return -1;
  size_t e = 0;
  for (size_t i = 0; i < l->npinned; i++) {
    const struct proc *p = l->pinned[i];
    Pb__ProcessConfig *cf = &l->cfgs[i];
    cf->env = &l->eptr[e];
    for (size_t k = 0; k < cf->n_env; k++, e++) {
      pb__process_config__env_entry__init(&l->envs[e]);
      l->envs[e].key = p->env_keys[k];
      l->envs[e].value = p->env_vals[k];
      l->eptr[e] = &l->envs[e];
    }
  }
  return 0;
}

static void proc_list_run(void *data) {
  struct proc_list *l = data;
  if (proc_list_envs(l) < 0) return; /* no encoding: done answers out of memory */
  for (size_t i = 0; i < l->npinned; i++) {
    proc_end_info u;
    proc_usage_now(l->cgs[i], l->pids[i], &u);
    l->usages[i].cpu_user_usec = u.cpu_user_usec;
    l->usages[i].cpu_system_usec = u.cpu_system_usec;
    l->usages[i].memory_peak_bytes = u.memory_peak;
  }
  l->enc = rpc_encode(l->json, &l->resp.base, &l->enc_len);
}

static void proc_list_done(void *data, int canceled) {
  struct proc_list *l = data;
  if (l->c) {
    rpc_set_user(l->c, NULL);
    uint8_t *enc = l->enc;
    l->enc = NULL;
    if (canceled || !enc) {
      free(enc);
      rpc_finish(l->c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    } else {
      proc_list_answer(l->c, rpc_send_bytes(l->c, enc, enc + RPC_HEADROOM, l->enc_len));
    }
  }
  proc_list_free(l);
}

void proc_list_cancel(rpc_call *c, rpc_code why) {
  struct proc_list *l = rpc_user(c);
  if (l) l->c = NULL; /* the job runs on; its done frees it */
}

void proc_list_on_request(rpc_call *c, const ProtobufCMessage *m) {
  struct proc_table *t = proc_tab;
  size_t n = 0;
  struct proc *p;
  list_each(p, &t->table, tlink)
    if (p->state == PROC_RUNNING || p->lingering) n++;
  struct proc_list *l = calloc(1, sizeof *l);
  if (!l) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  pb__list_processes_response__init(&l->resp);
  l->c = c;
  l->json = rpc_is_json(c);
  l->infos = calloc(n + 1, sizeof *l->infos);
  l->iptr = calloc(n + 1, sizeof *l->iptr);
  l->cfgs = calloc(n + 1, sizeof *l->cfgs);
  l->ptys = calloc(n + 1, sizeof *l->ptys);
  l->stamps = calloc(n + 1, sizeof *l->stamps);
  l->pinned = calloc(n + 1, sizeof *l->pinned);
  l->fstamps = calloc(n + 1, sizeof *l->fstamps);
  l->usages = calloc(n + 1, sizeof *l->usages);
  l->cgs = calloc(n + 1, sizeof *l->cgs);
  l->pids = calloc(n + 1, sizeof *l->pids);
  if (!l->infos || !l->iptr || !l->cfgs || !l->ptys || !l->stamps || !l->pinned ||
      !l->fstamps || !l->usages || !l->cgs || !l->pids) {
    proc_list_free(l);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  size_t i = 0;
  list_each(p, &t->table, tlink) {
    if (p->state != PROC_RUNNING && !p->lingering) continue;
    Pb__ProcessConfig *cf = &l->cfgs[i];
    pb__process_config__init(cf);
    cf->cmd = p->cmd;
    cf->n_args = p->nargs;
    cf->args = p->args;
    cf->cwd = p->cwd;
    if (p->ident && !p->ident->implicit) cf->user = (char *)p->ident->name;
    cf->n_env = p->nenv; /* the entries: proc_list_envs, in the pool */
    if (p->has_pty) { /* copied: Update changes them */
      pb__pty__init(&l->ptys[i]);
      l->ptys[i].cols = p->cols;
      l->ptys[i].rows = p->rows;
      cf->pty = &l->ptys[i];
    }
    Pb__ProcessInfo *pi = &l->infos[i];
    pb__process_info__init(pi);
    pi->pid = (int32_t)p->pid;
    pi->tag = p->tag;
    pi->config = cf;
    pi->running = 1;
    struct tm tm;
    gmtime_r(&p->started_at, &tm);
    strftime(l->stamps[i], sizeof l->stamps[i], "%Y-%m-%dT%H:%M:%SZ", &tm);
    pi->started_at = l->stamps[i];
    pi->exit_code = -1;
    if (p->state != PROC_RUNNING) { /* the leader exited, processes are left (api.md §9) */
      proc_exit_info ei;
      proc_exit_describe(p->wstatus, &ei);
      pi->running = 0;
      pi->exit_code = ei.exit_code;
      gmtime_r(&p->finished_at, &tm);
      strftime(l->fstamps[i], sizeof l->fstamps[i], "%Y-%m-%dT%H:%M:%SZ", &tm);
      pi->finished_at = l->fstamps[i];
      pi->left_running = p->end.left_running;
    }
    pb__resource_usage__init(&l->usages[i]);
    pi->usage = &l->usages[i];
    l->iptr[i] = pi;
    l->pinned[i] = p;
    l->cgs[i] = p->cg;
    l->pids[i] = p->pid;
    i++;
  }
  l->resp.n_processes = n;
  l->resp.processes = l->iptr;
  if (n == 0) {
    proc_list_answer(c, rpc_send(c, &l->resp.base));
    proc_list_free(l); /* nothing pinned */
    return;
  }
  for (l->npinned = 0; l->npinned < n; l->npinned++) {
    proc_pin(l->pinned[l->npinned]);
    if (l->cgs[l->npinned]) proc_cg_pin(l->cgs[l->npinned]);
  }
  rpc_set_user(c, l);
  if (!rpc_work_submit(NULL, proc_list_run, proc_list_done, l)) { /* /proc is read as root */
    rpc_set_user(c, NULL);
    proc_list_free(l);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
}
