/* upgrade — pb.AgentService/Upgrade, the front end of an upgrade in place
 * (api.md §9 "Upgrading the agent in place"; the state handover behind it:
 * core/handover.h, agent/parts.h).
 *
 *   size_t n;
 *   const rpc_method *m = upgrade_service_methods(&n);   // n == 1
 *
 * One call: checks on the loop (disabled, path, sha256 syntax, busy), then
 * in the thread pool as the call's user the file is read, hashed and
 * copied into a sealed memfd (regular file, ≤ UPGRADE_MAX_BYTES, sha256,
 * ELF header); then the new program is run twice from that memfd, as the
 * agent (root), outside the workload, with a minimal environment and
 * stdout captured: `--version` and `--handover-check HANDOVER_FORMAT`,
 * UPGRADE_TRIAL_MS each (then SIGKILL to its process group).  Each child is
 * made in the pool by proc_spawn (exec_fd; reaper_inflight, proc/reaper.h:
 * the reaper alone waits); its stdout pipe and its timer live on the loop.  Passing all of
 * it: the answer {fromVersion, toVersion} is sent and finished, then
 * handover_begin(memfd, toVersion) — the memfd is the handover's from then
 * on (closed here if handover_begin fails).  One Upgrade at a time: a
 * second one while a call is past its checks, or while handover_busy(),
 * is refused.  A call that ends early (client gone, deadline) kills its
 * trial child and changes nothing.
 *
 * Disabled (permission_denied "upgrade is disabled") by serve --no-upgrade
 * (conch.no_upgrade) or the init key "allowUpgrade": false (sticky,
 * conch.init_no_upgrade).
 */
#ifndef CONCH_UPGRADE_H
#define CONCH_UPGRADE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "server/rpc.h"

#define UPGRADE_MAX_BYTES (64u << 20)
#define UPGRADE_TRIAL_MS 5000
/* stdout kept of a trial run (the rest is read and dropped) */
#define UPGRADE_OUT_MAX 4096
/* a version as --version prints it: at most this long */
#define UPGRADE_VERSION_MAX 64

const rpc_method *upgrade_service_methods(size_t *n);

/* ---- the pure parts (upgrade_run.c; tests/unit/test_upgrade.c) ---- */

/* hdr[0..n): the start of the file.  0 when it is an ELF executable (ET_EXEC
 * or ET_DYN) of this build's class, byte order and machine; else -1 with
 * the reason in why ("not an ELF executable", "not an x86-64 executable
 * (ELF machine 183)", …). */
int upgrade_elf_check(const uint8_t *hdr, size_t n, char *why, size_t whylen);

/* The version of out[0..n), a --version output whose first line is
 * "conch-init <version>" (the version: 1..UPGRADE_VERSION_MAX of
 * [0-9A-Za-z.+~_-], the line ending at "\n", "\r\n" or the end): 0 with it
 * in ver (≥ UPGRADE_VERSION_MAX + 1 bytes), else -1. */
int upgrade_parse_version(const char *out, size_t n, char *ver);

#endif
