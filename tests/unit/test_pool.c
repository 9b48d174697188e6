/* test_pool — core/pool on a real libuv loop: every job's work runs once
 * off the loop thread and its done callback once on it; jobs canceled while
 * staged or queued never run; a long job does not hold back a short one
 * submitted after it; a burst costs far fewer runners than jobs; the same
 * through rpc_work_submit / rpc_work_cancel. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"
#include "core/pool.h"
#include "server/rpc.h"
#include "test.h"

typedef struct tjob {
  pool_job job; /* first */
  int id;
  atomic_int ran;
  int done_calls, canceled;
  int off_loop; /* work ran on another thread */
  atomic_int *gate; /* when set: work waits until it becomes non-zero */
} tjob;

static pthread_t loop_thread;
static int ndone, want_done;

static void tj_work(pool_job *j) {
  tjob *t = (tjob *)j;
  atomic_fetch_add(&t->ran, 1);
  t->off_loop = !pthread_equal(pthread_self(), loop_thread);
  if (t->gate)
    while (!atomic_load(t->gate)) usleep(1000);
}

static void tj_done(pool_job *j, int canceled) {
  tjob *t = (tjob *)j;
  t->done_calls++;
  t->canceled = canceled;
  ndone++;
  if (ndone >= want_done) uv_stop(conch.loop);
}

static void on_guard(uv_timer_t *h) {
  (void)h;
  uv_stop(conch.loop);
}

