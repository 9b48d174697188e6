/* service — ProcessService (api.md §6): StartProcess, Connect, List,
 * SendSignal, and (api.md §9, proc/input.c) SendInput, StreamInput,
 * CloseStdin, Update, served through server/rpc.h.
 *
 *   proc_init(loop)            create the process table (proc_tab); set
 *                              the daemon umask to 022 (children inherit
 *                              it), ignore SIGPIPE if it is still SIG_DFL
 *                              (stdin pipes to exited children); when not PID 1,
 *                              make the daemon a child subreaper (orphans of
 *                              its processes come to the one reaper, as
 *                              under PID 1).  reaper_init() must
 *                              have run (or run before the first spawn).
 *   proc_service_methods(&n)   the eight rpc_method entries for the router.
 *
 * Test hooks (environment, read by proc_init): CONCH_PROC_KEEPALIVE_MS
 * (default 30000; 0 disables) and CONCH_PROC_RETAIN_MS (default 60000) —
 * so the integration suite can check keepalives and retention quickly.
 *
 * Choices beyond api.md (documented in proc/proc.h as well):
 *   - a request string holding a NUL byte (cut by protobuf-c) is refused
 *     after check 4 with invalid_argument "<prefix>: invalid argument
 *     (NUL byte in a string field)" (prefix as for start failures) — Go's
 *     exec fails such a request with EINVAL too;
 *   - tag uniqueness (already_exists) is checked after check 4 and the tag
 *     is reserved from then on, so two concurrent starts cannot share it;
 *   - > PROC_MAX_PROCS live processes → resource_exhausted "too many
 *     processes"; > PROC_MAX_SUBS subscribers on one process →
 *     resource_exhausted "too many subscribers";
 *   - invalid signal numbers (< 0 or > 64) → invalid_argument
 *     "invalid signal <n>";
 *   - a relative cwd is taken relative to the daemon's cwd; the cwd is
 *     cleaned lexically (List reports the cleaned absolute path).
 */
#ifndef CONCH_PROC_SERVICE_H
#define CONCH_PROC_SERVICE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/rpc.h"

int proc_init(uv_loop_t *loop);
const rpc_method *proc_service_methods(size_t *n);
/* Stopping the agent (serve's SIGTERM/SIGINT; an upgrade is no stop):
 * SIGTERM to every command (its cgroup's processes, or its process group),
 * SIGKILL (the base's cgroup.kill) to what is left after
 * PROC_STOP_GRACE_MS; done() once none runs or lingers, or
 * PROC_STOP_KILL_WAIT_MS after the kill.  At once when there is none.
 * proc_cg_shutdown then removes the cgroups.  -1 when a stop is under
 * way already (the caller stops at once). */
#define PROC_STOP_GRACE_MS 5000
#define PROC_STOP_KILL_WAIT_MS 2000
int proc_stop(void (*done)(void));
/* The managed command a process belongs to, by its cgroup path (as
 * /proc/PID/cgroup shows it) or process group: 1 with its tag (valid until
 * the loop turn ends) and start pid, else 0.  Loop only; net/'s owner hook. */
int proc_owner_lookup(const char *cgroup, int32_t pgid, const char **tag, int32_t *command_pid);

/* /metrics (api.md §9 "Operators"): processes started since this program
 * started, and those whose leader runs now.  Loop only. */
uint64_t proc_started_total(void);
unsigned proc_running(void);

/* Upgrade in place (proc/handover.c; core/handover.h drives it, agent/parts.c
 * registers the part).
 * busy: a start, pool job or accounting read is in flight (wait).
 * save: the cgroups and every record into st (strings and bytes point
 * into the live table until save_free); 0 or -1 (out of memory).
 * restore_cgroups: before proc_init, which then keeps them.
 * restore: after proc_init, the records without any I/O (a rollback is
 * still possible); resume: start them; keep_fds: name (handover_keep_fd)
 * every descriptor st's cgroups and records hold. */
typedef struct Conch__Handover__State Conch__Handover__State;
int proc_handover_busy(void);
int proc_handover_save(Conch__Handover__State *st);
void proc_handover_save_free(Conch__Handover__State *st);
int proc_handover_restore_cgroups(uv_loop_t *loop, const Conch__Handover__State *st);
int proc_handover_restore(const Conch__Handover__State *st, uint64_t now_mono, char *err, size_t errn);
void proc_handover_resume(void);
/* No rollback: close the descriptors of every record not restored (and,
 * when the restore never ran, of the hierarchy), each dropped record logged. */
void proc_handover_abandon(const Conch__Handover__State *st);
void proc_handover_keep_fds(const Conch__Handover__State *st);

#endif
