/* cgroup_handover — the hierarchy's and each command cgroup's state
 * across an upgrade in place (proc/handover.c); see cgroup.h. */
#include "proc/cgroup_int.h"

#include <stdio.h>
#include <sys/file.h>
#include <stdlib.h>
#include <string.h>

#include "proto/handover.pb-c.h"

int proc_cg_busy(void) { return cg_state && cg_state->jobs > 0; }

void proc_cg_save(Conch__Handover__Cgroups *m) {
  struct proc_cgroups *g = cg_state;
  if (!g) return;
  m->enabled = 1;
  m->parent_fd = g->parent_fd;
  m->base_fd = g->base_fd;
  m->base_name = g->base_name;
  m->base_path = g->base_path;
  m->seq = g->seq;
  m->envelope = g->envelope;
  m->why = g->why;
  m->mem_max = g->mem_max;
  m->pids_max = g->pids_max;
  if (g->spare && !g->spare_busy && g->spare->fd >= 0) {
    m->spare = g->spare->name;
    m->spare_fd = g->spare->fd;
  }
}

int proc_cg_restore(uv_loop_t *loop, const Conch__Handover__Cgroups *m) {
  if (!m || !m->enabled || cg_state) return 0;
  struct proc_cgroups *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->loop = loop;
  g->parent_fd = m->parent_fd;
  g->base_fd = m->base_fd;
  flock(g->base_fd, LOCK_EX | LOCK_NB); /* held already (the same open file), unless an older agent made it */
  snprintf(g->base_name, sizeof g->base_name, "%s", m->base_name);
  snprintf(g->base_path, sizeof g->base_path, "%s", m->base_path);
  g->seq = m->seq;
  g->envelope = m->envelope;
  snprintf(g->why, sizeof g->why, "%s", m->why);
  g->mem_max = m->mem_max;
  g->pids_max = m->pids_max;
  cg_state = g;
  if (m->spare && m->spare[0] && m->spare_fd >= 0) {
    struct proc_cg *cg = proc_cg_adopt(m->spare, m->spare_fd, NULL);
    if (!cg) return -1;
    g->spare = cg;
  }
  return 0;
}

void proc_cg_save_one(const struct proc_cg *cg, Conch__Handover__Proc *m) {
  m->cgroup = (char *)cg->name;
  m->cgroup_fd = cg->fd;
  m->memory_max = cg->limits.memory_max;
  m->pids_max = cg->limits.pids_max;
  m->cpu_millis = cg->limits.cpu_millis;
  if (cg->timer_on && uv_is_active((const uv_handle_t *)&cg->deadline))
    m->cg_deadline_left_ms = uv_timer_get_due_in(&cg->deadline) + 1;
}

struct proc_cg *proc_cg_adopt(const char *name, int fd, const proc_cg_limits *limits) {
  struct proc_cgroups *g = cg_state;
  if (!g || strlen(name) >= sizeof ((struct proc_cg *)0)->name) return NULL;
  struct proc_cg *cg = calloc(1, sizeof *cg);
  if (!cg) return NULL;
  snprintf(cg->name, sizeof cg->name, "%s", name);
  cg->fd = fd;
  cg->created = 1;
  if (limits) cg->limits = *limits;
  list_insert_head(&g->all, &cg->link);
  return cg;
}

void proc_cg_adopt_lingering(struct proc_cg *cg, uint64_t deadline_ms, proc_cg_empty_cb on_empty, void *arg) {
  cg->released = 1;
  cg->on_empty = on_empty;
  cg->arg = arg;
  if (deadline_ms > 0) cg_deadline_arm(cg, deadline_ms);
  cg_linger(cg);
}
