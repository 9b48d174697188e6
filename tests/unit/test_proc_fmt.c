/* test_proc_fmt — exit/signal formatting, script extensions, path
 * cleaning, mkdir -p / script / PATH lookup helpers, request validation. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proc/exitfmt.h"
#include "proc/prep.h"
#include "proc/validate.h"
#include "test.h"

static void check_exit(int wstatus, int code, const char *status, const char *error) {
  proc_exit_info ei;
  proc_exit_describe(wstatus, &ei);
  ASSERT_EQ(ei.exit_code, code);
  ASSERT_STR_EQ(ei.status, status);
  ASSERT_STR_EQ(ei.error, error);
}

TEST(exit_codes) {
  check_exit(W_EXITCODE(0, 0), 0, "exited", "");
  check_exit(W_EXITCODE(1, 0), 1, "error", "exit status 1");
  check_exit(W_EXITCODE(255, 0), 255, "error", "exit status 255");
  check_exit(W_EXITCODE(127, 0), 127, "error", "exit status 127");
}

TEST(exit_signals) {
  check_exit(W_EXITCODE(0, SIGTERM), -1, "error", "signal: terminated");
  check_exit(W_EXITCODE(0, SIGKILL), -1, "error", "signal: killed");
  check_exit(W_EXITCODE(0, SIGINT), -1, "error", "signal: interrupt");
  check_exit(W_EXITCODE(0, SIGHUP), -1, "error", "signal: hangup");
  check_exit(W_EXITCODE(0, SIGABRT) | WCOREFLAG, -1, "error", "signal: aborted (core dumped)");
  check_exit(W_EXITCODE(0, SIGSEGV), -1, "error", "signal: segmentation fault");
  check_exit(W_EXITCODE(0, SIGSEGV) | WCOREFLAG, -1, "error", "signal: segmentation fault (core dumped)");
  check_exit(W_EXITCODE(0, SIGPIPE), -1, "error", "signal: broken pipe");
  check_exit(W_EXITCODE(0, SIGUSR1), -1, "error", "signal: user defined signal 1");
  check_exit(W_EXITCODE(0, 34), -1, "error", "signal: signal 34");
}

/* The real thing: a child killed by a signal, status from waitpid. */
TEST(exit_real_child) {
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    signal(SIGTERM, SIG_DFL);
    raise(SIGTERM);
    _exit(3);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  check_exit(st, -1, "error", "signal: terminated");
}

TEST(script_ext) {
  ASSERT_STR_EQ(proc_script_ext("python"), ".py");
  ASSERT_STR_EQ(proc_script_ext("python3"), ".py");
  ASSERT_STR_EQ(proc_script_ext("python2"), ".py");
  ASSERT_STR_EQ(proc_script_ext("node"), ".js");
  ASSERT_STR_EQ(proc_script_ext("nodejs"), ".js");
  ASSERT_STR_EQ(proc_script_ext("bash"), ".sh");
  ASSERT_STR_EQ(proc_script_ext("sh"), ".sh");
  ASSERT_STR_EQ(proc_script_ext("zsh"), ".sh");
  ASSERT_STR_EQ(proc_script_ext("fish"), ".sh");
  ASSERT_STR_EQ(proc_script_ext("lua"), ".lua");
  ASSERT_STR_EQ(proc_script_ext("ruby"), ".rb");
  ASSERT_STR_EQ(proc_script_ext("rb"), ".rb");
  /* exact names only */
  ASSERT_STR_EQ(proc_script_ext("/usr/bin/bash"), ".py");
  ASSERT_STR_EQ(proc_script_ext("perl"), ".py");
  ASSERT_STR_EQ(proc_script_ext(""), ".py");
  ASSERT_STR_EQ(proc_script_ext("Python3"), ".py");
  ASSERT_STR_EQ(proc_script_ext("bash "), ".py");
}

TEST(path_clean) {
  char out[256];
  ASSERT_EQ(proc_path_clean("/tmp", "/", out, sizeof out), 0);
  ASSERT_STR_EQ(out, "/tmp");
  ASSERT_EQ(proc_path_clean("/a//b/./c/../d/", "/", out, sizeof out), 0);
  ASSERT_STR_EQ(out, "/a/b/d");
  ASSERT_EQ(proc_path_clean("/../..", "/", out, sizeof out), 0);
  ASSERT_STR_EQ(out, "/");
  ASSERT_EQ(proc_path_clean("work/x", "/srv", out, sizeof out), 0);
  ASSERT_STR_EQ(out, "/srv/work/x");
  ASSERT_EQ(proc_path_clean("/", "/", out, sizeof out), 0);
  ASSERT_STR_EQ(out, "/");
  ASSERT_EQ(proc_path_clean("/abcdefgh", "/", out, 5), -1);
}

