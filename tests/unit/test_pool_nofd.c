/* test_pool_nofd — core/pool started when the process has no fd left:
 * it falls back to libuv's async handle (no abort: PID 1 must not die for
 * that), and every job still runs once and comes back once. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"
#include "core/pool.h"
#include "test.h"

enum { NJOBS = 200 };

typedef struct tjob {
  pool_job job; /* first */
  atomic_int ran;
  int done_calls;
} tjob;

static int ndone;

static void tj_work(pool_job *j) { atomic_fetch_add(&((tjob *)j)->ran, 1); }

static void tj_done(pool_job *j, int canceled) {
  (void)canceled;
  ((tjob *)j)->done_calls++;
  if (++ndone == NJOBS) uv_stop(conch.loop);
}

static void on_guard(uv_timer_t *h) {
  (void)h;
  uv_stop(conch.loop);
}

TEST(no_fd_left) {
  uv_timer_t guard;
  uv_timer_init(conch.loop, &guard); /* before the fds run out */
  /* take every fd there is (a low limit keeps it quick) */
  struct rlimit rl = {64, 64};
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &rl), 0);
  int fds[64], n = 0;
  for (;;) {
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      ASSERT_EQ(errno, EMFILE);
      break;
    }
    fds[n++] = fd;
    ASSERT(n < 64);
  }
  static tjob jobs[NJOBS];
  for (int i = 0; i < NJOBS; i++) pool_submit(&jobs[i].job, tj_work, tj_done);
  ASSERT_EQ(pool_wakes_by_eventfd(), 0);
  uv_timer_start(&guard, on_guard, 10000, 0);
  uv_run(conch.loop, UV_RUN_DEFAULT);
  ASSERT_EQ(ndone, NJOBS);
  for (int i = 0; i < NJOBS; i++) {
    ASSERT_EQ(atomic_load(&jobs[i].ran), 1);
    ASSERT_EQ(jobs[i].done_calls, 1);
  }
  for (int i = 0; i < n; i++) close(fds[i]);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
}

int main(void) {
  conch.loop = uv_default_loop();
  RUN(no_fd_left);
  return test_summary();
}
