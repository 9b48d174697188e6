/* cgroup — every started command in a cgroup v2 of its own, so that its
 * whole tree is killable (setsid and double-fork escapees included).
 *
 * Layout: <our cgroup>/conch-<pid>-<hex> (the daemon's base, no process
 * in it) / p<seq> (one per command).
 *
 *   PID 1       mounts cgroup2 on /run/conch/cgroup (boot root, before the
 *               chroot; the descriptors opened then outlive it).
 *   standalone  uses a mounted cgroup2 hierarchy when the daemon's own
 *               cgroup in it is writable, else mounts a private one (then
 *               detached: only our descriptor keeps it).
 * When neither works (not root, no cgroup2), proc_cg_init() fails and the
 * service falls back to process groups, as before.
 *
 * The workload envelope (api.md §9, boot.md §12): where the cgroup's
 * controllers list has cpu, memory and pids, they are enabled for the base
 * and below it, so the base is the workload cgroup: memory.max = MemTotal
 * − reserve, pids.max = threads-max − 256, cpu.weight 10 (the daemon
 * stays outside, at the weight of a nice-0 task: 100).  PID 1 lives in the
 * root cgroup, which may hold processes and enable controllers at once; a
 * standalone daemon must first leave its own cgroup for a leaf beside the
 * base (conch-agent-<pid>), and only does so when it is alone there.
 * Without the controllers, only the core files are used (cgroup.procs,
 * cgroup.kill, cgroup.events, cpu.stat): a v2 hierarchy mounted beside v1
 * controllers still tracks and kills every command's tree.
 *
 * Lifetime of one command's cgroup (struct proc_cg), on the loop unless
 * marked: proc_cg_new (loop) → proc_cg_create (thread pool: mkdir, open,
 * limits) → the child enters it before its exec (spawn.c) → proc_cg_signal
 * while the record runs → proc_cg_exited when the leader was reaped: in
 * the pool its accounting is read and the directory removed if empty;
 * then, on the loop, the owner hears the accounting, and if the cgroup
 * still holds processes (`sh -c 'srv &'`) it lingers: still signalable,
 * removed when cgroup.events says it emptied (inotify), which the owner
 * hears too; a deadline still pending kills what is left at its time.
 * proc_cg_release is the end for a cgroup whose command never started.
 */
#ifndef CONCH_PROC_CGROUP_H
#define CONCH_PROC_CGROUP_H

#include <stdint.h>
#include <uv.h>

struct proc_cg;

/* Set up the daemon's base cgroup; 0, or -1 (logged): process groups only.
 * pid1: mount a private cgroup2 hierarchy (boot.md, PID 1). */
int proc_cg_init(uv_loop_t *loop, int pid1);
/* 1 when commands get cgroups. */
int proc_cg_enabled(void);
/* Remove what is empty (standalone shutdown): command cgroups, the base. */
void proc_cg_shutdown(void);

/* The envelope is up (controllers enabled below the base); else why not
 * (the text after "resource limits are not available: "). */
int proc_cg_envelope(void);
const char *proc_cg_why(void);
/* MemTotal of /proc/meminfo in bytes (0: unknown); any thread. */
uint64_t proc_cg_mem_total(void);
/* The workload's memory.max and pids.max as applied (0: no envelope). */
uint64_t proc_cg_workload_memory_max(void);
uint64_t proc_cg_workload_pids_max(void);
/* Thread pool (the write may reclaim): the init message's workload keys
 * (boot.md §12; 0 = keep); 0 or -errno. */
int proc_cg_workload_set(uint64_t memory_max, uint64_t pids_max);

/* A command's own limits (api.md §9 ResourceLimits; 0 = none). */
typedef struct proc_cg_limits {
  uint64_t memory_max;
  uint32_t pids_max;
  uint32_t cpu_millis;
} proc_cg_limits;

/* What a cgroup used: cpu.stat, memory.peak, memory.events' oom_kill, and
 * how many processes cgroup.procs lists. */
typedef struct proc_cg_usage {
  uint64_t user_usec, system_usec, memory_peak;
  int have_cpu, have_memory; /* the files could be read */
  int oom_killed;
  int nprocs;
} proc_cg_usage;

