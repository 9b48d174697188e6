/* reaper — the one owner of waitpid() in conch-init (boot.md §7).
 *
 * SIGCHLD (blocked in every thread, read from a signalfd on the loop)
 * drives a wait4(-1, WNOHANG) loop;
 * each status goes to the callback registered for that pid, the rest
 * (orphans re-parented to PID 1 or to a subreaper) are logged and forgotten.
 * No other code may call wait*(): fork, then reaper_watch() before returning
 * to the loop — a child that exits in between is reaped only after that.
 *
 * reaper_init() must run before any thread is made (the block of SIGCHLD
 * is inherited, a thread without it would take the signal and lose it).
 * It reaps once at once (children that exited before the handler
 * existed): watch children forked before it first.  The signal handle is
 * unref'd — the reaper alone never keeps the loop alive.  Owners are kept in
 * a pid-keyed hash table that grows by rehashing up to 2^20 entries; the
 * owner entry is removed before its callback runs (which may re-watch).
 * Orphans (pids nobody watches) are logged at debug level and counted.
 */
#ifndef CONCH_REAPER_H
#define CONCH_REAPER_H

#include <sys/resource.h>
#include <sys/types.h>
#include <uv.h>

#include "core/list.h"

/* ru: the child's resource usage from wait4 (its reaped descendants included). */
typedef void (*reaper_cb)(pid_t pid, int wstatus, const struct rusage *ru, void *arg);

int reaper_init(uv_loop_t *loop);
/* Register the owner of pid.  Returns 0 or -ENOMEM. */
int reaper_watch(pid_t pid, reaper_cb cb, void *arg);
/* Forget the owner (status then goes to the orphan path). */
void reaper_unwatch(pid_t pid);
/* Upgrade in place: while held nothing is reaped (a child that exited
 * during the exec stays a zombie until its record watches it again);
 * reaper_hold(0) reaps what waited. */
void reaper_hold(int on);
/* Reap now (also run by SIGCHLD). */
void reaper_reap(void);
/* Orphans reaped so far (tests, logs). */
unsigned long reaper_orphans_reaped(void);

/* Children cloned off the loop (ProcessService spawns in the thread pool,
 * so that the execve of a huge environment never holds the loop).  Such a
 * child may exit before its owner can reaper_watch() it.  So, on the loop,
 * before the pool job: reaper_inflight_add(s); the clone stores the child's
 * pid in s->pid as it creates it (CLONE_PARENT_SETTID).  An exited child
 * whose pid is in an added slot is reaped and its status kept there (not
 * taken for an orphan); reaper_inflight_claim (loop, after the job) removes
 * the slot and either hands back that status (returns 1) or watches the pid
 * for cb (returns 0; -ENOMEM as reaper_watch).  s->pid 0: no child. */
typedef struct reaper_inflight {
  pid_t pid; /* written by the kernel from the cloning thread */
  int reaped, status;
  struct rusage ru; /* with status */
  list_node link;
} reaper_inflight;
void reaper_inflight_add(reaper_inflight *s);
int reaper_inflight_claim(reaper_inflight *s, reaper_cb cb, void *arg, int *status);

#endif
