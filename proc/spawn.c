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
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "proc/prep.h"

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
  int procsfd;         /* the cgroup's cgroup.procs, or -1 */
};

/* In the child, on its own small stack in the daemon's memory (CLONE_VM):
 * raw system calls only, nothing instrumented (see spawn.h). */
__attribute__((no_sanitize("address", "undefined"))) static int proc_child(void *arg) {
  const struct proc_child_plan *c = arg;
  long r = 0;
  /* first of all into the command's cgroup: nothing can fork before */
  if (c->procsfd >= 0) r = syscall(SYS_write, c->procsfd, "0", 1) == 1 ? 0 : -1;
  struct proc_ksigaction dfl = {0};
  for (int sig = 1; sig <= 64 && r >= 0; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8);
  if (r < 0) {
  } else if (c->slave) {
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
    int in = c->in0, err = c->err1;
    if (r >= 0) r = syscall(SYS_dup3, c->out1, 1, 0);
    if (r >= 0 && c->o->null_in_err) /* after 1 is taken; above 2 it is closed with the rest below */
      r = in = err = (int)syscall(SYS_openat, AT_FDCWD, "/dev/null", O_RDWR, 0);
    if (r >= 0 && in != 0) r = syscall(SYS_dup3, in, 0, 0);
    if (r >= 0 && err != 2) r = syscall(SYS_dup3, err, 2, 0);
  }
  /* The user's groups and file-system ids first (raw: this task alone;
   * glibc's would signal every thread), so that chdir is checked as the
   * user; the uid and gid last, just before execve: once the task is the
   * user's, the user's processes may signal it, and a SIGSTOP there would
   * hold the pool thread that waits for the exec (CLONE_VFORK). */
  if (r >= 0 && c->o->set_ids) {
    r = syscall(SYS_setgroups, c->o->ngroups, c->o->groups);
    if (r >= 0) {
      syscall(SYS_setfsgid, c->o->gid);
      syscall(SYS_setfsuid, c->o->uid);
    }
  }
  if (r >= 0) r = syscall(SYS_chdir, c->o->cwd);
  if (r >= 0) {
    /* every descriptor past 2 closed but the error pipe and the program */
    int lo = c->errfd, hi = c->errfd;
    if (c->o->use_exec_fd && c->o->exec_fd < lo) lo = c->o->exec_fd;
    if (c->o->use_exec_fd && c->o->exec_fd > hi) hi = c->o->exec_fd;
    if (lo > 3) syscall(SYS_close_range, 3u, (unsigned)lo - 1, 0u);
    if (hi > lo + 1) syscall(SYS_close_range, (unsigned)lo + 1, (unsigned)hi - 1, 0u);
    syscall(SYS_close_range, (unsigned)hi + 1, ~0u, 0u);
    uint64_t none = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    if (c->o->set_ids) {
      r = syscall(SYS_setresgid, c->o->gid, c->o->gid, c->o->gid);
      if (r >= 0) r = syscall(SYS_setresuid, c->o->uid, c->o->uid, c->o->uid);
    }
    if (r >= 0 && c->o->use_exec_fd)
      syscall(SYS_execveat, c->o->exec_fd, "", c->o->argv, c->o->envp, AT_EMPTY_PATH);
    else if (r >= 0)
      syscall(SYS_execve, c->o->path, c->o->argv, c->o->envp);
  }
  int e = errno; /* the suspended parent thread's errno (shared TLS): it reads it only on failure */
  syscall(SYS_write, c->errfd, &e, sizeof e);
  syscall(SYS_exit_group, 127);
  return 127;
}

#define PROC_CHILD_STACK (64u * 1024)

/* clone3 with the child in its cgroup from birth (CLONE_INTO_CGROUP, Linux
 * 5.7).  Writing a pid into cgroup.procs takes the kernel's threadgroup
 * rwsem for writing, which waits for an RCU grace period whenever no other
 * migration ran within the last one: 6–24 ms for a command started alone
 * (tests/bench/process.sh "spaced"), against ~0.7 ms without cgroups; a
 * clone into the cgroup takes it for reading.  clone3 has no libc wrapper,
 * and a CLONE_VM child returns from the system call on its new stack, so
 * the call and the child's entry are a few lines of assembly: the child
 * calls fn(arg) and exits with its result (proc_child never returns). */
