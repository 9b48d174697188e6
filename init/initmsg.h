/* initmsg — the init message of boot.md §3: strict decoding, validation in
 * the specified order with the exact texts, the resolv.conf it implies, and
 * the response encoding.  Pure functions (no I/O); the init protocol
 * server (initproto*.c) drives them.
 *
 * Decoding mirrors the reference's Go decoder with unknown fields
 * disallowed: keys are case-sensitive; an unknown key, a wrong JSON type, a
 * non-integer or out-of-range (int64) number, or a trailing second value is
 * a decode failure (→ the connection is closed without a response).  JSON
 * null means "absent" everywhere (Go zero value), including the top level,
 * list elements and env values (→ "").  DECISION: a duplicate key in any
 * object is a decode failure (Go silently keeps the last one; an ambiguous
 * message from the host is a bug we would rather see).
 *
 * The restore keys timestampMs and entropy (boot.md §10) are checked after
 * the network, and their errors are terminal texts, not decode failures
 * ("invalid timestampMs" for anything but a positive integer, "invalid
 * entropy" for anything but base64 of 32–512 bytes).  The workload keys
 * (boot.md §12) follow them: "invalid workloadMemoryMaxBytes" (not a uint
 * of at least 16 MiB and at most MemTotal), "invalid workloadPidsMax"
 * (not a uint of at least 64).  Then defaultUser ("invalid defaultUser")
 * and allowUpgrade ("invalid allowUpgrade": anything but a bool or null).
 */
#ifndef CONCH_INIT_INITMSG_H
#define CONCH_INIT_INITMSG_H

#include <stddef.h>
#include <stdint.h>

#define INITMSG_MAX_FRAME 16384
#define INITMSG_MAX_NAMESERVERS 3

/* Restore keys (boot.md §10): timestampMs steps the clock when the guest
 * is more than 50 ms behind or 5 s ahead; entropy is 32–512 bytes. */
#define INITMSG_CLOCK_BEHIND_MS 50
#define INITMSG_CLOCK_AHEAD_MS 5000
#define INITMSG_ENTROPY_MIN 32
#define INITMSG_ENTROPY_MAX 512
/* boot.md §12: the workload keys' lower bounds (memory also ≤ MemTotal). */
#define INITMSG_WORKLOAD_MEM_MIN (16u << 20)
#define INITMSG_WORKLOAD_PIDS_MIN 64
/* The validated content of one message, independent of the JSON text. */
typedef struct initmsg_plan {
  char *sandbox_id;  /* trimmed */
  char *token;       /* trimmed, <= CONCH_TOKEN_MAX bytes */
  size_t token_len;
  size_t nenv;
  char **env_k, **env_v; /* in document order */
  uint32_t guest_ip, gateway; /* host byte order */
  unsigned prefix_len;
  char *resolv;      /* the exact /etc/resolv.conf bytes */
  size_t resolv_len;
  int64_t timestamp_ms; /* boot.md §10; 0 = absent */
  size_t entropy_len;   /* 0 = absent */
  unsigned char entropy[INITMSG_ENTROPY_MAX];
  uint64_t workload_memory_max; /* boot.md §12; 0 = absent (keep) */
  uint64_t workload_pids_max;
  char *default_user; /* boot.md §13, syntax checked (users.h); NULL = absent (keep) */
  int forward_local_ports; /* boot.md §13: 1, 0, or -1 absent (on with a network) */
  int allow_upgrade; /* api.md §9 "Upgrading the agent in place": 1, 0, or -1 absent (keep) */
} initmsg_plan;

/* MemTotal in bytes, the upper bound of workloadMemoryMaxBytes (0: none);
 * PID 1 sets it at boot. */
void initmsg_set_mem_total(uint64_t bytes);

int initmsg_clock_needs_step(int64_t now_ms, int64_t host_ms);

/* Decode and validate frame payload buf[0..n).
 * Returns  0: valid, *plan filled (free with initmsg_plan_free);
 *          1: invalid, *msg = the terminal text (malloc'd, caller frees);
 *         -1: decode failure, reason in err (no response is sent);
 *         -2: out of memory (reason in err; treated like a decode failure). */
int initmsg_process(const char *buf, size_t n, initmsg_plan *plan, char **msg, char *err,
                    size_t errlen);
void initmsg_plan_free(initmsg_plan *plan);

/* Render resolv.conf (boot.md §4 step 6) into a malloc'd buffer. */
char *initmsg_resolv(const char *const *ns, size_t nns, const char *domain,
                     const char *const *search, size_t nsearch, const char *const *opts,
                     size_t nopts, size_t *len);

/* The response JSON: {"version":1,"status":…,"retryable":…[,"message":…]}.
 * ready != 0 → "ready"; message may be NULL/empty (omitted).  malloc'd. */
char *initmsg_response(int ready, int retryable, const char *message, size_t *len);

#endif
