/* spawn — see spawn.h. */
#include "proc/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "proc/prep.h"

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

int proc_spawn(const proc_spawn_opts *o, proc_spawn_result *r, char *err, size_t errn) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, er[2] = {-1, -1}, master = -1;
  char slave[64];
  char eb[96];
  int e = 0;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t fa;
  int attr_ok = 0, fa_ok = 0;

  r->pid = -1;
  r->in_w = r->out_r = r->err_r = -1;

  if (o->pty) {
    master = proc_open_pty(o->cols, o->rows, slave, sizeof slave);
    if (master < 0) goto sys_fail;
  } else {
    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(er, O_CLOEXEC)) goto sys_fail;
  }

  if ((e = posix_spawnattr_init(&attr))) goto fail_e;
  attr_ok = 1;
  sigset_t all, none;
  /* every signal: sigfillset() leaves out glibc's internal 32/33, which the
   * child would then inherit as SIG_IGN */
  memset(&all, 0xff, sizeof all);
  sigemptyset(&none);
  short flags = POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK |
                (o->pty ? POSIX_SPAWN_SETSID : POSIX_SPAWN_SETPGROUP);
  if ((e = posix_spawnattr_setflags(&attr, flags)) || (e = posix_spawnattr_setsigdefault(&attr, &all)) ||
      (e = posix_spawnattr_setsigmask(&attr, &none)) || (e = posix_spawnattr_setpgroup(&attr, 0)))
    goto fail_e;

  if ((e = posix_spawn_file_actions_init(&fa))) goto fail_e;
  fa_ok = 1;
  if (o->pty) {
    /* session leader without a ctty opening a tty → it becomes the ctty */
    if ((e = posix_spawn_file_actions_addopen(&fa, 0, slave, O_RDWR, 0)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, 0, 1)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, 0, 2)))
      goto fail_e;
  } else {
    if ((e = posix_spawn_file_actions_adddup2(&fa, in[0], 0)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, out[1], 1)) ||
        (e = posix_spawn_file_actions_adddup2(&fa, er[1], 2)))
      goto fail_e;
  }
  if ((e = posix_spawn_file_actions_addchdir_np(&fa, o->cwd)) ||
      (e = posix_spawn_file_actions_addclosefrom_np(&fa, 3)))
    goto fail_e;

  pid_t pid;
  e = posix_spawn(&pid, o->path, &fa, &attr, o->argv, o->envp);
  if (e) {
    snprintf(err, errn, "fork/exec %s: %s", o->path, proc_errstr(e, eb, sizeof eb));
    goto out_fail;
  }
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);

  r->pid = pid;
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
out_fail:
  if (fa_ok) posix_spawn_file_actions_destroy(&fa);
  if (attr_ok) posix_spawnattr_destroy(&attr);
  for (int i = 0; i < 2; i++) {
    proc_close_fd(&in[i]);
    proc_close_fd(&out[i]);
    proc_close_fd(&er[i]);
  }
  proc_close_fd(&master);
  return -1;
}