struct proc_clone_args { /* struct clone_args, Linux ≥ 5.7 (CLONE_ARGS_SIZE_VER2) */
  uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size,
      cgroup;
};
#define PROC_CLONE_INTO_CGROUP 0x200000000ULL

#if defined(__x86_64__) || defined(__aarch64__)
/* long proc_clone3(struct proc_clone_args *a, size_t size, int (*fn)(void *), void *arg): the child's pid
 * or -errno */
long proc_clone3(struct proc_clone_args *a, size_t size, int (*fn)(void *), void *arg);
#if defined(__x86_64__)
__asm__(".text\n"
        ".type proc_clone3, @function\n"
        "proc_clone3:\n"
        "  mov %rdx, %r8\n"  /* fn and arg survive the syscall in r8/r9 (it clobbers rcx, r11) */
        "  mov %rcx, %r9\n"
        "  mov $435, %eax\n" /* __NR_clone3 */
        "  syscall\n"
        "  test %rax, %rax\n"
        "  jnz 1f\n"
        "  xor %ebp, %ebp\n" /* the child: the stack top is 16-byte aligned */
        "  mov %r9, %rdi\n"
        "  call *%r8\n"
        "  mov %eax, %edi\n"
        "  mov $60, %eax\n" /* __NR_exit */
        "  syscall\n"
        "  hlt\n"
        "1: ret\n"
        ".size proc_clone3, .-proc_clone3\n");
#else
__asm__(".text\n"
        ".type proc_clone3, %function\n"
        "proc_clone3:\n"
        "  mov x9, x2\n" /* the kernel keeps x1-x30 */
        "  mov x10, x3\n"
        "  mov x8, #435\n"
        "  svc #0\n"
        "  cbnz x0, 1f\n"
        "  mov x29, xzr\n"
        "  mov x30, xzr\n"
        "  mov x0, x10\n"
        "  blr x9\n"
        "  mov x8, #93\n" /* __NR_exit */
        "  svc #0\n"
        "1: ret\n"
        ".size proc_clone3, .-proc_clone3\n");
#endif
#define PROC_HAVE_CLONE3 1
#else
#define PROC_HAVE_CLONE3 0
#endif

/* 1 until clone3 or its cgroup field turned out to be missing (ENOSYS, E2BIG, EINVAL: an older kernel) */
static int proc_clone3_ok = PROC_HAVE_CLONE3;

/* The child, with every signal blocked around the clone: into the cgroup by
 * clone3 when it can, else by the child's own write to plan->procsfd
 * (opened only then: the common start needs no cgroup.procs). */
