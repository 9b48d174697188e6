/* exitfmt — the end event of a wait status (api.md §6, Events table).
 *
 * Mirrors Go's os.ProcessState.String(), which the reference agent used:
 *   exit 0   → exit_code 0,  status "exited", error ""
 *   exit N   → exit_code N,  status "error",  error "exit status N"
 *   signal S → exit_code -1, status "error",  error "signal: <name>"
 *              with " (core dumped)" appended when a core was dumped.
 * Signal names are Go's syscall strings ("terminated", "killed",
 * "segmentation fault", …; unknown numbers: "signal <n>").
 */
#ifndef CONCH_PROC_EXITFMT_H
#define CONCH_PROC_EXITFMT_H

#include <stddef.h>
#include <stdint.h>

typedef struct proc_exit_info {
  int32_t exit_code;
  const char *status; /* "exited" | "error" (static) */
  char error[64];
} proc_exit_info;

void proc_exit_describe(int wstatus, proc_exit_info *out);

/* Go's name of a Linux signal ("signal <n>" for unnamed ones, in buf). */
const char *proc_signal_name(int sig, char *buf, size_t n);

#endif
