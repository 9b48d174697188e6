/* pool — batched jobs for the thread pool; see pool.h.
 *
 * pool_submit only stages the job (loop thread, no lock); a uv_prepare
 * handle moves everything staged in one loop turn into the shared FIFO
 * just before the loop polls, under one lock (a uv_idle handle keeps the
 * poll from blocking when the job was staged too late in the prepare phase
 * for that: see pool_submit), and wakes a runner only
 * when no runner is free (none runs, or every one has been inside one job
 * for POOL_STUCK_NS — a long walk) or the queue is deep.  Shared state
 * (the FIFO, the finished list) is under one mutex; the runner count lives on the loop
 * thread only.  A runner returns once it has worked POOL_RUNNER_NS (or
 * taken POOL_RUNNER_JOBS jobs) even when more are queued, so that other
 * uv_queue_work users (connect.c's decodes and deflates) get their turn
 * in libuv's own FIFO; its after-work callback queues a new runner when
 * jobs remain.  A time budget rather than a small job count: under a
 * stream of one-file listings a runner handed over every 32 jobs, and each
 * hand-over cost a thread wake-up and two context switches.
 *
 * Finished jobs wake the loop in groups: a runner signals the loop when the
 * FIFO is empty (so the last job of a burst, which may be long, never holds
 * back the ones before it), after POOL_SIGNAL_JOBS
 * finished jobs, or when the oldest unsignaled one is POOL_SIGNAL_NS old.
 * A burst of one-file listings then costs a few loop wake-ups and a few
 * socket writes per connection, not one per job.  What a group can still
 * hold back — short jobs finished just before a long one taken from a
 * non-empty FIFO — the loop collects itself: while jobs are out, a timer
 * every POOL_POLL_MS picks up finished jobs and starts a runner for queued
 * jobs that no free runner is taking.
 */
#include "core/pool.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"

#define POOL_RUNNER_NS 2000000u /* 2 ms */
#define POOL_RUNNER_JOBS 4096
#define POOL_JOBS_PER_RUNNER 64 /* queue depth per free runner that asks for one more */
#define POOL_SIGNAL_JOBS 16
#define POOL_SIGNAL_NS 100000u /* 100 µs */
#define POOL_POLL_MS 1
#define POOL_STUCK_NS 500000u /* a runner this long in one job may be in a long walk */

enum { JOB_STAGED = 1, JOB_QUEUED, JOB_RUNNING, JOB_FINISHED };

typedef struct pool {
  /* staged by pool_submit during this loop turn (loop thread only); the
   * prepare handle hands them to the FIFO just before the loop polls */
  list_node staged;
  uv_prepare_t prep;
  /* active from a submission until the prepare handle has taken it: a job
   * staged after that handle ran in this turn (from another prepare
   * callback: conn's flush, whose completed write lets a download read its
   * next chunk) would otherwise wait for the poll to return, up to the
   * poll timer's 1 ms; an active idle handle makes that poll not block */
  uv_idle_t idle;
  uv_mutex_t lock;
  list_node queue; /* the FIFO (cancel unlinks) */
  unsigned nqueued;
  list_node rlist; /* runners that will still take jobs (spawned, not
                    * yet past their decision to return) */
  list_node done; /* finished or canceled, for the loop */
  /* Finished jobs wake the loop through an eventfd of our own, written at
   * most once until the loop has looked (`signaled`).  Not a uv_async_t:
   * libuv 1.44's uv_async_send writes its eventfd and then marks the
   * handle, and the woken loop spins (997 PAUSEs, then sched_yield) until
   * the mark is there.  On a 2-CPU guest the loop is often woken onto the
   * sender's CPU and preempts it, so it spins out and yields, and then
   * waits behind a runner draining jobs while the client idles. */
  int efd;            /* -1: no fd was left for one (then `async`) */
  uv_poll_t efd_poll;
  uv_async_t async;   /* the fallback: libuv's shared eventfd, always there */
  atomic_int signaled;
  uv_timer_t poll; /* while jobs are out (see above) */
  unsigned runners, max_runners; /* loop thread only */
  unsigned out;                  /* loop thread: submitted, done not yet run */
  unsigned long long started, wakeups;
} pool;

