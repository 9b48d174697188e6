/* test_callstate — the rpc_call lifecycle table (server/callstate.c): the
 * legal transitions are exactly those docs/internals/connect.md draws, an
 * illegal one asserts in a debug build (and is refused and counted in a
 * release build, NDEBUG: the library says which it is), and the names.  test_connect drives every legal
 * transition through real calls (every_legal_transition_driven). */
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/callstate.h"
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

/* One illegal step in a child: 0 when it aborted (SIGABRT), 1 when it
 * returned -1 with the state unchanged and the count up, 2 otherwise. */
static int illegal_in_child(call_state from, call_event ev) {
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY); /* quiet: the child's log line and assert are expected */
    if (null >= 0) dup2(null, 2);
    call_state s = from;
    int rc = call_state_step(&s, ev);
    _exit(rc == -1 && s == from && call_state_illegal == 1 ? 1 : 2);
  }
  int st = 0;
  if (waitpid(pid, &st, 0) != pid) return 3;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) return 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 4;
}

TEST(illegal_step_asserts) {
  static const struct {
    call_state from;
    call_event ev;
  } bad[] = {
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
    ASSERT_EQ(illegal_in_child(bad[i].from, bad[i].ev), call_state_asserts ? 0 : 1);
  }
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
  RUN(names);
  return test_summary();
}
