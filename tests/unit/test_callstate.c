/* test_callstate — the rpc_call lifecycle table (server/callstate.c): the
 * legal transitions are exactly those docs/internals/connect.md draws, an
 * illegal one asserts in a debug build (and is refused and counted in a
 * release build, NDEBUG: the library says which it is), the same for the
 * call's smaller lifecycles (input, output, the request's owner), and the
 * names.  test_connect drives every legal
 * transition through real calls (every_legal_transition_driven). */
#include <stdlib.h>

#include "server/callstate.h"
#include "core/lifecycle.h"
#include "tests/unit/test.h"

/* The table of docs/internals/connect.md, written out again. */
static const struct {
  call_state from;
  call_event ev;
  call_state to;
} legal[] = {
  {CALL_READING, CALL_EV_START, CALL_SERVING},
  {CALL_READING, CALL_EV_END, CALL_ENDED},
  {CALL_SERVING, CALL_EV_CANCEL, CALL_CANCELLING},
  {CALL_SERVING, CALL_EV_FLUSH, CALL_FLUSHING},
  {CALL_SERVING, CALL_EV_END, CALL_ENDED},
  {CALL_CANCELLING, CALL_EV_DEFER, CALL_CANCEL_HELD},
  {CALL_CANCELLING, CALL_EV_FLUSH, CALL_FLUSHING},
  {CALL_CANCELLING, CALL_EV_END, CALL_ENDED},
  {CALL_CANCEL_HELD, CALL_EV_UNDEFER, CALL_CANCELLING},
  {CALL_CANCEL_HELD, CALL_EV_HOLD, CALL_HELD},
  {CALL_HELD, CALL_EV_FLUSH, CALL_FLUSHING},
  {CALL_HELD, CALL_EV_END, CALL_ENDED},
  {CALL_FLUSHING, CALL_EV_END, CALL_ENDED},
  {CALL_ENDED, CALL_EV_CLOSE, CALL_CLOSING},
};
#define NLEGAL (sizeof legal / sizeof legal[0])

static int is_legal(int st, int ev, call_state *to) {
  for (size_t i = 0; i < NLEGAL; i++)
    if ((int)legal[i].from == st && (int)legal[i].ev == ev) {
      *to = legal[i].to;
      return 1;
    }
  return 0;
}

TEST(table_is_the_documented_one) {
  int nlegal = 0;
  for (int st = 0; st < CALL_NSTATES; st++)
    for (int ev = 0; ev < CALL_NEVENTS; ev++) {
      call_state to;
      call_state got = call_state_next((call_state)st, (call_event)ev);
      if (is_legal(st, ev, &to)) {
        ASSERT_EQ(got, to);
        nlegal++;
      } else {
        ASSERT_EQ(got, CALL_NSTATES);
      }
    }
  ASSERT_EQ(nlegal, (int)NLEGAL);
  /* out of range: never legal */
  ASSERT_EQ(call_state_next(CALL_NSTATES, CALL_EV_END), CALL_NSTATES);
  ASSERT_EQ(call_state_next(CALL_READING, CALL_NEVENTS), CALL_NSTATES);
  ASSERT_EQ(call_state_next((call_state)-1, CALL_EV_END), CALL_NSTATES);
}

TEST(every_legal_step_taken_and_counted) {
  for (size_t i = 0; i < NLEGAL; i++) {
    call_state s = legal[i].from;
    unsigned long before = call_state_taken[legal[i].from][legal[i].ev];
    ASSERT_EQ(call_state_step(&s, legal[i].ev), 0);
    ASSERT_EQ(s, legal[i].to);
    ASSERT_EQ(call_state_taken[legal[i].from][legal[i].ev], before + 1);
  }
  /* every state but CLOSING leads on; CLOSING is the end */
  for (int st = 0; st < CALL_NSTATES; st++) {
    int out = 0;
    for (int ev = 0; ev < CALL_NEVENTS; ev++) out += call_state_next((call_state)st, (call_event)ev) != CALL_NSTATES;
    ASSERT(st == CALL_CLOSING ? out == 0 : out > 0);
  }
}

/* One illegal step (in a child: test_in_child): nonzero when it returned
 * -1 with the state unchanged and the count up. */
struct call_step {
  call_state from;
  call_event ev;
};

static int call_refused(void *arg) {
  const struct call_step *t = arg;
  call_state s = t->from;
  return call_state_step(&s, t->ev) == -1 && s == t->from && call_state_illegal == 1;
}

