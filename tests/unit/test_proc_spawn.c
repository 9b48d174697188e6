/* test_proc_spawn — children start clean: default dispositions, empty
 * mask, no leaked descriptors, own process group / own session with the PTY
 * as controlling terminal and the requested size, cwd; a failed exec
 * leaves no child behind (proc_spawn reaps it inside the call); a child
 * given a cgroup starts in it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc/spawn.h"
#include "test.h"

static char *envp[] = {"PATH=/usr/bin:/bin", "HOME=/root", NULL};

static unsigned long long status_num(pid_t pid, const char *key, int base) {
  char path[64], line[256];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f) return ~0ull;
  unsigned long long v = ~0ull;
  size_t kl = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') v = strtoull(line + kl + 1, NULL, base);
  fclose(f);
  return v;
}

/* fields after "(comm)" of /proc/pid/stat: state ppid pgrp session tty_nr */
static void stat_fields(pid_t pid, int *pgrp, int *sid, int *tty) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  *pgrp = *sid = *tty = -1;
  if (!f) return;
  size_t k = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[k] = 0;
  char st;
  int ppid;
  sscanf(strrchr(buf, ')') + 2, "%c %d %d %d %d", &st, &ppid, pgrp, sid, tty);
}

static int count_fds(pid_t pid, char *list, size_t n) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "ls /proc/%d/fd | sort -n | tr '\\n' ' '", (int)pid);
  FILE *p = popen(cmd, "r");
  size_t k = fread(list, 1, n - 1, p);
  list[k] = 0;
  pclose(p);
  int c = 0;
  for (char *s = list; *s; s++)
    if (*s == ' ') c++;
  return c;
}

/* read everything from fd (nonblocking) until EOF/EIO or timeout */
static size_t read_all(int fd, char *buf, size_t n, int ms) {
  size_t off = 0;
  for (int waited = 0; waited < ms;) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int r = poll(&pfd, 1, 50);
    if (r == 0) {
      waited += 50;
      continue;
    }
    ssize_t k = read(fd, buf + off, n - 1 - off);
    if (k > 0) {
      off += (size_t)k;
      continue;
    }
    if (k < 0 && errno == EAGAIN) continue;
    break;
  }
  buf[off] = 0;
  return off;
}

