/* rpcwork — rpc_work_submit / rpc_work_cancel (server/rpc.h): a service's
 * thread-pool job on the batched pool (core/pool.h), so that services
 * never see the pool's job layout. */
#include <stddef.h>
#include <stdlib.h>

#include "core/log.h"
#include "core/pool.h"
#include "server/rpc.h"

struct rpc_work {
  pool_job job; /* first */
  void (*run)(void *data);
  void (*done)(void *data, int canceled);
  void *data;
  const rpc_ident *id; /* a hold: the call's identity, or NULL (root) */
  int refused;         /* the kernel refused the identity: run() did not run */
};

/* run() with the call's file-system identity on this thread, root's again
 * after it: nothing of one job's identity reaches the next.  An identity
 * the kernel refuses is never run as root: done() hears "canceled". */
static void rpc_work_run(pool_job *j) {
  rpc_work *w = (rpc_work *)j;
  if (rpc_fs_become(w->id) != 0) {
    w->refused = 1;
    return;
  }
  w->run(w->data);
  if (w->id) rpc_fs_restore();
}

static void rpc_work_done(pool_job *j, int canceled) {
  rpc_work *w = (rpc_work *)j;
  void (*done)(void *, int) = w->done;
  void *data = w->data;
  if (w->refused) LOG_ERROR("a job as uid %u was refused by the kernel", (unsigned)w->id->uid);
  canceled = canceled || w->refused;
  rpc_ident_release(w->id);
  free(w);
  done(data, canceled);
}

rpc_work *rpc_work_submit_as(const rpc_ident *id, void (*run)(void *data),
                             void (*done)(void *data, int canceled), void *data) {
  rpc_work *w = malloc(sizeof *w);
  if (!w) return NULL;
  w->run = run;
  w->done = done;
  w->data = data;
  w->refused = 0;
  w->id = NULL;
  if (id && (id->uid || id->gid || id->ngroups)) w->id = rpc_ident_hold(id);
  pool_submit(&w->job, rpc_work_run, rpc_work_done);
  return w;
}

rpc_work *rpc_work_submit(rpc_call *c, void (*run)(void *data), void (*done)(void *data, int canceled),
                          void *data) {
  return rpc_work_submit_as(c ? rpc_ident_of(c) : NULL, run, done, data);
}

int rpc_work_cancel(rpc_work *w) { return pool_cancel(&w->job); }
