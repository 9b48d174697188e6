/* rpcwork — rpc_work_submit / rpc_work_cancel (agent/rpc.h): a service's
 * thread-pool job on the batched pool (agent/pool.h), so that services
 * never see the pool's job layout. */
#include <stddef.h>
#include <stdlib.h>

#include "agent/pool.h"
#include "agent/rpc.h"

struct rpc_work {
  pool_job job; /* first */
  void (*run)(void *data);
  void (*done)(void *data, int canceled);
  void *data;
};

static void rpc_work_run(pool_job *j) {
  rpc_work *w = (rpc_work *)j;
  w->run(w->data);
}

static void rpc_work_done(pool_job *j, int canceled) {
  rpc_work *w = (rpc_work *)j;
  void (*done)(void *, int) = w->done;
  void *data = w->data;
  free(w);
  done(data, canceled);
}

rpc_work *rpc_work_submit(rpc_call *c, void (*run)(void *data), void (*done)(void *data, int canceled),
                          void *data) {
  (void)c;
  rpc_work *w = malloc(sizeof *w);
  if (!w) return NULL;
  w->run = run;
  w->done = done;
  w->data = data;
  pool_submit(&w->job, rpc_work_run, rpc_work_done);
  return w;
}

int rpc_work_cancel(rpc_work *w) { return pool_cancel(&w->job); }
