/* proc/owner — which managed command holds a process, for the port
 * listing (net/, through the hook agent/main.c registers: api.md §9
 * "Ports").  By its cgroup when commands have one (setsid escapees
 * included), else by its process group (each command leads its own). */
#include <string.h>

#include "proc/proc.h"
#include "proc/service.h"

static int proc_owner_match(const struct proc *p, const char *cgroup, int32_t pgid) {
  if (p->cg && cgroup && *cgroup) {
    const char *n = proc_cg_name(p->cg);
    size_t len = strlen(n);
    return strncmp(cgroup, n, len) == 0 && (cgroup[len] == 0 || cgroup[len] == '/');
  }
  return pgid > 0 && pgid == p->pid && !p->reaped;
}

int proc_owner_lookup(const char *cgroup, int32_t pgid, const char **tag, int32_t *command_pid) {
  struct proc_table *t = proc_tab;
  if (!t) return 0;
  struct proc *p;
  list_each(p, &t->table, tlink)
    if ((p->state == PROC_RUNNING || p->lingering) && proc_owner_match(p, cgroup, pgid)) goto found;
  list_each(p, &t->fg, flink)
    if (p->state == PROC_RUNNING && proc_owner_match(p, cgroup, pgid)) goto found;
  list_each(p, &t->linger, llink)
    if (proc_owner_match(p, cgroup, pgid)) goto found;
  return 0;
found:
  *tag = p->tag;
  *command_pid = p->pid;
  return 1;
}