static char tmpdir[128];

static void mk_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/conch-test-prep-XXXXXX");
  ASSERT(mkdtemp(tmpdir) != NULL);
}

TEST(mkdir_p) {
  mk_tmpdir();
  char p[256], err[512];
  snprintf(p, sizeof p, "%s/a/b/c", tmpdir);
  ASSERT_EQ(proc_mkdir_p(p, err, sizeof err), 0);
  struct stat st;
  ASSERT_EQ(stat(p, &st), 0);
  ASSERT(S_ISDIR(st.st_mode));
  ASSERT_EQ(st.st_mode & 0777, 0755);
  ASSERT_EQ(proc_mkdir_p(p, err, sizeof err), 0); /* exists: fine */
  /* a file in the way */
  char f[256], want[512];
  snprintf(f, sizeof f, "%s/file", tmpdir);
  FILE *fp = fopen(f, "w");
  ASSERT(fp);
  fclose(fp);
  snprintf(p, sizeof p, "%s/file/sub", tmpdir);
  ASSERT_EQ(proc_mkdir_p(p, err, sizeof err), -1);
  snprintf(want, sizeof want, "mkdir %s: not a directory", f);
  ASSERT_STR_EQ(err, want);
  ASSERT_EQ(proc_mkdir_p(f, err, sizeof err), -1);
  ASSERT_STR_EQ(err, want);
}

TEST(script_write) {
  char path[512], err[512];
  int dfd = -1, dfd2 = -1;
  ASSERT_EQ(proc_script_write(tmpdir, ".sh", "echo hi\n", 8, path, sizeof path, &dfd, err, sizeof err), 0);
  ASSERT(dfd >= 0);
  ASSERT(fcntl(dfd, F_GETFD) & FD_CLOEXEC);
  char prefix[256];
  snprintf(prefix, sizeof prefix, "%s/conch-script-", tmpdir);
  ASSERT_EQ(strncmp(path, prefix, strlen(prefix)), 0);
  ASSERT_STR_EQ(path + strlen(path) - 3, ".sh");
  ASSERT_EQ(strlen(path), strlen(prefix) + 12 + 3);
  struct stat st;
  ASSERT_EQ(stat(path, &st), 0);
  ASSERT_EQ(st.st_mode & 07777, 0644);
  ASSERT_EQ(st.st_size, 8);
  char path2[512];
  ASSERT_EQ(proc_script_write(tmpdir, ".sh", "x", 1, path2, sizeof path2, &dfd2, err, sizeof err), 0);
  ASSERT(strcmp(path, path2) != 0);
  ASSERT_EQ(proc_script_unlink(dfd, path), 0);
  ASSERT_EQ(proc_script_unlink(dfd2, path2), 0);
  ASSERT(access(path, F_OK) != 0 && access(path2, F_OK) != 0);
  /* the directory renamed while the script exists: removed all the same
   * (through the directory descriptor), and a script already gone is fine */
  char d[256], moved[300];
  snprintf(d, sizeof d, "%s/cwd", tmpdir);
  snprintf(moved, sizeof moved, "%s/cwd-moved", tmpdir);
  ASSERT_EQ(mkdir(d, 0755), 0);
  ASSERT_EQ(proc_script_write(d, ".py", "x", 1, path, sizeof path, &dfd, err, sizeof err), 0);
  ASSERT_EQ(proc_script_write(d, ".py", "y", 1, path2, sizeof path2, &dfd2, err, sizeof err), 0);
  ASSERT_EQ(rename(d, moved), 0);
  ASSERT_EQ(proc_script_unlink(dfd, path), 0);
  ASSERT_EQ(rmdir(moved), -1); /* the second one is still there */
  ASSERT_EQ(proc_script_unlink(dfd2, path2), 0);
  ASSERT_EQ(rmdir(moved), 0);   /* now empty */
  ASSERT_EQ(mkdir(d, 0755), 0);
  ASSERT_EQ(proc_script_write(d, ".py", "x", 1, path, sizeof path, &dfd, err, sizeof err), 0);
  ASSERT_EQ(unlink(path), 0);
  ASSERT_EQ(proc_script_unlink(dfd, path), 0);
  ASSERT_EQ(rmdir(d), 0);
  /* failure text */
  snprintf(d, sizeof d, "%s/missing", tmpdir);
  dfd = -1;
  ASSERT_EQ(proc_script_write(d, ".py", "x", 1, path, sizeof path, &dfd, err, sizeof err), -1);
  ASSERT_EQ(dfd, -1);
  ASSERT_EQ(strncmp(err, "open ", 5), 0);
  ASSERT(strstr(err, ": no such file or directory") != NULL);
}

