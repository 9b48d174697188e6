/* test_handover — the upgrade-in-place framework (core/handover.h) on its
 * own: the schema check, the arguments, the new program's side (load,
 * parts in order, commit) on a state written here, and the lifecycle's
 * asserted steps.  Each load runs in a child: a program loads once.  The
 * exec and the rollback: tests/integration/test_upgrade*.py. */
#include <fcntl.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/handover.h"
#include "proto/handover.pb-c.h"
#include "tests/unit/test.h"

static const handover_schema schema = {&conch__handover__state__descriptor, 2, 1};

static char order[64];
static void note(char c) {
  size_t n = strlen(order);
  if (n + 1 < sizeof order) order[n] = c, order[n + 1] = 0;
}

static int p_early(uv_loop_t *loop, const ProtobufCMessage *m) {
  note('e');
  return ((const Conch__Handover__State *)m)->n_api_listeners == 1 ? 0 : -1;
}
static int p_restore(const ProtobufCMessage *m, uint64_t now, char *err, size_t errn) {
  note('r');
  return 0;
}
static void p_keep(const ProtobufCMessage *m) {
  note('k');
  handover_keep_fd(((const Conch__Handover__State *)m)->api_listeners[0]);
}
static void p_resume(void) { note('u'); }
static void p_abandon(const ProtobufCMessage *m) { note('a'); }
static const handover_part part_a = {.name = "a", .restore_early = p_early, .restore = p_restore, .keep_fds = p_keep,
                                     .abandon = p_abandon, .resume = p_resume};
static const handover_part part_b = {.name = "b", .restore = p_restore, .resume = p_resume};

/* A state of format f in a memfd, naming keep (a descriptor) as an API listener. */
static int state_fd(uint32_t f, int32_t keep) {
  Conch__Handover__State st = CONCH__HANDOVER__STATE__INIT;
  st.format = f;
  st.version = "0.0.1-test";
  st.upgrades = 5;
  st.prev_program_fd = -1;
  st.api_listeners = &keep;
  st.n_api_listeners = 1;
  uint8_t buf[256];
  size_t len = conch__handover__state__pack(&st, buf);
  int fd = memfd_create("test-state", 0);
  if (fd < 0 || write(fd, buf, len) != (ssize_t)len) return -1;
  return fd;
}

/* Runs fn in a child; its exit status, or 128 + the signal.  quiet: its
 * stderr (the assertion's message) to /dev/null. */
static int in_child(int (*fn)(void), int quiet) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    if (quiet) freopen("/dev/null", "w", stderr);
    _exit(fn());
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  return WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
}

TEST(formats_and_arguments) {
  static char *argv[] = {"conch-init", "serve", "--handover", "7", NULL}; /* kept: the framework reads it later */
  handover_init(&schema, 4, argv);
  ASSERT(!handover_can_read(0));
  ASSERT(handover_can_read(1));
  ASSERT(handover_can_read(2));
  ASSERT(!handover_can_read(3));
  ASSERT(!handover_busy());
  int rb = -1;
  ASSERT_EQ(handover_arg(4, argv, &rb), 7);
  ASSERT_EQ(rb, 0);
  char *rv[] = {"conch-init", "--handover-rollback", "9", NULL};
  ASSERT_EQ(handover_arg(3, rv, &rb), 9);
  ASSERT_EQ(rb, 1);
  char *bad[] = {"conch-init", "--handover", "2", NULL}; /* not above stderr */
  ASSERT_EQ(handover_arg(3, bad, &rb), -1);
  char *none[] = {"conch-init", "serve", NULL};
  ASSERT_EQ(handover_arg(2, none, &rb), -1);
}

static int load_and_finish(void) {
  int keep = open("/dev/null", O_RDONLY | O_CLOEXEC);
  int fd = state_fd(2, keep);
  char err[256] = "";
  handover_add_part(&part_a);
  handover_add_part(&part_b);
  struct stat was; /* the state's file: its number may be reused once it is closed */
  if (fstat(fd, &was) != 0) return 9;
  if (handover_load(fd, 0, err, sizeof err) != 0) return 10;
  if (strcmp(order, "e") != 0 || conch.upgrades != 5 || !handover_busy()) return 11;
  fcntl(keep, F_SETFD, 0); /* as the old program left it */
  if (handover_finish(err, sizeof err) != 0) return 12;
  if (strcmp(order, "errkuu") != 0) return 13;
  if (handover_busy()) return 14;
  struct stat now;
  if (fstat(fd, &now) == 0 && now.st_ino == was.st_ino && now.st_dev == was.st_dev) return 15; /* closed */
  if (!(fcntl(keep, F_GETFD) & FD_CLOEXEC)) return 16;       /* named: close-on-exec again */
  return 0;
}

