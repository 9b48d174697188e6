/* proc/cgroup_int — internal to proc/cgroup*.c: the hierarchy's state, one
 * command's cgroup, and the functions the files give each other.  No other
 * file includes it; the rest of the program sees proc/cgroup.h only.
 *
 * Layers, each calling only those below it:
 *   cgroup.c           finding or mounting the hierarchy, the daemon's base
 *                      cgroup, shutdown (loop)
 *   cgroup_envelope.c  the workload envelope: controllers enabled below the
 *                      base, its memory.max, pids.max and cpu.weight
 *   cgroup_spare.c     the next command's cgroup made ahead in the pool,
 *                      handed out by proc_cg_new
 *   cgroup_handover.c  the state saved for an upgrade in place and restored
 *                      from it; adopted command cgroups
 *   cgroup_cmd.c       one command's cgroup: create, signal, usage, the
 *                      end (removal, lingering until it empties)
 *   cgroup_file.c      cg_state and the cgroupfs file access all of them use
 */
#ifndef CONCH_PROC_CGROUP_INT_H
#define CONCH_PROC_CGROUP_INT_H

#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "core/list.h"
#include "proc/cgroup.h"

struct proc_cg {
  list_node link;              /* in all: every live one (shutdown), newest first */
  char name[32];               /* "p<seq>", below the base */
  int fd;                      /* the directory, -1 until created */
  int created, released, removed, finished;
  proc_cg_limits limits;
  uv_timer_t deadline;
  uv_fs_event_t ev;
  int rm_err; /* the pool job's first rmdir (usage read there too: cgroupfs takes a global lock) */
  proc_cg_usage usage; /* read by that job */
  proc_cg_exit_cb on_exit;
  proc_cg_empty_cb on_empty; /* set while lingering */
  void *arg;
  int timer_on, ev_on; /* handle initialised (closed on finish) */
  int handles;
  int pins; /* pool readers: the descriptor stays open */
};

struct proc_cgroups {
  uv_loop_t *loop;
  int parent_fd;       /* the daemon's own cgroup */
  int base_fd;         /* <parent>/<base_name> */
  char base_name[48];
  char base_path[1100]; /* as /proc/PID/cgroup shows it */
  char name_buf[1140];  /* proc_cg_name's answer */
  uint64_t seq;
  list_node all;
  int envelope;         /* cpu, memory, pids enabled below the base */
  char why[256];        /* no envelope: why */
  uint64_t mem_max, pids_max; /* the workload's, as applied */
  /* The next command's cgroup, made ahead in the pool: with the
   * controllers, mkdir builds a memory cgroup (tests/bench/vm-envelope.sh:
   * StartProcess p50 +6.7 % with the mkdir on the start's path); without
   * them too (mkdir + open, ~50 µs of the round trip, profile.md). */
  struct proc_cg *spare;
  int spare_busy; /* its mkdir is out in the pool */
  int spare_stale; /* a kill of the whole base ran while it was made: dropped when it is */
  unsigned jobs;   /* pool jobs out (spare mkdir, accounting + rmdir): an upgrade waits for them */
};

/* The hierarchy, once proc_cg_init (or proc_cg_restore) found one; loop
 * thread only, but for the fields the pool jobs read (base_fd, envelope). */
extern struct proc_cgroups *cg_state;

/* ---- cgroup_file.c ---- */
/* One value into a cgroup file below dirfd; 0 or -errno. */
int cg_write(int dirfd, const char *file, const char *val);
int cg_write_u64(int dirfd, const char *file, uint64_t v);
/* A small cgroup file (≤ 4 KiB: cpu.stat, memory.events, a controllers
 * list) into b as a string; its length or -1. */
ssize_t cg_read_file(int dirfd, const char *file, char *b, size_t n);
/* "key value" lines (cpu.stat, memory.events, meminfo): the value of key. */
int cg_key_u64(const char *text, const char *key, uint64_t *v);
/* Each pid of dirfd's cgroup.procs gets fn; the count it accepted, or -errno. */
int cg_each(int dirfd, int (*fn)(pid_t pid, void *arg), void *arg);

/* ---- cgroup_cmd.c ---- */
/* A new handle named p<++seq>, in g->all, no directory yet. */
struct proc_cg *cg_alloc(struct proc_cgroups *g);
/* SIGKILL what is in it after ms (a timer on the loop). */
void cg_deadline_arm(struct proc_cg *cg, uint64_t ms);
/* Still populated: removed when cgroup.events says it emptied. */
void cg_linger(struct proc_cg *cg);

/* ---- cgroup_envelope.c ---- */
/* Loop, at init: make the base the workload cgroup, or say in g->why why not. */
void cg_envelope_setup(struct proc_cgroups *g, int pid1);

#endif