TEST(clean_child) {
  /* make the parent as dirty as PID 1: ignored and blocked signals, a
   * descriptor without CLOEXEC */
  signal(SIGTERM, SIG_IGN);
  signal(SIGINT, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t blk;
  sigemptyset(&blk);
  sigaddset(&blk, SIGUSR1);
  sigprocmask(SIG_BLOCK, &blk, NULL);
  int leak = open("/dev/null", O_RDONLY);
  ASSERT(leak >= 3);

  char *argv[] = {"sleep", "5", NULL};
  proc_spawn_opts o = {.path = "/bin/sleep", .argv = argv, .envp = envp, .cwd = "/tmp", .has_stdin = 1};
  proc_spawn_result r;
  char err[256];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT(r.pid > 0);
  ASSERT(r.in_w >= 0 && r.out_r >= 0 && r.err_r >= 0);
  ASSERT(fcntl(r.out_r, F_GETFD) & FD_CLOEXEC);
  ASSERT(fcntl(r.out_r, F_GETFL) & O_NONBLOCK);

  ASSERT_EQ(status_num(r.pid, "SigIgn", 16), 0);
  ASSERT_EQ(status_num(r.pid, "SigBlk", 16), 0);
  char fds[256];
  ASSERT_EQ(count_fds(r.pid, fds, sizeof fds), 3);
  ASSERT_STR_EQ(fds, "0 1 2 ");
  int pgrp, sid, tty;
  stat_fields(r.pid, &pgrp, &sid, &tty);
  ASSERT_EQ(pgrp, r.pid);  /* own process group */
  ASSERT_NE(sid, r.pid);   /* but not a new session */
  char cwd[64], link[64];
  snprintf(link, sizeof link, "/proc/%d/cwd", (int)r.pid);
  ssize_t k = readlink(link, cwd, sizeof cwd - 1);
  ASSERT(k > 0);
  cwd[k] = 0;
  ASSERT_STR_EQ(cwd, "/tmp");
  ASSERT_EQ(status_num(r.pid, "Umask", 8), 022);

  kill(-r.pid, SIGKILL);
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  ASSERT(WIFSIGNALED(st));
  close(r.in_w);
  close(r.out_r);
  close(r.err_r);
  close(leak);
  sigprocmask(SIG_UNBLOCK, &blk, NULL);
}

TEST(pipes_and_stdin) {
  char *argv[] = {"sh", "-c", "cat; echo err >&2; exit 3", NULL};
  proc_spawn_opts o = {.path = "/bin/sh", .argv = argv, .envp = envp, .cwd = "/", .has_stdin = 1};
  proc_spawn_result r;
  char err[256], buf[256];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT_EQ(write(r.in_w, "hello\n", 6), 6);
  close(r.in_w);
  read_all(r.out_r, buf, sizeof buf, 3000);
  ASSERT_STR_EQ(buf, "hello\n");
  read_all(r.err_r, buf, sizeof buf, 3000);
  ASSERT_STR_EQ(buf, "err\n");
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  ASSERT_EQ(WEXITSTATUS(st), 3);
  close(r.out_r);
  close(r.err_r);
}

TEST(no_stdin_is_eof) {
  char *argv[] = {"cat", NULL};
  proc_spawn_opts o = {.path = "/bin/cat", .argv = argv, .envp = envp, .cwd = "/", .has_stdin = 0};
  proc_spawn_result r;
  char err[256], buf[64];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT_EQ(r.in_w, -1);
  read_all(r.out_r, buf, sizeof buf, 3000);
  ASSERT_STR_EQ(buf, "");
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(r.out_r);
  close(r.err_r);
}

TEST(pty_ctty_and_size) {
  char *argv[] = {"sh", "-c", "stty size; tty; ps -o tty= -p $$ >/dev/null; echo TERM=$TERM", NULL};
  proc_spawn_opts o = {.path = "/bin/sh", .argv = argv, .envp = envp, .cwd = "/", .pty = 1,
                       .cols = 123, .rows = 45};
  proc_spawn_result r;
  char err[256], buf[1024];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT_EQ(r.in_w, -1);
  ASSERT_EQ(r.err_r, -1);
  int pgrp, sid, tty;
  stat_fields(r.pid, &pgrp, &sid, &tty);
  read_all(r.out_r, buf, sizeof buf, 3000);
  ASSERT(strstr(buf, "45 123\r\n") != NULL);
  ASSERT(strstr(buf, "/dev/pts/") != NULL);
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  ASSERT(WIFEXITED(st));
  close(r.out_r);
  /* it was its own session leader with a controlling tty (if it had not
   * exited before we looked) */
  if (sid != -1) {
    ASSERT_EQ(sid, r.pid);
    ASSERT_EQ(pgrp, r.pid);
    ASSERT_NE(tty, 0);
  }
}

TEST(pty_session_leader) {
  char *argv[] = {"sleep", "5", NULL};
  proc_spawn_opts o = {.path = "/bin/sleep", .argv = argv, .envp = envp, .cwd = "/", .pty = 1,
                       .cols = 80, .rows = 24};
  proc_spawn_result r;
  char err[256];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  int pgrp, sid, tty;
  stat_fields(r.pid, &pgrp, &sid, &tty);
  ASSERT_EQ(sid, r.pid);
  ASSERT_EQ(pgrp, r.pid);
  ASSERT_NE(tty, 0); /* controlling terminal set */
  char fds[256];
  ASSERT_EQ(count_fds(r.pid, fds, sizeof fds), 3);
  kill(-r.pid, SIGKILL);
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  close(r.out_r);
}

TEST(exec_failure_leaves_no_child) {
  char *argv[] = {"nope", NULL};
  proc_spawn_opts o = {.path = "/nonexistent/nope", .argv = argv, .envp = envp, .cwd = "/"};
  proc_spawn_result r;
  char err[256];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), -1);
  ASSERT_STR_EQ(err, "fork/exec /nonexistent/nope: no such file or directory");
  /* proc_spawn already waited for the failed child: nothing left to reap */
  errno = 0;
  ASSERT_EQ(waitpid(-1, NULL, WNOHANG), -1);
  ASSERT_EQ(errno, ECHILD);

  o.path = "/etc/passwd"; /* not executable */
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), -1);
  ASSERT_STR_EQ(err, "fork/exec /etc/passwd: permission denied");
  o.path = "/bin/sh";
  o.cwd = "/nonexistent-dir";
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), -1);
  ASSERT_STR_EQ(err, "fork/exec /bin/sh: no such file or directory");
  ASSERT_EQ(waitpid(-1, NULL, WNOHANG), -1);
}

