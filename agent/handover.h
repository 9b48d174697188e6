/* handover — the agent's state carried across an upgrade in place
 * (docs/api.md "Upgrading the agent in place", docs/guide/upgrade.md).
 *
 * The old program, on the loop, after the Upgrade answer:
 *   handover_begin(new program's fd)
 *     → DRAINING: the API listener stops accepting (its socket stays open:
 *       clients wait in the backlog), every API connection is flushed
 *       briefly and closed, foreground commands are adopted, the loop runs
 *       until no start, pool job or accounting read is in flight (bounded)
 *     → SAVING: every part writes its state into one message
 *       (proto/handover.proto) in a memfd; the descriptors it names lose
 *       close-on-exec, no others
 *     → fexecve(new, argv + "--handover <fd>").
 * The new program, at start, before the reaper's first wait:
 *   handover_restore(fd) reads the message and rebuilds each part; a
 *   format it cannot read, or a part that fails, → fexecve of the previous
 *   program (a descriptor in the state) with the same state and
 *   "--handover-rollback <fd>".
 *
 * A lifecycle of its own (handover_state), changed only by hs_step().
 */
#ifndef CONCH_HANDOVER_H
#define CONCH_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

/* The state format this program writes; it reads HANDOVER_FORMAT_MIN up to
 * HANDOVER_FORMAT. */
#define HANDOVER_FORMAT 1
#define HANDOVER_FORMAT_MIN 1

/* 1 when this program can restore state format n (`--handover-check N`). */
int handover_can_read(unsigned n);

/* Loop: hand over to the program in prog_fd (a sealed memfd, owned by the
 * handover from now on).  Returns at once; the exec follows from the loop.
 * -1 (errno EBUSY) when a handover is already under way. */
int handover_begin(int prog_fd, const char *to_version);

/* 1 while a handover is under way (new Upgrade calls are refused). */
int handover_busy(void);

/* Upgrades since boot (/metrics "upgrades"). */
unsigned long long handover_upgrades(void);

#endif
