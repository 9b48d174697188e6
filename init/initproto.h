/* initproto — the init protocol server (boot.md §3): listeners, framing,
 * the state machine and the readiness wait, all on conch.loop.
 *
 * Listeners: "unix:PATH" (a stale socket file at PATH is replaced; any
 * other existing file is an error) and "vsock:PORT" (any CID).  Several
 * listeners may be open; connections from all of them are handled strictly
 * one at a time, in accept order (the next is accepted only when the
 * current one is closed).  Each connection: one frame in (2 s receive
 * timeout), one frame out (2 s send timeout), close.
 *
 * Modes (set once with initproto_configure before the first listen; the
 * zero value is the standalone default):
 *   PID 1:      apply_network = 1, merge/services from boot, on_first starts
 *               the entrypoint and the API listener (boot step 13).
 *   standalone: no network changes and no resolv.conf unless apply_network
 *               is set (`serve --init-apply-network`: the netlink part runs
 *               in the caller's netns and resolv.conf goes to resolv_path);
 *               env, token and sandbox id are applied; the merge root counts
 *               as ready; services are not required; so the reply is
 *               `ready` as soon as the API serves /health.
 */
#ifndef CONCH_INIT_INITPROTO_H
#define CONCH_INIT_INITPROTO_H

#include <stdint.h>

typedef struct initproto_opts {
  int apply_network;          /* netlink + resolv.conf (boot.md §4) */
  int apply_restore;          /* timestampMs, entropy (boot.md §10): PID 1 only */
  const char *resolv_path;    /* NULL → "/etc/resolv.conf" */
  int merge_missing;          /* boot step 10 failed: never ready */
  int services_required;      /* boot.md §6 */
  const char *services_ready_path; /* NULL → "/run/conch/services-ready" */
  /* PID 1 (api.md §9 "Operators"): the console's level once the sandbox is
   * ready (an init message's consoleLogLevel replaces it), and the host
   * stream's CID and port (conch.log_port=, replaced by an init message's
   * logPort; 0: none).  pid1_logs 0: none of them.  Handed over. */
  int pid1_logs;
  int console_level;
  unsigned log_cid;
  unsigned log_port;
  /* Boot step 13, once, after the first valid message was applied. */
  void (*on_first)(void *arg);
  void *arg;
} initproto_opts;

typedef enum initproto_state {
  INITPROTO_AWAITING_NETWORK,
  INITPROTO_NETWORK_APPLIED,
  INITPROTO_READY,
  INITPROTO_TERMINAL,
} initproto_state;

void initproto_configure(const initproto_opts *o);
/* Start a listener on conch.loop.  Returns 0 or -errno (-EINVAL: bad spec). */
int initproto_listen(const char *spec);
/* SIGUSR1: the rootfs services are ready. */
void initproto_services_ready(void);
/* The sandbox id of the last applied message (full length), or NULL. */
const char *initproto_sandbox_id(void);
initproto_state initproto_get_state(void);
/* The options in force (an init message's sticky log keys included). */
const initproto_opts *initproto_get_opts(void);
/* Upgrade in place (init/handover.c): freeze stops accepting (the sockets
 * stay open: senders wait in the backlog); busy: a message is being
 * handled.  save points into the live state until save_free.  restore
 * (no I/O) then resume (the listeners are watched again). */
typedef struct Conch__Handover__Init Conch__Handover__Init;
void initproto_freeze(int on);
/* 1 when some listener is open (restored by a handover, say). */
int initproto_listening(void);
int initproto_busy(void);
int initproto_handover_save(Conch__Handover__Init *m);
void initproto_handover_save_free(Conch__Handover__Init *m);
int initproto_handover_restore(const Conch__Handover__Init *m);
void initproto_handover_resume(void);
/* No rollback came after a restore that failed or never ran: close the
 * state's listeners that the restore did not take. */
void initproto_handover_abandon(const Conch__Handover__Init *m);
/* Close the listeners and any connection, free the state (tests, shutdown). */
void initproto_close(void);

#endif
