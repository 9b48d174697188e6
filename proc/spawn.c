/* spawn — see spawn.h. */
#include "proc/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "proc/prep.h"

#ifndef CLONE_VFORK
#define CLONE_VFORK 0x00004000
#endif
#define PROC_CLONE_INTO_CGROUP 0x200000000ULL

/* struct clone_args of linux/sched.h up to `cgroup` (size 88, kernel 5.7) */
struct proc_clone_args {
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid,
      set_tid_size, cgroup;
};

/* the kernel's sigaction for rt_sigaction (x86-64 layout, no restorer needed for SIG_DFL) */
struct proc_ksigaction {
  void *handler;
  unsigned long flags;
  void *restorer;
  uint64_t mask;
};

static void proc_close_fd(int *fd) {
  if (*fd >= 0) close(*fd);
  *fd = -1;
}

static int proc_set_nonblock(int fd) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static int proc_open_pty(unsigned short cols, unsigned short rows, char *slave, size_t n) {
  int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (m < 0) return -1;
  struct winsize ws = {.ws_row = rows, .ws_col = cols};
  if (grantpt(m) != 0 || unlockpt(m) != 0 || ptsname_r(m, slave, n) != 0 ||
      ioctl(m, TIOCSWINSZ, &ws) != 0) {
    int e = errno;
    close(m);
    errno = e;
    return -1;
  }
  return m;
}

struct proc_child_plan {
  const proc_spawn_opts *o;
  const char *slave; /* PTY slave path, or NULL */
  int in0, out1, err1; /* pipe ends for 0/1/2 (not PTY) */
  int errfd;           /* exec errno goes here */
};

/* In the child: raw system calls only (see spawn.h). */
static void __attribute__((noreturn)) proc_child(const struct proc_child_plan *c) {
  long r = 0;
  struct proc_ksigaction dfl = {0};
  for (int sig = 1; sig <= 64; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8);
  if (c->slave) {
    r = syscall(SYS_setsid);
    if (r >= 0) r = syscall(SYS_openat, AT_FDCWD, c->slave, O_RDWR, 0); /* session leader: ctty */
    if (r >= 0) {
      int fd = (int)r;
      for (int t = 0; t < 3 && r >= 0; t++)
        if (fd != t) r = syscall(SYS_dup3, fd, t, 0);
      if (r >= 0 && fd > 2) syscall(SYS_close, fd);
    }
  } else {
    r = syscall(SYS_setpgid, 0, 0);
    if (r >= 0) r = syscall(SYS_dup3, c->in0, 0, 0);
    if (r >= 0) r = syscall(SYS_dup3, c->out1, 1, 0);
    if (r >= 0) r = syscall(SYS_dup3, c->err1, 2, 0);
  }
  if (r >= 0) r = syscall(SYS_chdir, c->o->cwd);
  if (r >= 0) {
    if (c->errfd > 3) syscall(SYS_close_range, 3u, (unsigned)c->errfd - 1, 0u);
    syscall(SYS_close_range, (unsigned)c->errfd + 1, ~0u, 0u);
    uint64_t none = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    syscall(SYS_execve, c->o->path, c->o->argv, c->o->envp);
  }
  int e = errno;
  syscall(SYS_write, c->errfd, &e, sizeof e);
  syscall(SYS_exit_group, 127);
  __builtin_unreachable();
}

/* clone3 with CLONE_VFORK (and CLONE_INTO_CGROUP); a kernel or sandbox
 * without clone3 gets clone(CLONE_VFORK) and *in_cg = 0.  Returns the pid
 * (0 in the child), or -1 with errno. */
static long proc_clone(int cgfd, int *in_cg, pid_t *settid) {
  struct proc_clone_args a = {.flags = CLONE_VFORK, .exit_signal = SIGCHLD};
  if (settid) {
    a.flags |= CLONE_PARENT_SETTID;
    a.parent_tid = (uint64_t)(uintptr_t)settid;
  }
  if (cgfd >= 0) {
    a.flags |= PROC_CLONE_INTO_CGROUP;
    a.cgroup = (uint64_t)cgfd;
  }
  *in_cg = cgfd >= 0;
  long pid = syscall(SYS_clone3, &a, sizeof a);
  if (pid < 0 && errno == ENOSYS) {
    *in_cg = 0;
    pid = syscall(SYS_clone, CLONE_VFORK | SIGCHLD | (settid ? CLONE_PARENT_SETTID : 0), 0, settid, 0, 0);
  }
  return pid;
}

int proc_spawn(const proc_spawn_opts *o, proc_spawn_result *r, char *err, size_t errn) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1}, ep[2] = {-1, -1}, master = -1;
  char slave[64];
  char eb[96];
  int e = 0;

  r->pid = -1;
  r->in_w = r->out_r = r->err_r = -1;
  r->in_cgroup = 0;
  r->failed_pid = 0;

  if (o->pty) {
    master = proc_open_pty(o->cols, o->rows, slave, sizeof slave);
    if (master < 0) goto sys_fail;
  } else {
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(er, O_CLOEXEC)) goto sys_fail;
  }
  if (pipe2(ep, O_CLOEXEC)) goto sys_fail;

  struct proc_child_plan plan = {o, o->pty ? slave : NULL, in[0], out[1], er[1], ep[1]};
  sigset_t all, old;
  memset(&all, 0xff, sizeof all); /* glibc's pthread_sigmask leaves its internal 32/33 alone */
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = proc_clone(o->use_cgroup ? o->cgroup_fd : -1, &r->in_cgroup, o->inflight_pid);
  if (pid == 0) proc_child(&plan);
  e = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) goto fail_e;

  /* the child has exec'd (ep's write end closed) or exited (errno written) */
  proc_close_fd(&ep[1]);
  int child_errno = 0;
  ssize_t got;
  do got = read(ep[0], &child_errno, sizeof child_errno);
  while (got < 0 && errno == EINTR);
  proc_close_fd(&ep[0]);
  if (got == (ssize_t)sizeof child_errno) {
    int st;
    if (o->inflight_pid) /* off the loop: the reaper reaps it (reaper_inflight) */
      r->failed_pid = (pid_t)pid;
    else
      while (waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR) {
      }
    e = child_errno;
    goto fail_e;
  }

  r->pid = (pid_t)pid;
  if (o->pty) {
    proc_set_nonblock(master);
    r->out_r = master;
  } else {
    proc_close_fd(&in[0]);
    proc_close_fd(&out[1]);
    proc_close_fd(&er[1]);
    if (o->has_stdin) {
      proc_set_nonblock(in[1]);
      r->in_w = in[1];
    } else {
      proc_close_fd(&in[1]); /* immediate EOF */
    }
    proc_set_nonblock(out[0]);
    proc_set_nonblock(er[0]);
    r->out_r = out[0];
    r->err_r = er[0];
  }
  return 0;

sys_fail:
  e = errno;
fail_e:
  snprintf(err, errn, "fork/exec %s: %s", o->path, proc_errstr(e, eb, sizeof eb));
  for (int i = 0; i < 2; i++) {
    proc_close_fd(&in[i]);
    proc_close_fd(&out[i]);
    proc_close_fd(&er[i]);
    proc_close_fd(&ep[i]);
  }
  proc_close_fd(&master);
  r->in_cgroup = 0;
  return -1;
}
