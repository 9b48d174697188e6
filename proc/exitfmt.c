/* exitfmt — see exitfmt.h. */
#include "proc/exitfmt.h"

#include <stdio.h>
#include <sys/wait.h>

/* Go's syscall.signals table for linux (zerrors_linux_*.go), index = signo. */
static const char *const proc_sig_names[32] = {
    NULL,
    "hangup",
    "interrupt",
    "quit",
    "illegal instruction",
    "trace/breakpoint trap",
    "aborted",
    "bus error",
    "floating point exception",
    "killed",
    "user defined signal 1",
    "segmentation fault",
    "user defined signal 2",
    "broken pipe",
    "alarm clock",
    "terminated",
    "stack fault",
    "child exited",
    "continued",
    "stopped (signal)",
    "stopped",
    "stopped (tty input)",
    "stopped (tty output)",
    "urgent I/O condition",
    "CPU time limit exceeded",
    "file size limit exceeded",
    "virtual timer expired",
    "profiling timer expired",
    "window changed",
    "I/O possible",
    "power failure",
    "bad system call",
};

const char *proc_signal_name(int sig, char *buf, size_t n) {
  if (sig > 0 && sig < 32) return proc_sig_names[sig];
  snprintf(buf, n, "signal %d", sig);
  return buf;
}

void proc_exit_describe(int wstatus, proc_exit_info *out) {
  out->error[0] = 0;
  if (WIFEXITED(wstatus)) {
    int code = WEXITSTATUS(wstatus);
    out->exit_code = code;
    if (code == 0) {
      out->status = "exited";
    } else {
      out->status = "error";
      snprintf(out->error, sizeof out->error, "exit status %d", code);
    }
    return;
  }
  out->exit_code = -1;
  out->status = "error";
  if (WIFSIGNALED(wstatus)) {
    char tmp[24];
    const char *name = proc_signal_name(WTERMSIG(wstatus), tmp, sizeof tmp);
    snprintf(out->error, sizeof out->error, "signal: %s%s", name,
             WCOREDUMP(wstatus) ? " (core dumped)" : "");
  } else {
    /* not reachable without WUNTRACED/WCONTINUED; keep Go's fallback text */
    snprintf(out->error, sizeof out->error, "<unknown status 0x%x>", (unsigned)wstatus);
  }
}
