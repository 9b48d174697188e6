/* pool — the services' blocking jobs (stat, directory walks, file reads and
 * writes, process starts) run in the libuv thread pool, batched; services
 * reach it through rpc_work_submit (server/rpc.h).  Long jobs hold one
 * runner; short ones queued meanwhile get another (see pool.c).
 *
 * uv_queue_work costs one thread wake-up and one completion per job; at
 * 100 k one-file ListFiles a second those wake-ups are most of the work.
 * Here jobs go into one FIFO that a few "runners" (each one
 * uv_queue_work'd) drain one job at a time while it is not empty, and
 * finished jobs come back through one uv_async_t: a burst of N jobs costs
 * a couple of wake-ups, not N.  A slow job holds one runner only; the
 * others keep draining.  At most conch's thread-pool size runners exist.
 *
 * Threads: pool_submit / pool_cancel and every done callback run on the
 * loop thread; `work` runs in a pool thread and must touch only the job.
 *
 * Lifetime: after pool_submit the job belongs to the pool until its done
 * callback runs (exactly once, from the loop, never from inside
 * pool_submit or pool_cancel).
 */
#ifndef CONCH_POOL_H
#define CONCH_POOL_H

#include "core/list.h"

typedef struct pool_job pool_job;

struct pool_job {
  void (*work)(pool_job *j);                /* pool thread */
  void (*done)(pool_job *j, int canceled);  /* loop thread; may free j */
  list_node link;                           /* private to the pool */
  int state;                                /* private to the pool */
  int canceled;                             /* private to the pool */
};

/* Queue j.  Its work runs soon in a pool thread; then done(j, 0). */
void pool_submit(pool_job *j, void (*work)(pool_job *), void (*done)(pool_job *, int));

/* Take j back if no thread has started it: 0, and done(j, 1) runs later
 * from the loop without work having run.  -1 once it runs or ran (done
 * then follows as usual). */
int pool_cancel(pool_job *j);

/* Jobs queued and not yet started (tests, logs). */
unsigned pool_pending(void);
/* Runners queued to libuv's pool so far (tests: a burst of jobs should
 * cost few). */
unsigned long long pool_runners_started(void);
/* Times the loop picked up finished jobs (tests: a burst should wake it
 * a few times, not once per job). */
unsigned long long pool_wakeups(void);
/* 1 when finished jobs wake the loop through the pool's own eventfd, 0 on
 * the uv_async_t fallback (no fd was left when the pool started). */
int pool_wakes_by_eventfd(void);

#endif
