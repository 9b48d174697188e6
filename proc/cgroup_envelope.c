/* cgroup_envelope — the workload envelope (api.md §9, boot.md §12): the
 * base made the workload cgroup where cpu, memory and pids are there; see
 * cgroup.h and cgroup_int.h. */
#include "proc/cgroup_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

#define CG_CONTROLLERS "+cpu +memory +pids"
#define CG_WORKLOAD_WEIGHT "10" /* the daemon: 100 (a nice-0 task in the root, or its leaf) */
#define CG_AGENT_WEIGHT "1000"  /* a standalone daemon's own leaf */

int proc_cg_envelope(void) { return cg_state && cg_state->envelope; }
const char *proc_cg_why(void) {
  return cg_state ? cg_state->why : "no cgroup v2 hierarchy (commands are tracked by process group)";
}
uint64_t proc_cg_workload_memory_max(void) { return proc_cg_envelope() ? __atomic_load_n(&cg_state->mem_max, __ATOMIC_RELAXED) : 0; }
uint64_t proc_cg_workload_pids_max(void) { return proc_cg_envelope() ? __atomic_load_n(&cg_state->pids_max, __ATOMIC_RELAXED) : 0; }

/* A word list (cgroup.controllers) holds word. */
static int cg_has_word(const char *list, const char *word) {
  size_t wl = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += wl)
    if ((p == list || p[-1] == ' ') && (p[wl] == 0 || p[wl] == ' ' || p[wl] == '\n')) return 1;
  return 0;
}

uint64_t proc_cg_mem_total(void) {
  char b[4096];
  uint64_t kb = 0;
  if (cg_read_file(AT_FDCWD, "/proc/meminfo", b, sizeof b) < 0 || cg_key_u64(b, "MemTotal", &kb) != 0) return 0;
  return kb * 1024;
}

/* api.md §9: MemTotal − reserve, reserve = MemTotal/8 within [32, 256] MiB
 * — kept free on top of what the kernel and the boot image already hold
 * (MemTotal − MemAvailable now, ~40 MiB on a 512 MiB guest of Debian's
 * kernel).  Measured in the microVM: with the plain formula a fork bomb
 * filled the workload to within 17 MiB of the machine, and the agent's own
 * allocations stalled in reclaim (/health 3.8–13 s, once the global OOM
 * killer); 35 MiB lower, /health stayed under 10 ms. */
static uint64_t cg_default_memory_max(void) {
  char b[4096];
  uint64_t total_kb = 0, avail_kb = 0;
  if (cg_read_file(AT_FDCWD, "/proc/meminfo", b, sizeof b) < 0 || cg_key_u64(b, "MemTotal", &total_kb) != 0)
    return 0;
  if (cg_key_u64(b, "MemAvailable", &avail_kb) != 0 || avail_kb > total_kb) avail_kb = total_kb;
  uint64_t total = total_kb * 1024, held = (total_kb - avail_kb) * 1024, reserve = total / 8;
  if (reserve < (32u << 20)) reserve = 32u << 20;
  if (reserve > (256u << 20)) reserve = 256u << 20;
  uint64_t keep = reserve + held;
  uint64_t max = total > keep + (16u << 20) ? total - keep : 16u << 20;
  return max - max % 4096; /* what memory.max reads back: whole pages */
}

/* api.md §9: threads-max − 256, at least 64. */
static uint64_t cg_default_pids_max(void) {
  char b[64];
  uint64_t tm = 0;
  if (cg_read_file(AT_FDCWD, "/proc/sys/kernel/threads-max", b, sizeof b) > 0) tm = strtoull(b, NULL, 10);
  return tm > 256 + 64 ? tm - 256 : 64;
}

/* Standalone: leave the daemon's own cgroup (which may then enable
 * controllers: a cgroup with processes cannot) for a leaf beside the base;
 * only when the daemon is alone there (a delegated service cgroup). */