/* An open file run by descriptor (the agent's upgrade trials): the program
 * is the descriptor's, not path's; the descriptor stays open up to the
 * exec and not after it; stdin and stderr /dev/null; a descriptor that is not a
 * program fails with its errno. */
TEST(exec_fd_and_stderr_null) {
  int prog = open("/bin/sh", O_RDONLY | O_CLOEXEC);
  ASSERT(prog > 2);
  int pad = open("/dev/null", O_RDONLY); /* a descriptor above it, not close-on-exec */
  ASSERT(pad > prog);
  char *argv[] = {"sh", "-c", "echo out; echo err >&2; ls /proc/self/fd | sort -n | tr '\\n' ' '; "
                  "readlink /proc/self/fd/0 /proc/self/fd/2", NULL};
  proc_spawn_opts o = {.path = "the program", .argv = argv, .envp = envp, .cwd = "/", .use_exec_fd = 1,
                       .exec_fd = prog, .null_in_err = 1};
  proc_spawn_result r;
  char err[256], buf[512];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT_EQ(r.err_r, -1);
  ASSERT_EQ(r.in_w, -1);
  read_all(r.out_r, buf, sizeof buf, 3000);
  /* "err" went nowhere; fds 0-2 and the one ls opens; 0 and 2 are /dev/null */
  ASSERT_STR_EQ(buf, "out\n0 1 2 3 /dev/null\n/dev/null\n");
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  close(r.out_r);

  int notprog = open("/etc/passwd", O_RDONLY | O_CLOEXEC);
  ASSERT(notprog > 2);
  o.exec_fd = notprog;
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), -1);
  ASSERT_EQ(r.error, EACCES);
  ASSERT_STR_EQ(err, "fork/exec the program: permission denied");
  ASSERT_EQ(waitpid(-1, NULL, WNOHANG), -1); /* reaped inside the call */
  o.exec_fd = 1;
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), -1);
  ASSERT_EQ(r.error, EBADF);
  close(notprog);
  close(pad);
  close(prog);
}

/* Linux ≥ 5.7: clone3 takes CLONE_INTO_CGROUP. */
static int kernel_has_clone_into_cgroup(void) {
  struct utsname u;
  int maj = 0, min = 0;
  if (uname(&u) != 0 || sscanf(u.release, "%d.%d", &maj, &min) != 2) return 0;
  return maj > 5 || (maj == 5 && min >= 7);
}

/* The child is in the cgroup before anything else: born there by clone3
 * (CLONE_INTO_CGROUP, the spawn's own assembly entry — this test runs on
 * the arm64 kernel too, tests/vm/test_arm64.py), or, the fallback, it
 * writes "0" into cgroup.procs before its exec.  Root and a cgroup2 mount
 * are needed; the run says so when it lacks them. */
