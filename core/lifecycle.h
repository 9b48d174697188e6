/* lifecycle — what every lifecycle's one step function does with an
 * illegal transition (server/callstate.c for calls, server/h2stream.c for
 * HTTP/2 streams and connections, server/http1.c for HTTP/1.1
 * connections).
 *
 * An illegal transition is a bug of the layer: it is logged and asserts in
 * a debug build; a release build (NDEBUG: the static build) counts it in
 * lifecycle_refused and the caller leaves the state as it was, so PID 1
 * goes on. */
#ifndef CONCH_LIFECYCLE_H
#define CONCH_LIFECYCLE_H

/* Log "<machine>: illegal transition <step> from <from>", assert (debug),
 * count (release).  The caller then refuses the step. */
void lifecycle_refuse(const char *machine, const char *step, const char *from);

/* 0 when bit `from` is set in legal_from (the states `to` may be entered
 * from); else lifecycle_refuse and -1. */
int lifecycle_check(const char *machine, unsigned legal_from, int from, int to,
                    const char *const *names, int nstates);

/* Illegal transitions seen (release builds; a debug build has aborted). */
extern unsigned long lifecycle_refused;

/* 1 when this build asserts on an illegal transition (no NDEBUG). */
extern const int lifecycle_asserts;

#endif
