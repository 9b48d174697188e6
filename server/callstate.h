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

/* Beside its state a call has three smaller lifecycles, each one enum
 * changed only by its step below, which asserts the transition as
 * call_state_step does (lifecycle.h); docs/internals/connect.md has the
 * tables. */

/* The request body, as the call has seen it. */
typedef enum call_input {
  IN_OPEN,      /* more may come */
  IN_ENDED,     /* the transport's body end: all of it is in c->in */
  IN_DELIVERED, /* its end went to the service (or failed the call) */
  IN_NSTATES
} call_input;

/* The answer, as the call has made it. */
typedef enum call_output {
  OUT_NONE,           /* nothing yet */
  OUT_UNARY,          /* Connect unary: the answer's message is set (sent again: replaced) */
  OUT_UNARY_GZ_TRIED, /* ... its compression went to the pool, or failed */
  OUT_UNARY_GZ,       /* ... it is compressed */
  OUT_STARTED,        /* streaming: the response head went out */
  OUT_NSTATES
} call_output;

/* The request message on_request is given. */
typedef enum call_req {
  REQ_KEPT,     /* the layer frees it (or there is none) */
  REQ_TAKABLE,  /* inside on_request, malloc-decoded: rpc_take_request may take it */
  REQ_TAKEN,    /* the service took it and frees it */
  REQ_NSTATES
} call_req;

/* Move *s to `to`: 0, or -1 (and *s as it was) when `to` may not follow
 * it. */
int call_input_step(call_input *s, call_input to);
int call_output_step(call_output *s, call_output to);
int call_req_step(call_req *s, call_req to);

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
