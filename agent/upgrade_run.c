/* upgrade_run — the pure checks of an Upgrade and its trial child; see
 * upgrade.h.  The child is made as proc/spawn.c makes a command's
 * (clone(CLONE_VM|CLONE_VFORK) on a small stack of its own, raw system
 * calls only in it, every signal blocked around the clone), but without a
 * cgroup, user or terminal: it is the agent's own business, not the
 * workload's. */
#include "agent/upgrade.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define UP_MACHINE EM_X86_64
#define UP_ARCH "x86-64"
#elif defined(__aarch64__)
#define UP_MACHINE EM_AARCH64
#define UP_ARCH "arm64"
#else
#define UP_MACHINE EM_NONE /* not checked */
#define UP_ARCH "other"
#endif
#if __SIZEOF_POINTER__ == 8
#define UP_CLASS ELFCLASS64
#else
#define UP_CLASS ELFCLASS32
#endif
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define UP_DATA ELFDATA2LSB
#else
#define UP_DATA ELFDATA2MSB
#endif

int upgrade_elf_check(const uint8_t *h, size_t n, char *why, size_t whylen) {
  if (n < 20 || memcmp(h, ELFMAG, SELFMAG) != 0 ||
      (h[EI_DATA] != ELFDATA2LSB && h[EI_DATA] != ELFDATA2MSB)) {
    snprintf(why, whylen, "not an ELF executable");
    return -1;
  }
  /* e_type at 16, e_machine at 18 in both classes, in the file's byte order */
  int le = h[EI_DATA] == ELFDATA2LSB;
  unsigned type = le ? (unsigned)(h[16] | h[17] << 8) : (unsigned)(h[16] << 8 | h[17]);
  unsigned machine = le ? (unsigned)(h[18] | h[19] << 8) : (unsigned)(h[18] << 8 | h[19]);
  if (type != ET_EXEC && type != ET_DYN) {
    snprintf(why, whylen, "not an ELF executable");
    return -1;
  }
  if (UP_MACHINE != EM_NONE && machine != UP_MACHINE) {
    snprintf(why, whylen, "not an %s executable (ELF machine %u)", UP_ARCH, machine);
    return -1;
  }
  if (h[EI_CLASS] != UP_CLASS || h[EI_DATA] != UP_DATA) {
    snprintf(why, whylen, "not an %s executable (%s ELF)", UP_ARCH,
             h[EI_DATA] != UP_DATA ? "byte order of another" : "word size of another");
    return -1;
  }
  return 0;
}