/* Loop: a handle for one command (NULL when disabled or out of memory). */
struct proc_cg *proc_cg_new(const proc_cg_limits *limits);
/* Loop: make the next command's directory ahead in the pool (a spare that
 * proc_cg_new hands out), unless one is there or on its way.  Called after
 * a start's clone: queued before it, the mkdir would hold up the start. */
void proc_cg_refill(void);
/* Loop, after proc_cg_signal_all(SIGKILL): the spare is dropped and made
 * again.  The base's cgroup.kill counts a kill in every cgroup below it,
 * and the kernel (6.18 here) kills a child cloned INTO such a cgroup at
 * once when that count differs from the one of the parent's own cgroup:
 * a spare made before the kill would kill the next command. */
void proc_cg_spare_discard(void);
/* Thread pool: create and open the directory, apply the limits; 0, or
 * -errno with the file that failed in *what. */
int proc_cg_create(struct proc_cg *cg, const char **what);
/* Thread pool or loop: the cgroup's usage now (nprocs left 0). */
void proc_cg_read_usage(const struct proc_cg *cg, proc_cg_usage *u);
/* Keep the descriptor open for a reader in the pool (loop only). */
void proc_cg_pin(struct proc_cg *cg);
void proc_cg_unpin(struct proc_cg *cg);
/* Directory descriptor for the spawn (its cgroup.procs), or -1. */
int proc_cg_fd(const struct proc_cg *cg);
/* Its path below the hierarchy's root as /proc/PID/cgroup shows it (logs). */
const char *proc_cg_name(const struct proc_cg *cg);
/* Signal every process in it: SIGKILL through cgroup.kill, others to each
 * pid of cgroup.procs.  0, -ESRCH (empty) or -errno. */
int proc_cg_signal(struct proc_cg *cg, int sig);
/* Never started (PREP failure): remove it. */
void proc_cg_release(struct proc_cg *cg);
/* The leader was reaped.  The pool reads the usage and removes the
 * directory if empty; then on_exit(arg, usage, lingering) on the loop.
 * lingering: processes are left, the cgroup stays (proc_cg_signal works)
 * and on_empty(arg) follows once, when it emptied; after on_empty (or an
 * on_exit that was not lingering) the handle is gone.  deadline_ms > 0:
 * SIGKILL what is still in it then. */
typedef void (*proc_cg_exit_cb)(void *arg, const proc_cg_usage *u, int lingering);
typedef void (*proc_cg_empty_cb)(void *arg);
void proc_cg_exited(struct proc_cg *cg, uint64_t deadline_ms, proc_cg_exit_cb on_exit,
                    proc_cg_empty_cb on_empty, void *arg);
/* Thread pool: sig to every process of every command (SIGKILL: the
 * base's cgroup.kill); the processes signalled (cgroup.kill: 0), or -errno. */
int proc_cg_signal_all(int sig);

/* ---- upgrade in place (proc/handover.c, core/handover.h) ----
 * What the hierarchy and each command's cgroup need to go on in the next
 * program: the descriptors (kept open across the exec), names, the seq,
 * the envelope, a lingering cgroup's deadline.  Loop thread only. */
typedef struct Conch__Handover__Cgroups Conch__Handover__Cgroups;
typedef struct Conch__Handover__Proc Conch__Handover__Proc;
/* Pool jobs out (a spare's mkdir, an accounting read): wait before saving. */
int proc_cg_busy(void);
/* Strings point into the live state (valid until the exec). */
void proc_cg_save(Conch__Handover__Cgroups *m);
void proc_cg_save_one(const struct proc_cg *cg, Conch__Handover__Proc *m);
/* Before proc_cg_init (which then keeps this state); 0 or -1. */
int proc_cg_restore(uv_loop_t *loop, const Conch__Handover__Cgroups *m);
/* A command's cgroup from its name and directory descriptor. */
struct proc_cg *proc_cg_adopt(const char *name, int fd, const proc_cg_limits *limits);
/* Its leader was reaped before the upgrade, processes are left: watched
 * as proc_cg_exited's lingering cgroups are. */
void proc_cg_adopt_lingering(struct proc_cg *cg, uint64_t deadline_ms, proc_cg_empty_cb on_empty, void *arg);

#endif
