/* validate — the request checks of ProcessService that need no state
 * (api.md §6), in the specified order and with the specified texts.
 * Each returns RPC_OK, or an error code with the message written to msg.
 */
#ifndef CONCH_PROC_VALIDATE_H
#define CONCH_PROC_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#include "server/rpc.h"
#include "proto/agent.pb-c.h"

#define PROC_PTY_DEFAULT_COLS 80
#define PROC_PTY_DEFAULT_ROWS 24
#define PROC_PTY_MAX 65535u

/* StartProcess steps 2–4: content+args, pty+stdin, pty size. */
rpc_code proc_validate_start(const Pb__StartProcessRequest *req, char *msg, size_t n);

/* PTY size (StartProcess step 4, Update): each ≤ 65535; absent → "pty size
 * is required" when required, else fine. */
rpc_code proc_validate_pty_size(const Pb__PTY *pty, int required, char *msg, size_t n);

/* api.md §9 limits, checked after step 4: memoryMaxBytes ≥ 1 MiB,
 * cpuMillis ≤ 1000 × cpus, then unavailable (the reason the controllers
 * are missing, or NULL when they are there) → failed_precondition.  No
 * limits, or all 0: fine. */
rpc_code proc_validate_limits(const Pb__ResourceLimits *l, long cpus, const char *unavailable, char *msg,
                              size_t n);

/* Connect/input selector: `all` refused, pid or tag required (SendSignal
 * takes `all` before it asks). */
rpc_code proc_validate_selector(const Pb__ProcessSelector *sel, char *msg, size_t n);

/* SendSignal: not zero, a real Linux signal number (1..64). */
rpc_code proc_validate_signal(int32_t sig, char *msg, size_t n);

#endif
