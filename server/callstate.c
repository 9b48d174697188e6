/* callstate — see callstate.h. */
#include "server/callstate.h"

#include "server/lifecycle.h"

unsigned long call_state_taken[CALL_NSTATES][CALL_NEVENTS];
unsigned long call_state_illegal;
#ifdef NDEBUG
const int call_state_asserts = 0;
#else
const int call_state_asserts = 1;
#endif

#define X CALL_NSTATES /* not legal */

/* next[from][event]: every legal transition, and nothing else. */
static const call_state next[CALL_NSTATES][CALL_NEVENTS] = {
  /*                  START         CANCEL           DEFER             UNDEFER          HOLD       FLUSH          END         CLOSE */
  [CALL_READING]     = {CALL_SERVING, X,               X,                X,               X,         X,             CALL_ENDED, X},
  [CALL_SERVING]     = {X,            CALL_CANCELLING, X,                X,               X,         CALL_FLUSHING, CALL_ENDED, X},
  [CALL_CANCELLING]  = {X,            X,               CALL_CANCEL_HELD, X,               X,         CALL_FLUSHING, CALL_ENDED, X},
  [CALL_CANCEL_HELD] = {X,            X,               X,                CALL_CANCELLING, CALL_HELD, X,             X,          X},
  [CALL_HELD]        = {X,            X,               X,                X,               X,         CALL_FLUSHING, CALL_ENDED, X},
  [CALL_FLUSHING]    = {X,            X,               X,                X,               X,         X,             CALL_ENDED, X},
  [CALL_ENDED]       = {X,            X,               X,                X,               X,         X,             X,          CALL_CLOSING},
  [CALL_CLOSING]     = {X,            X,               X,                X,               X,         X,             X,          X},
};

call_state call_state_next(call_state from, call_event ev) {
  if ((unsigned)from >= CALL_NSTATES || (unsigned)ev >= CALL_NEVENTS) return X;
  return next[from][ev];
}

int call_state_step(call_state *s, call_event ev) {
  call_state to = call_state_next(*s, ev);
  if (to == X) {
    lifecycle_refuse("rpc_call", call_event_name(ev), call_state_name(*s));
    call_state_illegal++;
    return -1;
  }
  call_state_taken[*s][ev]++;
  *s = to;
  return 0;
}

const char *call_state_name(call_state s) {
  static const char *const names[] = {"READING", "SERVING", "CANCELLING", "CANCEL_HELD",
                                      "HELD",    "FLUSHING", "ENDED",     "CLOSING"};
  return (unsigned)s < CALL_NSTATES ? names[s] : "?";
}

const char *call_event_name(call_event ev) {
  static const char *const names[] = {"START", "CANCEL", "DEFER", "UNDEFER",
                                      "HOLD",  "FLUSH",  "END",   "CLOSE"};
  return (unsigned)ev < CALL_NEVENTS ? names[ev] : "?";
}