TEST(illegal_step_asserts) {
  static const struct call_step bad[] = {
    {CALL_READING, CALL_EV_CANCEL},    /* no service to cancel yet */
    {CALL_SERVING, CALL_EV_START},     /* started twice */
    {CALL_ENDED, CALL_EV_END},         /* answered twice */
    {CALL_CLOSING, CALL_EV_CLOSE},     /* freed twice */
    {CALL_CANCEL_HELD, CALL_EV_END},   /* ended while on_cancel holds it */
    {CALL_FLUSHING, CALL_EV_CLOSE},    /* freed while deflates are out */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_EQ(call_state_next(bad[i].from, bad[i].ev), CALL_NSTATES);
    /* debug: assert(); release: refused and counted, PID 1 goes on */
    ASSERT_EQ(test_in_child(call_refused, (void *)&bad[i]), call_state_asserts ? 0 : 1);
  }
}

/* The smaller lifecycles (input, output, the request's owner): each step
 * the table does not hold asserts (debug) or is refused and counted. */
struct small_step {
  int which, from, to;
};

static int small_refused(void *arg) {
  const struct small_step *t = arg;
  int rc;
  if (t->which == 0) {
    call_input s = (call_input)t->from;
    rc = call_input_step(&s, (call_input)t->to) == -1 && s == (call_input)t->from;
  } else if (t->which == 1) {
    call_output s = (call_output)t->from;
    rc = call_output_step(&s, (call_output)t->to) == -1 && s == (call_output)t->from;
  } else {
    call_req s = (call_req)t->from;
    rc = call_req_step(&s, (call_req)t->to) == -1 && s == (call_req)t->from;
  }
  return rc && lifecycle_refused == 1;
}

TEST(small_lifecycles) {
  static const struct small_step bad[] = {
    {0, IN_DELIVERED, IN_ENDED},         /* the body ended again */
    {0, IN_OPEN, IN_DELIVERED},          /* its end delivered before it came */
    {0, IN_ENDED, IN_ENDED},
    {1, OUT_STARTED, OUT_UNARY},         /* a streaming call's answer set as unary */
    {1, OUT_UNARY_GZ, OUT_UNARY},        /* set again after it was compressed */
    {1, OUT_STARTED, OUT_STARTED},       /* the head sent twice */
    {1, OUT_NONE, OUT_UNARY_GZ_TRIED},   /* compressed with no answer */
    {2, REQ_KEPT, REQ_TAKEN},            /* taken when it may not be */
    {2, REQ_TAKEN, REQ_TAKEN},           /* taken twice */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ASSERT_EQ(test_in_child(small_refused, (void *)&bad[i]), lifecycle_asserts ? 0 : 1);
  call_input in = IN_OPEN;
  ASSERT_EQ(call_input_step(&in, IN_ENDED), 0);
  ASSERT_EQ(call_input_step(&in, IN_DELIVERED), 0);
  ASSERT_EQ(in, IN_DELIVERED);
  call_output out = OUT_NONE;
  ASSERT_EQ(call_output_step(&out, OUT_UNARY), 0);
  ASSERT_EQ(call_output_step(&out, OUT_UNARY), 0); /* sent again: replaced */
  ASSERT_EQ(call_output_step(&out, OUT_UNARY_GZ_TRIED), 0);
  ASSERT_EQ(call_output_step(&out, OUT_UNARY_GZ), 0);
  call_req r = REQ_KEPT;
  ASSERT_EQ(call_req_step(&r, REQ_TAKABLE), 0);
  ASSERT_EQ(call_req_step(&r, REQ_TAKEN), 0);
  ASSERT_EQ(call_req_step(&r, REQ_KEPT), 0);
}

TEST(names) {
  ASSERT_STR_EQ(call_state_name(CALL_READING), "READING");
  ASSERT_STR_EQ(call_state_name(CALL_CANCEL_HELD), "CANCEL_HELD");
  ASSERT_STR_EQ(call_state_name(CALL_CLOSING), "CLOSING");
  ASSERT_STR_EQ(call_state_name(CALL_NSTATES), "?");
  ASSERT_STR_EQ(call_event_name(CALL_EV_START), "START");
  ASSERT_STR_EQ(call_event_name(CALL_EV_CLOSE), "CLOSE");
  ASSERT_STR_EQ(call_event_name(CALL_NEVENTS), "?");
}

int main(void) {
  RUN(table_is_the_documented_one);
  RUN(every_legal_step_taken_and_counted);
  RUN(illegal_step_asserts);
  RUN(small_lifecycles);
  RUN(names);
  return test_summary();
}
