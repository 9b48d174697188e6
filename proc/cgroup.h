/* cgroup — every started command in a cgroup v2 of its own, so that its
 * whole tree is killable (setsid and double-fork escapees included).
 *
 * Only the core cgroup v2 files are used (cgroup.procs, cgroup.kill,
 * cgroup.events); no controller is needed, so a v2 hierarchy mounted
 * beside v1 controllers works too.  Layout: <our cgroup>/conch-<pid>-<hex>
 * (the daemon's base, no process in it) / p<seq> (one per command).
 *
 *   PID 1       mounts cgroup2 on /run/conch/cgroup (boot root, before the
 *               chroot; the descriptors opened then outlive it).
 *   standalone  uses a mounted cgroup2 hierarchy when the daemon's own
 *               cgroup in it is writable, else mounts a private one (then
 *               detached: only our descriptor keeps it).
 * When neither works (not root, no cgroup2), proc_cg_init() fails and the
 * service falls back to process groups, as before.
 *
 * Lifetime of one command's cgroup (struct proc_cg), on the loop unless
 * marked: proc_cg_new (loop) → proc_cg_create (thread pool: mkdir, open)
 * → the child enters it before its exec (spawn.c) → proc_cg_signal while
 * the record runs → proc_cg_release when the leader was reaped: the
 * directory is removed (rmdir in the pool) if empty, else when
 * cgroup.events says it emptied (inotify); a deadline still pending then
 * kills what is left at its time.
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

/* Loop: a handle for one command (NULL when disabled or out of memory). */
struct proc_cg *proc_cg_new(void);
/* Thread pool: create and open the directory; 0 or -errno. */
int proc_cg_create(struct proc_cg *cg);
/* Directory descriptor for the spawn (its cgroup.procs), or -1. */
int proc_cg_fd(const struct proc_cg *cg);
/* Its path below the hierarchy's root as /proc/PID/cgroup shows it (logs). */
const char *proc_cg_name(const struct proc_cg *cg);
/* Signal every process in it: SIGKILL through cgroup.kill, others to each
 * pid of cgroup.procs.  0, -ESRCH (empty) or -errno. */
int proc_cg_signal(struct proc_cg *cg, int sig);
/* The record is done with it (leader reaped, or never started): remove it
 * now or once empty; deadline_ms > 0: SIGKILL what is still in it then. */
void proc_cg_release(struct proc_cg *cg, uint64_t deadline_ms);

#endif