static void born_in_cgroup(int no_clone3) {
  char mnt[512] = "", line[1024];
  FILE *mi = fopen("/proc/self/mountinfo", "r");
  ASSERT(mi != NULL);
  while (fgets(line, sizeof line, mi)) {
    char *sep = strstr(line, " - ");
    char root[512], mp[512];
    if (sep && strncmp(sep + 3, "cgroup2 ", 8) == 0 && sscanf(line, "%*s %*s %*s %511s %511s", root, mp) == 2 &&
        strcmp(root, "/") == 0) {
      snprintf(mnt, sizeof mnt, "%s", mp);
      break;
    }
  }
  fclose(mi);
  char own_mnt[64] = ""; /* none visible (a sandbox root): our own, as root */
  if (!mnt[0] && geteuid() == 0) {
    snprintf(own_mnt, sizeof own_mnt, "/tmp/conch-unit-cg-XXXXXX");
    if (mkdtemp(own_mnt) && mount("none", own_mnt, "cgroup2", 0, NULL) == 0)
      snprintf(mnt, sizeof mnt, "%s", own_mnt);
    else if (own_mnt[0])
      rmdir(own_mnt);
  }
  if (geteuid() != 0 || !mnt[0]) {
    printf("  NOT RUN: child_born_in_cgroup needs root and a cgroup2 mount (counted as passed)\n");
    return;
  }
  char own[512] = "";
  FILE *cg = fopen("/proc/self/cgroup", "r");
  ASSERT(cg != NULL);
  while (fgets(line, sizeof line, cg))
    if (strncmp(line, "0::", 3) == 0) sscanf(line + 3, "%511s", own);
  fclose(cg);
  char dir[1200], name[64];
  snprintf(name, sizeof name, "conch-unit-%d", (int)getpid());
  snprintf(dir, sizeof dir, "%s%s/%s", mnt, strcmp(own, "/") == 0 ? "" : own, name);
  ASSERT_EQ(mkdir(dir, 0755), 0);
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT(fd >= 0);
  char *argv[] = {"cat", "/proc/self/cgroup", NULL};
  proc_spawn_opts o = {.path = "/bin/cat", .argv = argv, .envp = envp, .cwd = "/", .use_cgroup = 1,
                       .cgroup_fd = fd, .no_clone3 = no_clone3};
  proc_spawn_result r;
  char err[256], out[4096];
  ASSERT_EQ(proc_spawn(&o, &r, err, sizeof err), 0);
  ASSERT_EQ(r.in_cgroup, 1);
  ASSERT_EQ(r.by_clone3, !no_clone3 && kernel_has_clone_into_cgroup());
  read_all(r.out_r, out, sizeof out, 5000);
  int st;
  ASSERT_EQ(waitpid(r.pid, &st, 0), r.pid);
  close(r.out_r);
  close(r.err_r);
  close(fd);
  char want[700];
  snprintf(want, sizeof want, "0::%s/%s\n", strcmp(own, "/") == 0 ? "" : own, name);
  ASSERT_EQ(rmdir(dir), 0);
  if (own_mnt[0] && umount(own_mnt) == 0) rmdir(own_mnt);
  ASSERT(strstr(out, want) != NULL);
}

TEST(child_born_in_cgroup) { born_in_cgroup(0); }
TEST(child_moved_into_cgroup_fallback) { born_in_cgroup(1); }

int main(void) {
  umask(022);
  RUN(clean_child);
  RUN(pipes_and_stdin);
  RUN(no_stdin_is_eof);
  RUN(pty_ctty_and_size);
  RUN(pty_session_leader);
  RUN(exec_failure_leaves_no_child);
  RUN(exec_fd_and_stderr_null);
  RUN(child_born_in_cgroup);
  RUN(child_moved_into_cgroup_fallback);
  return test_summary();
}
