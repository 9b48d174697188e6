/* spawn — create one child for ProcessService (api.md §6 "The child").
 *
 * Our own clone(CLONE_VM|CLONE_VFORK) + execve, as glibc's posix_spawn
 * does it, because posix_spawn (glibc 2.36) cannot put the child in a
 * cgroup, and a child moved after its exec may already have forked (a fork
 * bomb escapes).  The child runs on a small stack of its own in the
 * daemon's memory, uninstrumented, and makes raw system calls only (no
 * malloc, no locks another thread may hold):
 *   with cgroup_fd: born in that cgroup (clone3 CLONE_INTO_CGROUP, Linux
 *   ≥ 5.7; a small assembly entry for the CLONE_VM child, spawn.c), else
 *   "0" into its cgroup.procs first — either way nothing it starts can be
 *   outside; the write waits for an RCU grace period (ms) when no other
 *   migration ran just before, so it is only the fallback (older kernel,
 *   or the workload at its pids.max, which a move is not held to);
 *   every signal disposition back to SIG_DFL (PID 1 ignores SIGTERM/SIGINT/
 *   SIGPIPE), own process group (pipes) or own session with the PTY slave
 *   opened as controlling terminal, stdin/stdout/stderr, the user's groups
 *   and fsgid/fsuid (set_ids), chdir(cwd), every other descriptor closed,
 *   empty signal mask, the user's gid and uid (setresgid, setresuid), execve.
 * The daemon blocks signals around the clone so that no handler of its own
 * runs in the child.  CLONE_VFORK suspends the calling thread until the
 * child has exec'd or exited, as posix_spawn does; an exec failure reports
 * its errno through a close-on-exec pipe and the child _exits(127).  Called
 * on the loop, that child is reaped here with waitpid(pid) *inside the
 * call*, before the error is returned: the reaper only runs from the loop,
 * so it can never race that wait, and a failed spawn leaves no child behind
 * (test_proc_spawn checks this); on success the caller must reaper_watch()
 * the pid before returning to the loop.  Called in the thread pool
 * (inflight_pid, ProcessService), the reaper owns every wait: see
 * reaper_inflight in proc/reaper.h.
 * The umask is inherited: proc_init() sets the daemon's to 022.
 *
 * Returned descriptors are O_CLOEXEC|O_NONBLOCK, owned by the caller.
 */
#ifndef CONCH_PROC_SPAWN_H
#define CONCH_PROC_SPAWN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct proc_spawn_opts {
  const char *path;   /* resolved executable (proc_lookup) */
  char *const *argv;  /* argv[0] = the request's cmd */
  char *const *envp;
  const char *cwd;
  int pty;            /* 1: PTY of cols×rows as stdin/stdout/stderr */
  unsigned short cols, rows;
  int has_stdin;      /* 0: the stdin pipe's write end is closed at once */
  int use_cgroup;     /* 1: start the child in cgroup_fd (a cgroup v2 directory) */
  int cgroup_fd;
  /* Off the loop (a pool thread): the kernel stores the child's pid here as
   * it creates it (reaper_inflight), and a child whose exec failed is left
   * to the reaper (failed_pid) instead of being waited for. */
  pid_t *inflight_pid;
  int no_clone3;      /* tests: the fallback, a move by the child's write to cgroup.procs */
  /* set_ids: the child takes these groups, gid and uid (all three ids)
   * after entering its cgroup and before its chdir and exec, and a PTY's
   * slave is the uid's */
  int set_ids;
  unsigned uid, gid;
  size_t ngroups;
  const uint32_t *groups;
  /* use_exec_fd: run the open file exec_fd (> 2; execveat AT_EMPTY_PATH,
   * kept open in the child until its exec) instead of path, which then only
   * names it in the error text (the agent's upgrade trials, agent/upgrade.c) */
  int use_exec_fd, exec_fd;
  int null_in_err;    /* stdin and stderr /dev/null, no pipes (in_w, err_r -1); not with pty */
} proc_spawn_opts;

typedef struct proc_spawn_result {
  pid_t pid;   /* also the pgid (and sid with a PTY) */
  int in_w;    /* stdin pipe write end, or -1 */
  int out_r;   /* stdout pipe read end, or the PTY master */
  int err_r;   /* stderr pipe read end, or -1 (PTY) */
  int in_cgroup; /* the child entered cgroup_fd before its exec */
  int by_clone3; /* ... born there (clone3 CLONE_INTO_CGROUP), not moved */
  pid_t failed_pid; /* inflight_pid set and the exec failed: that child, unreaped */
  int error;         /* on failure, the errno the error text describes */
} proc_spawn_result;

/* 0, or -1 with err = Go-style "fork/exec <path>: <reason>". */
int proc_spawn(const proc_spawn_opts *o, proc_spawn_result *r, char *err, size_t errn);

#endif