int upgrade_parse_version(const char *out, size_t n, char *ver) {
  static const char pre[] = "conch-init ";
  size_t pl = sizeof pre - 1;
  if (n < pl || memcmp(out, pre, pl) != 0) return -1;
  size_t i = pl;
  while (i < n && i - pl <= UPGRADE_VERSION_MAX) {
    char ch = out[i];
    if (!((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '.' ||
          ch == '+' || ch == '~' || ch == '_' || ch == '-'))
      break;
    i++;
  }
  size_t vl = i - pl;
  if (vl == 0 || vl > UPGRADE_VERSION_MAX) return -1;
  /* the line ends here */
  if (i < n && out[i] != '\n' && !(out[i] == '\r' && i + 1 < n && out[i + 1] == '\n')) return -1;
  memcpy(ver, out + pl, vl);
  ver[vl] = 0;
  return 0;
}

/* ------------------------------------------------------------ the child */

struct up_ksigaction { /* the kernel's sigaction: SIG_DFL needs no restorer */
  void *handler;
  unsigned long flags;
  void *restorer;
  uint64_t mask;
};

struct up_plan {
  int prog_fd, null_fd, out_w, err_w;
  char *const *argv;
  char *const *envp;
};

/* In the child, on its own stack in the agent's memory (CLONE_VM): raw
 * system calls only, nothing instrumented (proc/spawn.h). */
__attribute__((no_sanitize("address", "undefined"))) static int up_child(void *arg) {
  const struct up_plan *p = arg;
  struct up_ksigaction dfl = {0};
  for (int sig = 1; sig <= 64; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) syscall(SYS_rt_sigaction, sig, &dfl, NULL, 8);
  long r = syscall(SYS_setpgid, 0, 0); /* its own group: the timeout kills all of it */
  if (r >= 0) r = syscall(SYS_dup3, p->null_fd, 0, 0);
  if (r >= 0) r = syscall(SYS_dup3, p->out_w, 1, 0);
  if (r >= 0) r = syscall(SYS_dup3, p->null_fd, 2, 0);
  if (r >= 0) r = syscall(SYS_chdir, "/");
  if (r >= 0) {
    /* nothing of the agent's past 2 but the program and the error pipe,
     * both close-on-exec */
    int lo = p->prog_fd < p->err_w ? p->prog_fd : p->err_w, hi = p->prog_fd < p->err_w ? p->err_w : p->prog_fd;
    if (lo > 3) syscall(SYS_close_range, 3u, (unsigned)lo - 1, 0u);
    if (hi > lo + 1) syscall(SYS_close_range, (unsigned)lo + 1, (unsigned)hi - 1, 0u);
    syscall(SYS_close_range, (unsigned)hi + 1, ~0u, 0u);
    uint64_t none = 0;
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &none, NULL, 8);
    syscall(SYS_execveat, p->prog_fd, "", p->argv, p->envp, AT_EMPTY_PATH);
  }
  int e = errno; /* the suspended parent thread's errno (shared TLS): read only on failure */
  syscall(SYS_write, p->err_w, &e, sizeof e);
  syscall(SYS_exit_group, 127);
  return 127;
}

#define UP_CHILD_STACK (64u * 1024)

int upgrade_spawn(int prog_fd, char *const argv[], pid_t *inflight_pid, int *out_r, int *exec_errno) {
  static char *const envp[] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", NULL};
  int out[2] = {-1, -1}, ep[2] = {-1, -1}, null_fd = -1, e = 0, ret = -1;
  void *stack = MAP_FAILED;
  *out_r = -1;
  *exec_errno = 0;
  if (pipe2(out, O_CLOEXEC) != 0 || pipe2(ep, O_CLOEXEC) != 0 ||
      (null_fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
    e = errno;
    goto out;
  }
  stack = mmap(NULL, UP_CHILD_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) {
    e = errno;
    goto out;
  }
  struct up_plan plan = {prog_fd, null_fd, out[1], ep[1], argv, envp};
  sigset_t all, old;
  memset(&all, 0xff, sizeof all); /* no handler of the agent's runs in the child */
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int pid = clone(up_child, (char *)stack + UP_CHILD_STACK, CLONE_VM | CLONE_VFORK | CLONE_PARENT_SETTID | SIGCHLD,
                  &plan, inflight_pid);
  if (pid < 0) e = errno;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (pid < 0) goto out;
  /* the child has exec'd (the error pipe's end closed) or failed (errno written) */
  close(ep[1]);
  ep[1] = -1;
  int child_errno = 0;
  ssize_t got;
  do got = read(ep[0], &child_errno, sizeof child_errno);
  while (got < 0 && errno == EINTR);
  ret = 0;
  if (got == (ssize_t)sizeof child_errno) {
    *exec_errno = child_errno ? child_errno : ENOEXEC;
  } else {
    int fl = fcntl(out[0], F_GETFL);
    if (fl >= 0) fcntl(out[0], F_SETFL, fl | O_NONBLOCK);
    *out_r = out[0];
    out[0] = -1;
  }
out:
  if (ret < 0) *exec_errno = e;
  if (stack != MAP_FAILED) munmap(stack, UP_CHILD_STACK);
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0) close(out[i]);
    if (ep[i] >= 0) close(ep[i]);
  }
  if (null_fd >= 0) close(null_fd);
  return ret;
}