typedef struct runner {
  uv_work_t req;
  pool *p;
  list_node link;             /* p->rlist, under the lock */
  uint64_t job_start;         /* under the lock */
  int in_job;
} runner;

static void pool_collect(pool *p);
static void pool_on_efd(uv_poll_t *h, int status, int events);
static void pool_on_async(uv_async_t *a);

static void pool_on_prepare(uv_prepare_t *h);
static void pool_on_idle(uv_idle_t *h);
static void pool_on_poll(uv_timer_t *t);

static pool *pool_get(void) {
  if (conch.pool) return conch.pool;
  pool *p = daemon_alloc_state(sizeof *p, "job pool");
  /* libuv creates its async eventfd with the loop: this cannot fail */
  if (uv_mutex_init(&p->lock) != 0 || uv_async_init(conch.loop, &p->async, pool_on_async) != 0) abort();
  p->async.data = p;
  uv_unref((uv_handle_t *)&p->async);
  /* our own eventfd (see above), when the process has an fd left for it:
   * the pool starts with the first job, which may come when every fd is
   * taken, and PID 1 must not abort */
  p->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->efd >= 0) {
    int inited = uv_poll_init(conch.loop, &p->efd_poll, p->efd) == 0;
    if (!inited || uv_poll_start(&p->efd_poll, UV_READABLE, pool_on_efd) != 0) {
      /* uv_close lets go of the fd at once (only its callback waits) */
      if (inited) uv_close((uv_handle_t *)&p->efd_poll, NULL);
      close(p->efd);
      p->efd = -1;
    }
  }
  if (p->efd >= 0) {
    p->efd_poll.data = p;
    uv_unref((uv_handle_t *)&p->efd_poll);
  }
  atomic_init(&p->signaled, 0);
  uv_prepare_init(conch.loop, &p->prep);
  p->prep.data = p;
  uv_unref((uv_handle_t *)&p->prep);
  uv_idle_init(conch.loop, &p->idle);
  p->idle.data = p;
  uv_unref((uv_handle_t *)&p->idle);
  uv_timer_init(conch.loop, &p->poll);
  p->poll.data = p;
  uv_unref((uv_handle_t *)&p->poll);
  const char *e = getenv("UV_THREADPOOL_SIZE");
  long n = e ? atol(e) : 4;
  p->max_runners = (unsigned)(n < 1 ? 1 : n > 16 ? 16 : n);
  conch.pool = p;
  return p;
}