static int proc_clone_child(const proc_spawn_opts *o, struct proc_child_plan *plan, void *stack, int *e,
                            int *by_clone3) {
  sigset_t all, old;
  memset(&all, 0xff, sizeof all); /* glibc's pthread_sigmask leaves its internal 32/33 alone */
  pthread_sigmask(SIG_SETMASK, &all, &old);
  long pid = -ENOSYS;
#if PROC_HAVE_CLONE3
  if (o->use_cgroup && !o->no_clone3 && __atomic_load_n(&proc_clone3_ok, __ATOMIC_RELAXED)) {
    struct proc_clone_args a = {
        .flags = CLONE_VM | CLONE_VFORK | PROC_CLONE_INTO_CGROUP | (o->inflight_pid ? CLONE_PARENT_SETTID : 0),
        .parent_tid = (uint64_t)(uintptr_t)o->inflight_pid,
        .exit_signal = SIGCHLD,
        .stack = (uint64_t)(uintptr_t)stack,
        .stack_size = PROC_CHILD_STACK,
        .cgroup = (uint64_t)o->cgroup_fd,
    };
    pid = proc_clone3(&a, sizeof a, proc_child, plan);
    *by_clone3 = pid > 0;
    if (pid == -ENOSYS || pid == -E2BIG || pid == -EINVAL) __atomic_store_n(&proc_clone3_ok, 0, __ATOMIC_RELAXED);
    /* -EAGAIN: the workload is at its pids.max; a move after the clone is
     * not held to it, so that a command that stops the others can start */
  }
#endif
  if (pid < 0 && o->use_cgroup) {
    plan->procsfd = openat(o->cgroup_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
    if (plan->procsfd < 0) pid = -errno;
  }
  if (pid < 0 && (!o->use_cgroup || plan->procsfd >= 0)) {
    pid = clone(proc_child, (char *)stack + PROC_CHILD_STACK,
                CLONE_VM | CLONE_VFORK | SIGCHLD | (o->inflight_pid ? CLONE_PARENT_SETTID : 0), plan,
                o->inflight_pid);
    if (pid < 0) pid = -errno;
  }
  if (plan->procsfd >= 0) close(plan->procsfd); /* the child has exec'd or exited (CLONE_VFORK) */
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  *e = pid < 0 ? (int)-pid : 0;
  return pid < 0 ? -1 : (int)pid;
}

int proc_spawn(const proc_spawn_opts *o, proc_spawn_result *r, char *err, size_t errn) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1}, ep[2] = {-1, -1}, master = -1;
  void *stack = NULL;
  char slave[64];
  char eb[96];
  int e = 0;

  r->pid = -1;
  r->in_w = r->out_r = r->err_r = -1;
  r->in_cgroup = r->by_clone3 = 0;
  r->failed_pid = 0;
  r->error = 0;

  if (o->use_exec_fd && o->exec_fd <= 2) {
    errno = EBADF;
    goto sys_fail;
  }
  if (o->pty) {
    master = proc_open_pty(o->cols, o->rows, slave, sizeof slave);
    if (master < 0) goto sys_fail;
    if (o->set_ids && chown(slave, o->uid, (gid_t)-1) != 0) goto sys_fail; /* the user's terminal */
  } else {
    if ((!o->null_in_err && (pipe2(in, O_CLOEXEC) || pipe2(er, O_CLOEXEC))) || pipe2(out, O_CLOEXEC))
      goto sys_fail;
  }
  if (pipe2(ep, O_CLOEXEC)) goto sys_fail;

  stack = mmap(NULL, PROC_CHILD_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    stack = NULL;
    goto sys_fail;
  }
  struct proc_child_plan plan = {o, o->pty ? slave : NULL, in[0], out[1], er[1], ep[1], -1};
  /* CLONE_VM|CLONE_VFORK as posix_spawn: no copy of the daemon's memory */
  int pid = proc_clone_child(o, &plan, stack, &e, &r->by_clone3);
  munmap(stack, PROC_CHILD_STACK);
  stack = NULL;
  if (pid < 0) goto fail_e;
  r->in_cgroup = o->use_cgroup;

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
    if (o->has_stdin && in[1] >= 0) {
      proc_set_nonblock(in[1]);
      r->in_w = in[1];
    } else {
      proc_close_fd(&in[1]); /* immediate EOF */
    }
    proc_set_nonblock(out[0]);
    if (er[0] >= 0) proc_set_nonblock(er[0]);
    r->out_r = out[0];
    r->err_r = er[0];
  }
  return 0;

sys_fail:
  e = errno;
fail_e:
  r->error = e;
  snprintf(err, errn, "fork/exec %s: %s", o->path, proc_errstr(e, eb, sizeof eb));
  for (int i = 0; i < 2; i++) {
    proc_close_fd(&in[i]);
    proc_close_fd(&out[i]);
    proc_close_fd(&er[i]);
    proc_close_fd(&ep[i]);
  }
  proc_close_fd(&master);
  if (stack) munmap(stack, PROC_CHILD_STACK);
  r->in_cgroup = r->by_clone3 = 0;
  return -1;
}