TEST(lookup) {
  char out[512], err[512], dir[256], exe[300], want[300];
  snprintf(dir, sizeof dir, "%s/bin", tmpdir);
  ASSERT_EQ(mkdir(dir, 0755), 0);
  snprintf(exe, sizeof exe, "%s/mytool", dir);
  FILE *fp = fopen(exe, "w");
  ASSERT(fp);
  fclose(fp);
  /* not executable yet → not found */
  char pathv[600];
  snprintf(pathv, sizeof pathv, "/nonexistent:%s", dir);
  ASSERT_EQ(proc_lookup("mytool", pathv, "/", out, sizeof out, err, sizeof err), -1);
  ASSERT_STR_EQ(err, "exec: \"mytool\": executable file not found in $PATH");
  chmod(exe, 0755);
  ASSERT_EQ(proc_lookup("mytool", pathv, "/", out, sizeof out, err, sizeof err), 0);
  ASSERT_STR_EQ(out, exe);
  /* the PATH given wins over the test's own PATH */
  ASSERT_EQ(proc_lookup("sh", "/nonexistent", "/", out, sizeof out, err, sizeof err), -1);
  ASSERT_EQ(proc_lookup("sh", "", "/", out, sizeof out, err, sizeof err), -1);
  ASSERT_EQ(proc_lookup("sh", "/usr/bin:/bin", "/", out, sizeof out, err, sizeof err), 0);
  /* directories are not executables */
  ASSERT_EQ(proc_lookup("bin", tmpdir, "/", out, sizeof out, err, sizeof err), -1);
  /* relative entry: resolved against the child's cwd */
  ASSERT_EQ(proc_lookup("mytool", "bin", tmpdir, out, sizeof out, err, sizeof err), 0);
  ASSERT_STR_EQ(out, "bin/mytool");
  ASSERT_EQ(proc_lookup("mytool", ":", dir, out, sizeof out, err, sizeof err), 0);
  ASSERT_STR_EQ(out, "./mytool");
  /* a slash: as is */
  ASSERT_EQ(proc_lookup("./x/y", "", "/", out, sizeof out, err, sizeof err), 0);
  ASSERT_STR_EQ(out, "./x/y");
  snprintf(want, sizeof want, "rm -rf %s", tmpdir);
  ASSERT_EQ(system(want), 0);
}

TEST(errstr) {
  char b[64];
  ASSERT_STR_EQ(proc_errstr(ENOENT, b, sizeof b), "no such file or directory");
  ASSERT_STR_EQ(proc_errstr(EACCES, b, sizeof b), "permission denied");
  ASSERT_STR_EQ(proc_errstr(ENOEXEC, b, sizeof b), "exec format error");
}

TEST(validate_start_order) {
  char msg[256];
  Pb__StartProcessRequest r = PB__START_PROCESS_REQUEST__INIT;
  Pb__PTY pty = PB__PTY__INIT;
  char *args[] = {"-c", "x"};
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_OK);
  /* everything wrong at once: content+args reported first */
  r.content = "print(1)";
  r.n_args = 2;
  r.args = args;
  r.pty = &pty;
  r.stdin.len = 3;
  r.stdin.data = (uint8_t *)"abc";
  pty.cols = 70000;
  pty.rows = 70000;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "content and args cannot both be set");
  r.n_args = 0;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "stdin cannot be used with pty");
  r.stdin.len = 0;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid pty size: pty cols must not exceed 65535");
  pty.cols = 65535;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid pty size: pty rows must not exceed 65535");
  pty.rows = 65535;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_OK);
  /* empty content does not count as set; stdin without pty is fine */
  r.content = "";
  r.n_args = 2;
  r.pty = NULL;
  r.stdin.len = 3;
  ASSERT_EQ(proc_validate_start(&r, msg, sizeof msg), RPC_OK);
}

