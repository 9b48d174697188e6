/* validate — see validate.h. */
#include "proc/validate.h"

#include <signal.h>
#include <stdio.h>

rpc_code proc_validate_start(const Pb__StartProcessRequest *req, char *msg, size_t n) {
  if (req->content && req->content[0] && req->n_args > 0) {
    snprintf(msg, n, "content and args cannot both be set");
    return RPC_INVALID_ARGUMENT;
  }
  if (req->pty && req->stdin.len > 0) {
    snprintf(msg, n, "stdin cannot be used with pty");
    return RPC_INVALID_ARGUMENT;
  }
  if (req->pty) return proc_validate_pty_size(req->pty, 1, msg, n);
  return RPC_OK;
}

rpc_code proc_validate_pty_size(const Pb__PTY *pty, int required, char *msg, size_t n) {
  if (!pty) {
    if (!required) return RPC_OK;
    snprintf(msg, n, "pty size is required");
    return RPC_INVALID_ARGUMENT;
  }
  if (pty->cols > PROC_PTY_MAX) {
    snprintf(msg, n, "invalid pty size: pty cols must not exceed 65535");
    return RPC_INVALID_ARGUMENT;
  }
  if (pty->rows > PROC_PTY_MAX) {
    snprintf(msg, n, "invalid pty size: pty rows must not exceed 65535");
    return RPC_INVALID_ARGUMENT;
  }
  return RPC_OK;
}

rpc_code proc_validate_limits(const Pb__ResourceLimits *l, long cpus, const char *unavailable, char *msg,
                              size_t n) {
  if (!l || (!l->memory_max_bytes && !l->pids_max && !l->cpu_millis)) return RPC_OK;
  if (l->memory_max_bytes && l->memory_max_bytes < 1048576) {
    snprintf(msg, n, "invalid limits: memoryMaxBytes must be at least 1048576");
    return RPC_INVALID_ARGUMENT;
  }
  uint64_t most = 1000u * (uint64_t)(cpus > 0 ? cpus : 1);
  if (l->cpu_millis > most) {
    snprintf(msg, n, "invalid limits: cpuMillis must not exceed %llu", (unsigned long long)most);
    return RPC_INVALID_ARGUMENT;
  }
  if (unavailable) {
    snprintf(msg, n, "resource limits are not available: %s", unavailable);
    return RPC_FAILED_PRECONDITION;
  }
  return RPC_OK;
}

rpc_code proc_validate_selector(const Pb__ProcessSelector *sel, char *msg, size_t n) {
  if (sel && sel->all) {
    snprintf(msg, n, "process selector all is only valid for SendSignal");
    return RPC_INVALID_ARGUMENT;
  }
  if (!sel || (sel->pid == 0 && (!sel->tag || !sel->tag[0]))) {
    snprintf(msg, n, "process pid or tag is required");
    return RPC_INVALID_ARGUMENT;
  }
  return RPC_OK;
}

rpc_code proc_validate_signal(int32_t sig, char *msg, size_t n) {
  if (sig == 0) {
    snprintf(msg, n, "signal must not be zero");
    return RPC_INVALID_ARGUMENT;
  }
  if (sig < 1 || sig > SIGRTMAX) {
    snprintf(msg, n, "invalid signal %d", (int)sig);
    return RPC_INVALID_ARGUMENT;
  }
  return RPC_OK;
}
