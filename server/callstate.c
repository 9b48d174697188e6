/* callstate — see callstate.h. */
#include "server/callstate.h"

#include "core/lifecycle.h"

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

#define B(s) (1u << (s))

/* *_from[to]: the states `to` may follow. */
static const unsigned input_from[IN_NSTATES] = {
  [IN_OPEN] = 0, [IN_ENDED] = B(IN_OPEN), [IN_DELIVERED] = B(IN_ENDED),
};
static const char *const input_names[IN_NSTATES] = {"OPEN", "ENDED", "DELIVERED"};

static const unsigned output_from[OUT_NSTATES] = {
  [OUT_NONE] = 0,
  [OUT_UNARY] = B(OUT_NONE) | B(OUT_UNARY),
  [OUT_UNARY_GZ_TRIED] = B(OUT_UNARY),
  [OUT_UNARY_GZ] = B(OUT_UNARY_GZ_TRIED),
  [OUT_STARTED] = B(OUT_NONE),
};
static const char *const output_names[OUT_NSTATES] = {"NONE", "UNARY", "UNARY_GZ_TRIED", "UNARY_GZ",
                                                      "STARTED"};

static const unsigned req_from[REQ_NSTATES] = {
  [REQ_KEPT] = B(REQ_KEPT) | B(REQ_TAKABLE) | B(REQ_TAKEN),
  [REQ_TAKABLE] = B(REQ_KEPT),
  [REQ_TAKEN] = B(REQ_TAKABLE),
};
static const char *const req_names[REQ_NSTATES] = {"KEPT", "TAKABLE", "TAKEN"};

#define STEP(machine, from, names, n)                                                          \
  do {                                                                                        \
    unsigned legal = (unsigned)to < (n) ? from[to] : 0;                                       \
    if (lifecycle_check(machine, legal, (int)*s, (int)to, names, (int)(n)) != 0) return -1;  \
    *s = to;                                                                                  \
    return 0;                                                                                 \
  } while (0)

int call_input_step(call_input *s, call_input to) { STEP("rpc_call input", input_from, input_names, IN_NSTATES); }
int call_output_step(call_output *s, call_output to) { STEP("rpc_call output", output_from, output_names, OUT_NSTATES); }
int call_req_step(call_req *s, call_req to) { STEP("rpc_call request", req_from, req_names, REQ_NSTATES); }

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