TEST(validate_selector_signal) {
  char msg[128];
  Pb__ProcessSelector s = PB__PROCESS_SELECTOR__INIT;
  ASSERT_EQ(proc_validate_selector(NULL, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "process pid or tag is required");
  ASSERT_EQ(proc_validate_selector(&s, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  s.tag = "t";
  ASSERT_EQ(proc_validate_selector(&s, msg, sizeof msg), RPC_OK);
  s.tag = "";
  s.pid = 7;
  ASSERT_EQ(proc_validate_selector(&s, msg, sizeof msg), RPC_OK);
  ASSERT_EQ(proc_validate_signal(0, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "signal must not be zero");
  ASSERT_EQ(proc_validate_signal(-1, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid signal -1");
  ASSERT_EQ(proc_validate_signal(65, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid signal 65");
  ASSERT_EQ(proc_validate_signal(15, msg, sizeof msg), RPC_OK);
  ASSERT_EQ(proc_validate_signal(64, msg, sizeof msg), RPC_OK);
}

/* api.md §9: limits after step 4, memory first, then cpu, then the controllers. */
TEST(validate_limits) {
  char msg[160];
  Pb__ResourceLimits l = PB__RESOURCE_LIMITS__INIT;
  ASSERT_EQ(proc_validate_limits(NULL, 2, "no", msg, sizeof msg), RPC_OK);
  ASSERT_EQ(proc_validate_limits(&l, 2, "no", msg, sizeof msg), RPC_OK); /* all 0: none */
  l.memory_max_bytes = 1048575;
  l.cpu_millis = 5000;
  ASSERT_EQ(proc_validate_limits(&l, 2, "no", msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid limits: memoryMaxBytes must be at least 1048576");
  l.memory_max_bytes = 1048576;
  ASSERT_EQ(proc_validate_limits(&l, 2, "no", msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid limits: cpuMillis must not exceed 2000");
  l.cpu_millis = 2000;
  ASSERT_EQ(proc_validate_limits(&l, 2, "why not", msg, sizeof msg), RPC_FAILED_PRECONDITION);
  ASSERT_STR_EQ(msg, "resource limits are not available: why not");
  ASSERT_EQ(proc_validate_limits(&l, 2, NULL, msg, sizeof msg), RPC_OK);
  l.memory_max_bytes = l.cpu_millis = 0;
  l.pids_max = 1;
  ASSERT_EQ(proc_validate_limits(&l, 4, "x", msg, sizeof msg), RPC_FAILED_PRECONDITION);
  Pb__ProcessSelector s = PB__PROCESS_SELECTOR__INIT;
  s.all = 1;
  s.pid = 7;
  ASSERT_EQ(proc_validate_selector(&s, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "process selector all is only valid for SendSignal");
}

TEST(validate_pty_size) {
  char msg[128];
  Pb__PTY pty = PB__PTY__INIT;
  ASSERT_EQ(proc_validate_pty_size(NULL, 0, msg, sizeof msg), RPC_OK);
  ASSERT_EQ(proc_validate_pty_size(NULL, 1, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "pty size is required");
  ASSERT_EQ(proc_validate_pty_size(&pty, 1, msg, sizeof msg), RPC_OK); /* 0 → 80×24 later */
  pty.cols = 65536;
  pty.rows = 65536;
  ASSERT_EQ(proc_validate_pty_size(&pty, 1, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid pty size: pty cols must not exceed 65535");
  pty.cols = 65535;
  ASSERT_EQ(proc_validate_pty_size(&pty, 1, msg, sizeof msg), RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(msg, "invalid pty size: pty rows must not exceed 65535");
  pty.rows = 65535;
  ASSERT_EQ(proc_validate_pty_size(&pty, 1, msg, sizeof msg), RPC_OK);
}

int main(void) {
  RUN(exit_codes);
  RUN(exit_signals);
  RUN(exit_real_child);
  RUN(script_ext);
  RUN(path_clean);
  RUN(mkdir_p);
  RUN(script_write);
  RUN(lookup);
  RUN(errstr);
  RUN(validate_limits);
  RUN(validate_start_order);
  RUN(validate_selector_signal);
  RUN(validate_pty_size);
  return test_summary();
}
