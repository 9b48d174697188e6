/* daemon — the one daemon context of conch-init.
 *
 * The daemon-wide settings and counters live in the single object `conch`:
 * the loop, the token, the sandbox identity and environment, the log sink,
 * the budget's figures.  A module's own state stays in the module (the
 * handover's, the router's plain HTTP routes, the server's listeners); the
 * services (fs/, proc/, net/) never see this header (server/rpc.h) and
 * keep their own (the process table, cgroups, the reaper).  Everything here is touched
 * only from the loop thread (thread-pool work gets copies).
 */
#ifndef CONCH_DAEMON_H
#define CONCH_DAEMON_H

#define CONCH_MEM_BUDGET_MIN (4u << 20) /* CONCH_MEM_BUDGET is raised to this (agent/main.c) */

#include <stddef.h>
#include <stdio.h>
#include <uv.h>

#define CONCH_TOKEN_MAX 4096

struct rpc_method;   /* server/rpc.h */
struct initproto;    /* init/initproto*.c — the init protocol server */
struct pid1;         /* init/pid1.c — PID 1 boot state */
struct server;       /* server/server.c — the TCP listener(s) */
struct pool;         /* core/pool.c — batched thread-pool jobs */

typedef struct conch_daemon {
  uv_loop_t *loop;
  int is_pid1;

  /* auth (api.md §4) */
  int token_set;
  size_t token_len;
  char token[CONCH_TOKEN_MAX + 1];
  /* bumped each time the token changes: what authenticated records the
   * generation it did so with (server/tokhold.h) */
  unsigned long long token_gen;

  char sandbox_id[256];
  /* api.md §9: the user of RPCs that name none (serve --default-user, init
   * key defaultUser); "" = root */
  char default_user[256];
  /* api.md §9 "Upgrading the agent in place" (agent/upgrade.c): Upgrade is
   * refused while serve --no-upgrade or the init key "allowUpgrade": false
   * (sticky) says so; upgrade_trying while an Upgrade call is past its
   * checks (a second one is refused) */
  int no_upgrade, init_no_upgrade;
  int upgrade_trying;
  /* upgrades in place since boot (core/handover.c; /metrics "upgrades") */
  unsigned long long upgrades;

  /* sandbox environment: "K=V" strings, malloc'd, in insertion order */
  char **senv;
  size_t senv_len, senv_cap;
  /* hash index over senv (open addressing, slot = index + 1, 0 = empty):
   * an init message's pairs are set in O(1) each, not by a linear search */
  size_t *senv_idx;
  size_t senv_idx_cap; /* power of two, > 2 * senv_len */

  /* logging (core/log.c; its queues are log.c's): the level of the file
   * and the host stream, the file's path and size */
  int log_level;
  char log_path[512];
  size_t log_file_bytes;

  unsigned long long conn_seq; /* connection ids for logs */
  /* HTTP timers (api.md §1: 10 s for request headers, 60 s idle); tests
   * shorten them with CONCH_HTTP_HEADER_MS / CONCH_HTTP_IDLE_MS. */
  unsigned http_header_ms, http_idle_ms;
  /* open API connections and their cap (CONCH_MAX_CONNS, default 1024):
   * past it a new connection is closed at once and counted */
  unsigned nconns, max_conns;
  unsigned long long conns_refused;
  /* connections closed for holding more than CONN_UNAUTH_OUTQ of unread
   * output before any request was authenticated (server/conn.c) */
  unsigned long long unauth_closed;
  uv_timer_t *trim_timer; /* server/conn.c: malloc_trim after connections closed */
  /* One memory budget for everything held on behalf of clients
   * (CONCH_MEM_BUDGET, default 64 MiB): `held` counts request input
   * buffered by RPC calls, output queued on every connection (conn.c's
   * outq, HTTP/2 stream queues) and input queued for processes.  Input
   * that would pass `budget` fails resource_exhausted; producers that can
   * wait (downloads, process output, watch events, reflection) stop
   * reading their source once `held` is past half of it (rpc_out_room),
   * so requests and small answers always find room.  Request input alone
   * is further capped by rx_budget (CONCH_RX_BUDGET, default 256 MiB).
   * At least CONCH_MEM_BUDGET_MIN: the most one producer asks room for
   * at once (a JSON download's chunk, 1.34 MiB) fits in half of it. */
  size_t held, budget;
  size_t rx_buffered, rx_budget;

  /* GET /metrics (agent/metrics.c): the /proc/stat cpu sample of the last
   * call, so cpuUsedPct covers the time since then (since boot at first) */
  unsigned long long metrics_cpu_busy, metrics_cpu_total;

  /* set when the API listener serves /health (init readiness) */
  int api_serving;

  /* RPC routes, registered once at start-up (server/router.c) */
  const struct rpc_method *routes[32];
  size_t nroutes;

  struct initproto *initproto;
  struct pid1 *pid1;
  struct server *server;
  struct pool *pool;
} conch_daemon;

extern conch_daemon conch;

/* Zeroed memory for a module's state kept in the daemon context (allocated
 * on first use); out of memory at that point aborts with a log line. */
void *daemon_alloc_state(size_t size, const char *name);

/* Replace the token (trimmed by the caller). len <= CONCH_TOKEN_MAX.
 * Returns 1 when it changed (conch.token_gen bumped; a caller replacing a
 * live token then calls tokhold_revoke_stale()), 0 when it is the same. */
int daemon_set_token(const char *tok, size_t len);

/* Descriptors 0–2 always open, so that nothing the daemon opens (its
 * loop, listeners, pipes, a handover's state) lands on them and receives
 * log lines or a child's stdio.  Called first thing at start: a closed one
 * gets /dev/null, or where there is none yet (PID 1 before /dev is
 * mounted) an O_PATH descriptor of "/" that every read and write refuses;
 * a later call, once /dev/null exists, puts /dev/null in its place. */
void daemon_stdio_fill(void);

#endif