TEST(load_restores_the_parts_in_order_then_commits) {
  conch.loop = uv_default_loop();
  ASSERT_EQ(in_child(load_and_finish, 0), 0);
}

static int unreadable_format(void) {
  char err[256] = "";
  handover_add_part(&part_a);
  /* rollback 1: this is the rollback, so no exec is tried */
  if (handover_load(state_fd(1002, 0), 1, err, sizeof err) != -1) return 10;
  if (strcmp(err, "state format 1002 is not one this program reads (1 to 2)") != 0) return 11;
  if (order[0]) return 12; /* no part ran */
  if (handover_busy()) return 13; /* a fresh start: an Upgrade can run again */
  return 0;
}

TEST(a_format_it_cannot_read_is_refused) { ASSERT_EQ(in_child(unreadable_format, 0), 0); }

static int early_part_fails(void) {
  char err[256] = "";
  handover_add_part(&part_b);
  handover_add_part(&part_a);
  Conch__Handover__State st = CONCH__HANDOVER__STATE__INIT; /* no listener: part a's early restore fails */
  st.format = 2;
  uint8_t buf[64];
  size_t len = conch__handover__state__pack(&st, buf);
  int fd = memfd_create("test-state", 0);
  if (write(fd, buf, len) != (ssize_t)len) return 9;
  if (handover_load(fd, 1, err, sizeof err) != 0) return 10; /* the others go on */
  if (strcmp(err, "a: cannot restore its early state") != 0) return 11;
  if (strcmp(order, "ea") != 0) return 12; /* tried, abandoned (no rollback: this is the rollback) */
  if (handover_finish(err, sizeof err) != 0) return 13;
  if (strcmp(order, "earuu") != 0) return 14; /* b restores, a does not; both resume what they took */
  if (handover_busy() || fcntl(fd, F_GETFD) != -1) return 15; /* over, the state closed */
  return 0;
}

TEST(a_part_that_fails_early_is_abandoned_alone) { ASSERT_EQ(in_child(early_part_fails, 0), 0); }

/* The lifecycle's steps assert: a second load finds the state RESTORING
 * (a release build, NDEBUG, logs and stays there). */
static int load_twice(void) {
  char err[256] = "";
  int keep = open("/dev/null", O_RDONLY | O_CLOEXEC);
  handover_load(state_fd(2, keep), 1, err, sizeof err);
  handover_load(state_fd(2, keep), 1, err, sizeof err);
  return handover_busy() ? 0 : 1;
}

/* A token replaced by a shorter one leaves no byte of the old behind it. */
TEST(a_shorter_token_leaves_no_tail) {
  daemon_set_token("a-long-old-token-0123456789", 27);
  daemon_set_token("short", 5);
  ASSERT_EQ(conch.token_len, 5);
  ASSERT(strcmp(conch.token, "short") == 0);
  for (size_t i = 5; i < sizeof conch.token; i++) ASSERT_EQ(conch.token[i], 0);
}

TEST(an_illegal_step_asserts) { ASSERT_EQ(in_child(load_twice, 1), handover_asserts ? 128 + SIGABRT : 0); }

/* The schema must have the framework's fields. */
static int wrong_schema(void) {
  static const handover_schema daemon_msg = {&conch__handover__daemon__descriptor, 2, 1};
  handover_init(&daemon_msg, 0, NULL);
  return 0;
}

TEST(a_schema_without_the_fields_aborts) { ASSERT_EQ(in_child(wrong_schema, 1), 128 + SIGABRT); }

int main(void) {
  RUN(formats_and_arguments);
  RUN(load_restores_the_parts_in_order_then_commits);
  RUN(a_format_it_cannot_read_is_refused);
  RUN(a_part_that_fails_early_is_abandoned_alone);
  RUN(a_shorter_token_leaves_no_tail);
  RUN(an_illegal_step_asserts);
  RUN(a_schema_without_the_fields_aborts);
  return test_summary();
}
