/* entrypoint — start the rootfs entrypoint; see entrypoint.h. */
#include "init/entrypoint.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"
#include "core/senv.h"
#include "proc/reaper.h"

int entrypoint_usable(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0 || S_ISDIR(st.st_mode)) return 0;
  return access(path, X_OK) == 0;
}

static void entrypoint_exited(pid_t pid, int wstatus, const struct rusage *ru, void *arg) {
  (void)arg;
  if (WIFEXITED(wstatus))
    LOG_INFO("rootfs entrypoint exited pid=%d status=%d", (int)pid, WEXITSTATUS(wstatus));
  else if (WIFSIGNALED(wstatus))
    LOG_WARN("rootfs entrypoint killed pid=%d signal=%d", (int)pid, WTERMSIG(wstatus));
}

pid_t entrypoint_start(const char *path, const char *sandbox_id) {
  const char *keys[3] = {"HOME", "PATH", "CONCH_SANDBOX_ID"};
  const char *vals[3] = {"/root", ENTRYPOINT_PATH_ENV, sandbox_id ? sandbox_id : ""};
  char **envp = senv_build(keys, vals, 3);
  if (!envp) return -ENOMEM;
  char *argv[2] = {(char *)path, NULL};
  /* everything the child needs is prepared before fork: between fork and
   * exec only async-signal-safe calls */
  pid_t pid = fork();
  if (pid < 0) {
    int e = errno;
    free(envp);
    return -e;
  }
  if (pid == 0) {
    sigset_t all;
    sigemptyset(&all);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int s = 1; s < NSIG; s++) sigaction(s, &dfl, NULL);
    sigprocmask(SIG_SETMASK, &all, NULL);
    setsid();
    if (chdir("/") != 0) _exit(127);
    int nul = open("/dev/null", O_RDONLY);
    if (nul >= 0 && nul != 0) {
      dup2(nul, 0);
      close(nul);
    }
    syscall(SYS_close_range, 3u, ~0u, 0u);
    execve(path, argv, envp);
    _exit(127);
  }
  free(envp);
  if (reaper_watch(pid, entrypoint_exited, NULL) != 0)
    LOG_WARN("rootfs entrypoint pid=%d: not watched (out of memory); reaped as an orphan", (int)pid);
  LOG_INFO("rootfs entrypoint started pid=%d path=%s", (int)pid, path);
  return pid;
}
