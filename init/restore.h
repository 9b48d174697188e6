/* restore — the restore keys of the init message (boot.md §10), applied.
 *
 * timestampMs: CLOCK_REALTIME is set to the host's time when the guest is
 * more than 50 ms behind it or more than 5 s ahead (initmsg_clock_needs_step),
 * so a sandbox restored from a snapshot does not live in the past.
 * entropy: the bytes are credited to the kernel's pool (RNDADDENTROPY) and
 * the CRNG is reseeded (RNDRESEEDCRNG), so clones of one snapshot do not
 * share random state.  Failures are warnings (the message itself was
 * valid); PID 1 only — standalone mode never touches the machine's clock.
 */
#ifndef CONCH_INIT_RESTORE_H
#define CONCH_INIT_RESTORE_H

#include "init/initmsg.h"

/* age_ms: how long ago the message arrived (the network work ran since),
 * added to timestampMs so the clock is not set into the past. */
void restore_apply(const initmsg_plan *p, int64_t age_ms);

#endif