/* Wake the loop for the finished list (any thread; once until it looks). */
static void pool_signal(pool *p) {
  if (p->efd < 0) {
    uv_async_send(&p->async); /* coalesced by libuv */
    return;
  }
  if (atomic_exchange(&p->signaled, 1)) return;
  uint64_t one = 1;
  while (write(p->efd, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

/* Append to the finished list; caller holds the lock. */
static void finished_push(pool *p, pool_job *j) {
  j->state = JOB_FINISHED;
  list_insert_tail(&p->done, &j->link);
}

/* Runners free to take queued jobs soon: all listed ones except those inside
 * one job for POOL_STUCK_NS already (perhaps a walk of "/"; a runner in a
 * one-file stat is done in microseconds).  Caller holds the lock. */
static unsigned pool_free_runners(pool *p) {
  uint64_t now = uv_hrtime();
  unsigned n = 0;
  runner *r;
  list_each(r, &p->rlist, link)
    if (!r->in_job || now - r->job_start < POOL_STUCK_NS) n++;
  return n;
}

/* Take the FIFO's head; caller holds the lock. */
static pool_job *fifo_take(pool *p) {
  pool_job *j = list_first_entry(&p->queue, pool_job, link);
  if (j) {
    list_remove(&j->link);
    p->nqueued--;
    j->state = JOB_RUNNING;
  }
  return j;
}

static void runner_work(uv_work_t *req) {
  runner *r = req->data;
  pool *p = r->p;
  pool_job *prev = NULL; /* finished, not yet on the list */
  unsigned unsignaled = 0;
  uint64_t oldest = 0, start = uv_hrtime(), now = start;
  for (int taken = 0;; taken++) {
    /* one lock per job: hand the last one over, take the next */
    uv_mutex_lock(&p->lock);
    if (prev) finished_push(p, prev);
    int turn_over = taken >= POOL_RUNNER_JOBS || now - start >= POOL_RUNNER_NS;
    pool_job *j = turn_over ? NULL : fifo_take(p);
    int empty = list_empty(&p->queue);
    r->in_job = j != NULL;
    r->job_start = now;
    if (!j) list_remove(&r->link); /* returning: no longer counts as free */
    uv_mutex_unlock(&p->lock);
    if (prev) {
      if (unsignaled++ == 0) oldest = now;
      if (!j || empty || unsignaled >= POOL_SIGNAL_JOBS || now - oldest >= POOL_SIGNAL_NS) {
        pool_signal(p); /* coalesced until the loop has looked */
        unsignaled = 0;
      }
    }
    if (!j) break;
    j->work(j);
    prev = j;
    now = uv_hrtime();
  }
}

static void runner_spawn(pool *p);

/* Queued jobs and no runner free to take them (none at all, or every one
 * inside a job that may be a long walk): one more runner, up to the cap.
 * A free runner drains a deep queue by itself unless it is very deep. */
static void pool_grow(pool *p, unsigned queued, unsigned free_runners) {
  if (!queued || p->runners >= p->max_runners) return;
  if (free_runners == 0 || queued > free_runners * POOL_JOBS_PER_RUNNER) runner_spawn(p);
}

/* pool_grow with the shared counts read under the lock. */
static void pool_regrow(pool *p) {
  uv_mutex_lock(&p->lock);
  unsigned queued = p->nqueued, free_runners = pool_free_runners(p);
  uv_mutex_unlock(&p->lock);
  pool_grow(p, queued, free_runners);
}

static void runner_after(uv_work_t *req, int status) {
  (void)status; /* runners are never canceled */
  runner *r = req->data;
  pool *p = r->p;
  free(r);
  p->runners--;
  pool_regrow(p);
  /* finished jobs of this runner may still sit in the list */
  pool_collect(p);
}

static void runner_spawn(pool *p) {
  runner *r = malloc(sizeof *r);
  if (r) {
    r->p = p;
    r->req.data = r;
    r->in_job = 0;
    r->job_start = 0;
    uv_mutex_lock(&p->lock); /* listed before it can start (and unlist itself) */
    list_insert_head(&p->rlist, &r->link);
    uv_mutex_unlock(&p->lock);
    if (uv_queue_work(conch.loop, &r->req, runner_work, runner_after) == 0) {
      p->runners++;
      p->started++;
      return;
    }
    uv_mutex_lock(&p->lock);
    list_remove(&r->link);
    uv_mutex_unlock(&p->lock);
    free(r);
  }
  /* No new runner.  With none running, fail what is queued rather than
   * strand it. */
  if (p->runners) return;
  uv_mutex_lock(&p->lock);
  pool_job *j;
  while ((j = list_first_entry(&p->queue, pool_job, link))) {
    list_remove(&j->link);
    j->canceled = 1;
    finished_push(p, j);
  }
  p->nqueued = 0;
  uv_mutex_unlock(&p->lock);
  pool_signal(p);
}

/* Run the done callbacks of the finished jobs (loop thread). */
static void pool_collect(pool *p) {
  list_node done = {0};
  uv_mutex_lock(&p->lock);
  list_splice_tail(&done, &p->done);
  uv_mutex_unlock(&p->lock);
  if (!list_empty(&done)) p->wakeups++;
  pool_job *j;
  while ((j = list_first_entry(&done, pool_job, link))) {
    list_remove(&j->link); /* done may free j, or submit it again */
    p->out--;
    j->done(j, j->canceled);
  }
  if (!p->out) uv_timer_stop(&p->poll);
}

/* The eventfd: reset it, then allow the next signal, then collect — in
 * that order, so a job finished after the collection signals anew. */
static void pool_on_efd(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  pool *p = h->data;
  uint64_t v;
  while (read(p->efd, &v, sizeof v) < 0 && errno == EINTR) {
  }
  atomic_store(&p->signaled, 0);
  pool_collect(p);
}

static void pool_on_async(uv_async_t *a) { pool_collect(a->data); }

/* While jobs are out: collect finished ones a group may hold back, and
 * give queued jobs a runner when every runner is inside a long job. */
static void pool_on_poll(uv_timer_t *t) {
  pool *p = t->data;
  pool_regrow(p);
  pool_collect(p);
}

void pool_submit(pool_job *j, void (*work)(pool_job *), void (*done)(pool_job *, int)) {
  pool *p = pool_get();
  j->work = work;
  j->done = done;
  j->canceled = 0;
  j->state = JOB_STAGED;
  p->out++;
  list_insert_tail(&p->staged, &j->link);
  if (!uv_is_active((uv_handle_t *)&p->prep)) uv_prepare_start(&p->prep, pool_on_prepare);
  /* A prepare handle started from inside the prepare phase (a write that
   * completed in conn's flush let a download ask for its next chunk) runs
   * only on the next loop turn: the idle handle keeps the poll in between
   * from blocking.  Staged anywhere else (I/O, check, close, timer, idle
   * callbacks), the job is taken by this or the next turn's prepare phase,
   * before the loop polls; the idle callback, which runs first, then only
   * stops itself. */
  if (!uv_is_active((uv_handle_t *)&p->idle)) uv_idle_start(&p->idle, pool_on_idle);
  if (!uv_is_active((uv_handle_t *)&p->poll))
    uv_timer_start(&p->poll, pool_on_poll, POOL_POLL_MS, POOL_POLL_MS);
}

/* Only its being active counts (see pool_submit): it stops itself. */
static void pool_on_idle(uv_idle_t *h) { uv_idle_stop(h); }

/* Hand this turn's jobs to the runners: one lock, and a new runner only
 * when no runner is free (none runs, or every one has been inside one job
 * for POOL_STUCK_NS — a long walk) or the queue is deep. */
static void pool_on_prepare(uv_prepare_t *h) {
  pool *p = h->data;
  uv_prepare_stop(h);
  uv_idle_stop(&p->idle); /* everything staged so far is taken here */
  if (list_empty(&p->staged)) return;
  uv_mutex_lock(&p->lock);
  pool_job *j;
  list_each(j, &p->staged, link) {
    j->state = JOB_QUEUED;
    p->nqueued++;
  }
  list_splice_tail(&p->queue, &p->staged);
  unsigned queued = p->nqueued, free_runners = pool_free_runners(p);
  uv_mutex_unlock(&p->lock);
  pool_grow(p, queued, free_runners); /* (pool_submit started the poll timer) */
}

int pool_cancel(pool_job *j) {
  pool *p = pool_get();
  int r = -1;
  if (j->state == JOB_STAGED) { /* still ours alone */
    list_remove(&j->link);
    uv_mutex_lock(&p->lock);
    j->canceled = 1;
    finished_push(p, j);
    uv_mutex_unlock(&p->lock);
    pool_signal(p);
    return 0;
  }
  uv_mutex_lock(&p->lock);
  if (j->state == JOB_QUEUED) {
    list_remove(&j->link);
    p->nqueued--;
    j->canceled = 1;
    finished_push(p, j);
    r = 0;
  }
  uv_mutex_unlock(&p->lock);
  if (r == 0) pool_signal(p);
  return r;
}

unsigned pool_pending(void) {
  pool *p = pool_get();
  unsigned n = 0;
  pool_job *j;
  list_each(j, &p->staged, link) n++;
  uv_mutex_lock(&p->lock);
  n += p->nqueued;
  uv_mutex_unlock(&p->lock);
  return n;
}

unsigned long long pool_runners_started(void) { return pool_get()->started; }

unsigned long long pool_wakeups(void) { return pool_get()->wakeups; }

int pool_wakes_by_eventfd(void) { return pool_get()->efd >= 0; }
