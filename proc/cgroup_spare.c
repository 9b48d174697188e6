/* cgroup_spare — the next command's cgroup, made ahead in the pool and
 * handed out by proc_cg_new; see cgroup.h and cgroup_int.h. */
#include "proc/cgroup_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "server/rpc.h"

static void cg_spare_run(void *data) {
  struct proc_cg *cg = data;
  if (mkdirat(cg_state->base_fd, cg->name, 0755) == 0 || errno == EEXIST) {
    cg->created = 1;
    cg->fd = openat(cg_state->base_fd, cg->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
}

static void cg_spare_done(void *data, int canceled) {
  struct proc_cgroups *g = cg_state;
  struct proc_cg *cg = data;
  g->spare_busy = 0;
  g->jobs--;
  if (canceled || cg->fd < 0 || g->spare_stale) { /* made on the start's path instead */
    g->spare = NULL;
    g->spare_stale = 0;
    proc_cg_release(cg);
  }
}

void proc_cg_spare_discard(void) {
  struct proc_cgroups *g = cg_state;
  if (!g || !g->spare) return;
  if (g->spare_busy) {
    g->spare_stale = 1;
    return;
  }
  proc_cg_release(g->spare);
  g->spare = NULL;
  proc_cg_refill();
}

/* Make the next spare unless one is there or on its way. */
void proc_cg_refill(void) {
  struct proc_cgroups *g = cg_state;
  if (!g || g->spare || g->spare_busy) return;
  struct proc_cg *cg = cg_alloc(g);
  if (!cg) return;
  g->spare = cg;
  g->spare_busy = 1;
  g->jobs++;
  if (!rpc_work_submit(NULL, cg_spare_run, cg_spare_done, cg)) {
    g->jobs--;
    g->spare = NULL;
    g->spare_busy = 0;
    proc_cg_release(cg);
  }
}

struct proc_cg *proc_cg_new(const proc_cg_limits *limits) {
  struct proc_cgroups *g = cg_state;
  if (!g) return NULL;
  struct proc_cg *cg = NULL;
  if (g->spare && !g->spare_busy) { /* made and opened: proc_cg_create only applies limits */
    cg = g->spare;
    g->spare = NULL;
  } else {
    cg = cg_alloc(g);
  }
  if (cg && limits) cg->limits = *limits;
  return cg;
}