/* Run the loop until `want` done callbacks in all or ms passed. */
static void run_until(int want, int ms) {
  want_done = want;
  if (ndone >= want) return;
  uv_timer_t guard;
  uv_timer_init(conch.loop, &guard);
  uv_timer_start(&guard, on_guard, (uint64_t)ms, 0);
  uv_run(conch.loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
}

TEST(burst_all_once) {
  enum { N = 5000 };
  tjob *v = calloc(N, sizeof *v);
  ndone = 0;
  unsigned long long r0 = pool_runners_started();
  for (int i = 0; i < N; i++) {
    v[i].id = i;
    pool_submit(&v[i].job, tj_work, tj_done);
  }
  ASSERT_EQ(pool_pending(), N); /* staged until the loop turns */
  run_until(N, 10000);
  ASSERT_EQ(ndone, N);
  for (int i = 0; i < N; i++) {
    ASSERT_EQ(atomic_load(&v[i].ran), 1);
    ASSERT_EQ(v[i].done_calls, 1);
    ASSERT_EQ(v[i].canceled, 0);
    ASSERT(v[i].off_loop);
  }
  ASSERT_EQ(pool_pending(), 0);
  /* a runner drains the FIFO for up to 2 ms: a burst is not a thread
   * wake-up per job */
  unsigned long long runs = pool_runners_started() - r0;
  fprintf(stderr, "  %d jobs took %llu runners\n", N, runs);
  ASSERT(runs >= 1 && runs <= N / 16);
  free(v);
}

TEST(cancel_staged_and_queued) {
  atomic_int gate = 0;
  tjob blockers[16], a, b;
  memset(blockers, 0, sizeof blockers);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  ndone = 0;
  /* occupy every runner so that later jobs stay queued */
  for (int i = 0; i < 16; i++) {
    blockers[i].gate = &gate;
    pool_submit(&blockers[i].job, tj_work, tj_done);
  }
  pool_submit(&a.job, tj_work, tj_done);
  ASSERT_EQ(pool_cancel(&a.job), 0); /* staged: taken back at once */
  ASSERT_EQ(a.done_calls, 0);        /* done comes later, from the loop */
  uv_run(conch.loop, UV_RUN_NOWAIT); /* hands the blockers to runners */
  usleep(50000);
  pool_submit(&b.job, tj_work, tj_done);
  uv_run(conch.loop, UV_RUN_NOWAIT); /* b reaches the shared queue */
  ASSERT_EQ(pool_cancel(&b.job), 0); /* queued behind busy runners */
  ASSERT_EQ(pool_cancel(&b.job), -1);
  run_until(2, 2000);
  ASSERT_EQ(a.done_calls, 1);
  ASSERT_EQ(a.canceled, 1);
  ASSERT_EQ(atomic_load(&a.ran), 0);
  ASSERT_EQ(b.done_calls, 1);
  ASSERT_EQ(b.canceled, 1);
  ASSERT_EQ(atomic_load(&b.ran), 0);
  /* a running job cannot be taken back */
  int running = -1;
  for (int i = 0; i < 16; i++)
    if (atomic_load(&blockers[i].ran)) running = i;
  ASSERT(running >= 0);
  ASSERT_EQ(pool_cancel(&blockers[running].job), -1);
  atomic_store(&gate, 1);
  run_until(18, 10000);
  ASSERT_EQ(ndone, 18);
  for (int i = 0; i < 16; i++) {
    ASSERT_EQ(atomic_load(&blockers[i].ran), 1);
    ASSERT_EQ(blockers[i].canceled, 0);
  }
}

/* One long job (a walk of "/") must not delay a short job submitted after
 * it while a second runner is allowed. */
TEST(long_job_does_not_block_short) {
  atomic_int gate = 0;
  tjob slow, fast;
  memset(&slow, 0, sizeof slow);
  memset(&fast, 0, sizeof fast);
  slow.gate = &gate;
  ndone = 0;
  pool_submit(&slow.job, tj_work, tj_done);
  uv_run(conch.loop, UV_RUN_NOWAIT);
  for (int i = 0; i < 200 && !atomic_load(&slow.ran); i++) usleep(1000);
  ASSERT_EQ(atomic_load(&slow.ran), 1);
  pool_submit(&fast.job, tj_work, tj_done);
  run_until(1, 3000);
  ASSERT_EQ(fast.done_calls, 1);
  ASSERT_EQ(slow.done_calls, 0);
  atomic_store(&gate, 1);
  run_until(2, 3000);
  ASSERT_EQ(slow.done_calls, 1);
}

/* Short jobs finished just before a long one taken from a non-empty FIFO
 * are not held back until the long one ends (the loop's poll collects
 * them), and a job queued behind the long one gets a second runner. */
TEST(short_before_long_not_held) {
  atomic_int gate = 0;
  tjob s[3], slow, after;
  memset(s, 0, sizeof s);
  memset(&slow, 0, sizeof slow);
  memset(&after, 0, sizeof after);
  slow.gate = &gate;
  ndone = 0;
  for (int i = 0; i < 3; i++) pool_submit(&s[i].job, tj_work, tj_done);
  pool_submit(&slow.job, tj_work, tj_done);
  pool_submit(&after.job, tj_work, tj_done);
  run_until(4, 3000);
  ASSERT_EQ(ndone, 4);
  for (int i = 0; i < 3; i++) ASSERT_EQ(s[i].done_calls, 1);
  ASSERT_EQ(after.done_calls, 1);
  ASSERT_EQ(slow.done_calls, 0);
  atomic_store(&gate, 1);
  run_until(5, 3000);
  ASSERT_EQ(slow.done_calls, 1);
}

/* A burst wakes the loop for finished jobs in groups, not once per job. */
TEST(burst_wakes_loop_in_groups) {
  enum { N = 2000 };
  tjob *v = calloc(N, sizeof *v);
  ndone = 0;
  unsigned long long w0 = pool_wakeups();
  for (int i = 0; i < N; i++) pool_submit(&v[i].job, tj_work, tj_done);
  run_until(N, 10000);
  ASSERT_EQ(ndone, N);
  unsigned long long w = pool_wakeups() - w0;
  fprintf(stderr, "  %d jobs woke the loop %llu times\n", N, w);
  ASSERT(w >= 1 && w <= N / 4);
  ASSERT_EQ(pool_wakes_by_eventfd(), 1); /* not the uv_async_t fallback */
  free(v);
}

/* Other thread-pool users get their turn: a runner returns after about
 * 2 ms of work even with jobs queued, so a plain uv_queue_work request
 * submitted behind 40 jobs of 1 ms each (both pool threads busy with
 * runners) completes long before the last of them (with a 32-job turn it
 * waited about 32 ms, as long as the whole burst). */
static int plain_done_at = -1;
static void plain_work(uv_work_t *req) { (void)req; }
static void plain_after(uv_work_t *req, int status) {
  (void)req;
  (void)status;
  plain_done_at = ndone;
}
static void sleepy_work(pool_job *j) {
  tj_work(j);
  usleep(1000);
}

TEST(runners_take_turns) {
  enum { N = 40 };
  tjob v[N];
  memset(v, 0, sizeof v);
  ndone = 0;
  plain_done_at = -1;
  unsigned long long r0 = pool_runners_started();
  for (int i = 0; i < N; i++) pool_submit(&v[i].job, sleepy_work, tj_done);
  run_until(N, 6); /* the loop's poll adds a second runner: both threads busy */
  ASSERT(ndone < 20);
  ASSERT(pool_runners_started() - r0 >= 2);
  uv_work_t plain;
  ASSERT_EQ(uv_queue_work(conch.loop, &plain, plain_work, plain_after), 0);
  run_until(N, 10000);
  ASSERT_EQ(ndone, N);
  for (int i = 0; i < 200 && plain_done_at < 0; i++) uv_run(conch.loop, UV_RUN_NOWAIT), usleep(1000);
  fprintf(stderr, "  the plain request finished after %d of %d jobs\n", plain_done_at, N);
  ASSERT(plain_done_at >= 0 && plain_done_at < 30);
}

/* A job submitted from any phase of a loop turn is handed over before the
 * loop next waits in its poll, not when some unrelated event (or the pool's
 * 1 ms timer) next wakes it.  The prepare phase is the trap: conn's flush
 * runs there, and a write it completes lets a download ask for its next
 * chunk after the pool's own prepare callback has run (or from a prepare
 * handle started in that phase, which runs only next turn) — so right after
 * such a submission the loop must not be about to block
 * (uv_backend_timeout 0).  Every phase's latency is printed (median of
 * PHASE_REPS, submission to done, in µs). */
enum { PH_PREPARE, PH_CHECK, PH_IDLE, PH_TIMER, PH_CLOSE, PH_COUNT, PHASE_REPS = 15 };
static const char *const phase_names[PH_COUNT] = {"prepare", "check", "idle", "timer", "close"};
static tjob phase_job;
static uint64_t phase_t0, phase_t1;
static int phase_timeout;

static void phase_done(pool_job *j, int canceled) {
  phase_t1 = uv_hrtime();
  tj_done(j, canceled);
}
static void phase_submit(void) {
  memset(&phase_job, 0, sizeof phase_job);
  phase_t0 = uv_hrtime();
  pool_submit(&phase_job.job, tj_work, phase_done);
  phase_timeout = uv_backend_timeout(conch.loop);
}
static void from_prepare(uv_prepare_t *h) { uv_prepare_stop(h); phase_submit(); }
static uv_idle_t kick; /* keeps the first poll from blocking, until the check phase */
static void from_check(uv_check_t *h) {
  uv_check_stop(h);
  uv_idle_stop(&kick);
  phase_submit();
}
static void from_idle(uv_idle_t *h) { uv_idle_stop(h); phase_submit(); }
static void from_timer(uv_timer_t *h) { (void)h; phase_submit(); }
static void from_close(uv_handle_t *h) { (void)h; phase_submit(); }
static void kick_cb(uv_idle_t *h) { (void)h; }

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

TEST(submit_from_every_phase) {
  for (int ph = 0; ph < PH_COUNT; ph++) {
    uint64_t us[PHASE_REPS];
    int blocking = 0; /* submissions after which the loop was about to wait */
    for (int rep = 0; rep < PHASE_REPS; rep++) {
      ndone = 0;
      phase_timeout = -2;
      uv_prepare_t prep;
      uv_check_t check;
      uv_idle_t idle;
      uv_timer_t timer, closing;
      uv_handle_t *mine = NULL;
      switch (ph) {
        case PH_PREPARE:
          uv_prepare_init(conch.loop, &prep);
          uv_prepare_start(&prep, from_prepare);
          mine = (uv_handle_t *)&prep;
          break;
        case PH_CHECK:
          uv_check_init(conch.loop, &check);
          uv_check_start(&check, from_check);
          uv_idle_init(conch.loop, &kick);
          uv_idle_start(&kick, kick_cb);
          mine = (uv_handle_t *)&check;
          break;
        case PH_IDLE:
          uv_idle_init(conch.loop, &idle);
          uv_idle_start(&idle, from_idle);
          mine = (uv_handle_t *)&idle;
          break;
        case PH_TIMER:
          uv_timer_init(conch.loop, &timer);
          uv_timer_start(&timer, from_timer, 0, 0);
          mine = (uv_handle_t *)&timer;
          break;
        case PH_CLOSE:
          uv_timer_init(conch.loop, &closing);
          uv_close((uv_handle_t *)&closing, from_close);
          break;
      }
      run_until(1, 1500);
      if (mine) uv_close(mine, NULL);
      if (ph == PH_CHECK) uv_close((uv_handle_t *)&kick, NULL);
      uv_run(conch.loop, UV_RUN_NOWAIT);
      ASSERT_EQ(phase_job.done_calls, 1);
      ASSERT_EQ(phase_job.canceled, 0);
      if (phase_timeout != 0) blocking++;
      us[rep] = (phase_t1 - phase_t0) / 1000;
    }
    qsort(us, PHASE_REPS, sizeof us[0], cmp_u64);
    fprintf(stderr, "  a job submitted in the %s phase was done after %llu us (median of %d, max %llu)\n",
            phase_names[ph], (unsigned long long)us[PHASE_REPS / 2], PHASE_REPS,
            (unsigned long long)us[PHASE_REPS - 1]);
    if (ph == PH_PREPARE) ASSERT_EQ(blocking, 0);
    ASSERT(us[PHASE_REPS / 2] < 100000);
  }
}

/* rpc_work_submit / rpc_work_cancel (server/rpc.h), the services' face of
 * the pool: run off the loop, done once on it with the caller's data; a job
 * taken back before it started gets done(data, 1) later, never run. */
typedef struct wjob {
  atomic_int ran;
  int done_calls, canceled, off_loop;
  atomic_int *gate;
} wjob;

static void wj_run(void *data) {
  wjob *w = data;
  atomic_fetch_add(&w->ran, 1);
  w->off_loop = !pthread_equal(pthread_self(), loop_thread);
  if (w->gate)
    while (!atomic_load(w->gate)) usleep(1000);
}

static void wj_done(void *data, int canceled) {
  wjob *w = data;
  w->done_calls++;
  w->canceled = canceled;
  ndone++;
  if (ndone >= want_done) uv_stop(conch.loop);
}

TEST(rpc_work_run_and_cancel) {
  atomic_int gate = 0;
  wjob blockers[16], a, b;
  memset(blockers, 0, sizeof blockers);
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  ndone = 0;
  for (int i = 0; i < 16; i++) {
    blockers[i].gate = &gate;
    ASSERT(rpc_work_submit(NULL, wj_run, wj_done, &blockers[i]) != NULL);
  }
  rpc_work *wa = rpc_work_submit(NULL, wj_run, wj_done, &a);
  ASSERT(wa != NULL);
  ASSERT_EQ(rpc_work_cancel(wa), 0); /* not started: taken back */
  ASSERT_EQ(a.done_calls, 0);        /* done comes later, from the loop */
  run_until(1, 2000);
  ASSERT_EQ(a.done_calls, 1);
  ASSERT_EQ(a.canceled, 1);
  ASSERT_EQ(atomic_load(&a.ran), 0);
  atomic_store(&gate, 1);
  ASSERT(rpc_work_submit(NULL, wj_run, wj_done, &b) != NULL);
  run_until(18, 10000);
  ASSERT_EQ(ndone, 18);
  ASSERT_EQ(b.done_calls, 1);
  ASSERT_EQ(b.canceled, 0);
  ASSERT_EQ(atomic_load(&b.ran), 1);
  ASSERT_EQ(b.off_loop, 1);
  for (int i = 0; i < 16; i++) ASSERT_EQ(blockers[i].done_calls, 1);
}

int main(void) {
  setenv("UV_THREADPOOL_SIZE", "2", 1);
  conch.loop = uv_default_loop();
  loop_thread = pthread_self();
  /* the daemon's listeners keep its loop alive; here an async handle does
   * (the pool's own handles are unref'd) */
  static uv_async_t keepalive;
  uv_async_init(conch.loop, &keepalive, NULL);
  RUN(burst_all_once);
  RUN(cancel_staged_and_queued);
  RUN(long_job_does_not_block_short);
  RUN(short_before_long_not_held);
  RUN(burst_wakes_loop_in_groups);
  RUN(runners_take_turns);
  RUN(submit_from_every_phase);
  RUN(rpc_work_run_and_cancel);
  return test_summary();
}
