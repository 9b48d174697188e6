/* spawn — create one child for ProcessService (api.md §6 "The child").
 *
 * posix_spawn (glibc ≥ 2.34 CLONE_VFORK path) with:
 *   POSIX_SPAWN_SETSIGDEF (full set)  every disposition back to SIG_DFL —
 *                                     PID 1 ignores SIGTERM/SIGINT/SIGPIPE
 *   POSIX_SPAWN_SETSIGMASK (empty)    nothing blocked
 *   POSIX_SPAWN_SETPGROUP (pgid 0)    own process group (pipes), or
 *   POSIX_SPAWN_SETSID                own session (PTY): glibc runs setsid()
 *                                     before the file actions, so opening the
 *                                     slave path without O_NOCTTY makes it
 *                                     the controlling terminal
 *   file actions: stdin/stdout/stderr, addchdir_np(cwd), addclosefrom_np(3)
 * The umask is inherited: proc_init() sets the daemon's to 022.
 *
 * Exec failures: glibc's child reports the exec errno through shared memory
 * and _exit(127)s; posix_spawn() then reaps that child itself with
 * waitpid(pid) *inside the call*, on the calling (loop) thread, before
 * returning the error.  The reaper only runs from the loop, so it can never
 * race that wait; a failed spawn leaves no child behind (test_proc_spawn
 * checks this).  On success the caller must reaper_watch() the pid before
 * returning to the loop.
 *
 * Returned descriptors are O_CLOEXEC|O_NONBLOCK, owned by the caller.
 */
#ifndef CONCH_PROC_SPAWN_H
#define CONCH_PROC_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

typedef struct proc_spawn_opts {
  const char *path;   /* resolved executable (proc_lookup) */
  char *const *argv;  /* argv[0] = the request's cmd */
  char *const *envp;
  const char *cwd;
  int pty;            /* 1: PTY of cols×rows as stdin/stdout/stderr */
  unsigned short cols, rows;
  int has_stdin;      /* 0: the stdin pipe's write end is closed at once */
} proc_spawn_opts;

typedef struct proc_spawn_result {
  pid_t pid;   /* also the pgid (and sid with a PTY) */
  int in_w;    /* stdin pipe write end, or -1 */
  int out_r;   /* stdout pipe read end, or the PTY master */
  int err_r;   /* stderr pipe read end, or -1 (PTY) */
} proc_spawn_result;

/* 0, or -1 with err = Go-style "fork/exec <path>: <reason>". */
int proc_spawn(const proc_spawn_opts *o, proc_spawn_result *r, char *err, size_t errn);

#endif