static int cg_leave_own(struct proc_cgroups *g) {
  char b[64], me[24];
  snprintf(me, sizeof me, "%d\n", (int)getpid());
  if (cg_read_file(g->parent_fd, "cgroup.procs", b, sizeof b) < 0 || strcmp(b, me) != 0) return -EBUSY;
  char leaf[48];
  snprintf(leaf, sizeof leaf, "conch-agent-%d", (int)getpid());
  if (mkdirat(g->parent_fd, leaf, 0755) != 0 && errno != EEXIST) return -errno;
  int fd = openat(g->parent_fd, leaf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int e = cg_write(fd, "cgroup.procs", "0");
  if (e == 0) e = cg_write(g->parent_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  if (e == 0) cg_write(fd, "cpu.weight", CG_AGENT_WEIGHT);
  close(fd);
  return e;
}

/* Loop, at init: make the base the workload cgroup, or say in g->why why not. */
void cg_envelope_setup(struct proc_cgroups *g, int pid1) {
  char b[512], missing[32] = "";
  const char *off = getenv("CONCH_ENVELOPE"); /* 0: none (benchmarks: tests/bench/vm-envelope.sh) */
  if (off && strcmp(off, "0") == 0) {
    snprintf(g->why, sizeof g->why, "the workload envelope is turned off (CONCH_ENVELOPE=0)");
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  if (cg_read_file(g->parent_fd, "cgroup.controllers", b, sizeof b) < 0) b[0] = 0;
  static const char *const need[] = {"cpu", "memory", "pids"};
  for (int i = 0; i < 3; i++)
    if (!cg_has_word(b, need[i]))
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", need[i]);
  if (missing[0]) {
    snprintf(g->why, sizeof g->why, "the cgroup v2 controllers %s are not available (bound to cgroup v1, or not in this kernel)",
             missing);
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  int e = cg_write(g->parent_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  if (e == -EBUSY && !pid1) {
    e = cg_leave_own(g);
    if (e == -EBUSY) {
      snprintf(g->why, sizeof g->why, "the daemon's cgroup holds other processes, so it cannot enable controllers");
      LOG_WARN("no workload envelope: %s", g->why);
      return;
    }
  }
  const char *step = "enable cpu, memory and pids for the daemon's cgroup";
  if (e == 0) {
    step = "enable cpu, memory and pids below the base";
    e = cg_write(g->base_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  }
  uint64_t mem = cg_default_memory_max(), pids = cg_default_pids_max();
  if (e == 0 && mem == 0) {
    step = "read MemTotal from /proc/meminfo";
    e = -EIO;
  }
  if (e == 0) {
    step = "set the workload's memory.max";
    e = cg_write_u64(g->base_fd, "memory.max", mem);
  }
  if (e == 0) {
    step = "set the workload's pids.max";
    e = cg_write_u64(g->base_fd, "pids.max", pids);
  }
  if (e == 0) {
    step = "set the workload's cpu.weight";
    e = cg_write(g->base_fd, "cpu.weight", CG_WORKLOAD_WEIGHT);
  }
  if (e) {
    snprintf(g->why, sizeof g->why, "cannot %s: %s", step, strerror(-e));
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  g->mem_max = mem;
  g->pids_max = pids;
  g->envelope = 1;
  LOG_INFO("workload envelope %s: memory.max=%llu pids.max=%llu cpu.weight=%s", g->base_path,
           (unsigned long long)mem, (unsigned long long)pids, CG_WORKLOAD_WEIGHT);
}

int proc_cg_workload_set(uint64_t memory_max, uint64_t pids_max) {
  struct proc_cgroups *g = cg_state;
  if (!g || !g->envelope) return -ENOSYS;
  int e = 0;
  memory_max -= memory_max % 4096; /* whole pages, as memory.max reads back */
  if (memory_max && (e = cg_write_u64(g->base_fd, "memory.max", memory_max)) == 0)
    __atomic_store_n(&g->mem_max, memory_max, __ATOMIC_RELAXED);
  if (e == 0 && pids_max && (e = cg_write_u64(g->base_fd, "pids.max", pids_max)) == 0)
    __atomic_store_n(&g->pids_max, pids_max, __ATOMIC_RELAXED);
  return e;
}
