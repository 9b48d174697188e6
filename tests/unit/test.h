/* test.h — a tiny unit-test harness in the style of libuv's ASSERT_EQ.
 *
 *   TEST(name) { ASSERT_EQ(1 + 1, 2); ASSERT_STR_EQ(s, "x"); }
 *   int main(void) { RUN(name); return test_summary(); }
 *
 * A failed assertion fails only its test (longjmp) and prints where.
 * test_summary() prints "N passed, N failed" and returns the exit code.
 */
#ifndef CONCH_TEST_H
#define CONCH_TEST_H

#include <setjmp.h>
#include <stdio.h>
#include <string.h>
#include <stdint.h>
#include <inttypes.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static int test_passed_, test_failed_;
static jmp_buf test_jmp_;

#define TEST(name) static void test_##name(void)
#define RUN(name)                                                          \
  do {                                                                     \
    if (setjmp(test_jmp_) == 0) {                                          \
      test_##name();                                                       \
      test_passed_++;                                                      \
    } else {                                                               \
      test_failed_++;                                                      \
      fprintf(stderr, "  FAILED: %s\n", #name);                            \
    }                                                                      \
  } while (0)

#define TEST_FAIL_(...)                                                    \
  do {                                                                     \
    fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                        \
    fprintf(stderr, __VA_ARGS__);                                          \
    fprintf(stderr, "\n");                                                 \
    longjmp(test_jmp_, 1);                                                 \
  } while (0)

#define ASSERT(c) do { if (!(c)) TEST_FAIL_("assertion failed: %s", #c); } while (0)
#define ASSERT_EQ(a, b)                                                    \
  do {                                                                     \
    intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                       \
    if (a_ != b_) TEST_FAIL_("%s == %s: %jd != %jd", #a, #b, a_, b_);      \
  } while (0)
#define ASSERT_NE(a, b)                                                    \
  do {                                                                     \
    intmax_t a_ = (intmax_t)(a), b_ = (intmax_t)(b);                       \
    if (a_ == b_) TEST_FAIL_("%s != %s: both %jd", #a, #b, a_);            \
  } while (0)
#define ASSERT_STR_EQ(a, b)                                                \
  do {                                                                     \
    const char *a_ = (a), *b_ = (b);                                       \
    if (!a_ || !b_ || strcmp(a_, b_) != 0)                                 \
      TEST_FAIL_("%s == %s: \"%s\" != \"%s\"", #a, #b, a_ ? a_ : "(null)", \
                 b_ ? b_ : "(null)");                                      \
  } while (0)
#define ASSERT_MEM_EQ(a, b, n)                                             \
  do {                                                                     \
    if (memcmp((a), (b), (n)) != 0) TEST_FAIL_("%s == %s (%zu bytes)", #a, #b, (size_t)(n)); \
  } while (0)

/* fn(arg) in a child whose stderr is quiet (an illegal transition's log
 * line and assert are expected there): 0 when it aborted (SIGABRT: a
 * debug build's assert), 1 when fn returned nonzero, 2 when it returned 0. */
static inline int test_in_child(int (*fn)(void *), void *arg) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) dup2(null, 2);
    _exit(fn(arg) ? 1 : 2);
  }
  int st = 0;
  if (pid < 0 || waitpid(pid, &st, 0) != pid) return 3;
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT) return 0;
  return WIFEXITED(st) ? WEXITSTATUS(st) : 4;
}

static int test_summary(void) {
  printf("%d passed, %d failed\n", test_passed_, test_failed_);
  return test_failed_ ? 1 : 0;
}

#endif
