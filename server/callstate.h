/* callstate — the lifecycle of an rpc_call (connect.c), as one state and a
 * table of the legal transitions; docs/internals/connect.md draws it.
 *
 * The exchange (the call's hx, NULL once the answer is written or the peer
 * is gone) and the pool jobs that point at the call (a request decode,
 * response deflates) are not states: they are what the call waits for in
 * CALL_ENDED before it is freed.
 */
#ifndef CONCH_CALLSTATE_H
#define CONCH_CALLSTATE_H

typedef enum call_state {
  CALL_READING,       /* created: headers checked, the request read; no service yet */
  CALL_SERVING,       /* the service holds the call (on_request ran or streams in) */
  CALL_CANCELLING,    /* inside the service's on_cancel */
  CALL_CANCEL_HELD,   /* inside on_cancel, which called rpc_defer_end */
  CALL_HELD,          /* cancelled; the answer waits for rpc_end_deferred */
  CALL_FLUSHING,      /* the end is decided; it waits behind deflates in the pool */
  CALL_ENDED,         /* the end is written, or nobody is left to read it */
  CALL_CLOSING,       /* no job holds it: its timers close, then it is freed */
  CALL_NSTATES
} call_state;

/* The named transitions (docs/internals/connect.md has the table). */
typedef enum call_event {
  CALL_EV_START,      /* READING → SERVING: the service is handed the call */
  CALL_EV_CANCEL,     /* SERVING → CANCELLING: the layer ends it (bad input, deadline, peer gone) */
  CALL_EV_DEFER,      /* CANCELLING → CANCEL_HELD: on_cancel called rpc_defer_end */
  CALL_EV_UNDEFER,    /* CANCEL_HELD → CANCELLING: rpc_end_deferred inside on_cancel */
  CALL_EV_HOLD,       /* CANCEL_HELD → HELD: on_cancel returned, the end still deferred */
  CALL_EV_FLUSH,      /* SERVING|CANCELLING|HELD → FLUSHING: the end waits for deflates */
  CALL_EV_END,        /* READING|SERVING|CANCELLING|HELD|FLUSHING → ENDED: answered or peer gone */
  CALL_EV_CLOSE,      /* ENDED → CLOSING: no pool job holds it any more */
  CALL_NEVENTS
} call_event;

/* The state event ev leads to from `from`, or CALL_NSTATES when ev is not
 * legal there.  Pure: the table alone. */
call_state call_state_next(call_state from, call_event ev);

/* Take transition ev from *s.  An illegal one is a bug of the layer: it
 * asserts (debug builds); a release build (NDEBUG) logs it, counts it in
 * call_state_illegal and leaves *s as it was, so PID 1 goes on.  Returns
 * 0, or -1 when it was illegal. */
int call_state_step(call_state *s, call_event ev);

const char *call_state_name(call_state s);
const char *call_event_name(call_event ev);

/* Transitions taken since start, by [from][event] (read by the unit tests
 * to show each legal one driven); illegal ones seen (release builds). */
extern unsigned long call_state_taken[CALL_NSTATES][CALL_NEVENTS];
extern unsigned long call_state_illegal;

/* 1 when this build asserts on an illegal transition (no NDEBUG). */
extern const int call_state_asserts;

#endif
