/* rpcstats — calls ended, by route and code, and how long the unary ones
 * took (GET /metrics in the Prometheus form: conch_rpc_requests_total,
 * conch_rpc_duration_seconds).  Counted by the Connect layer where a
 * call's end is decided (connect.c); read by agent/metrics.c.  Loop only.
 */
#ifndef CONCH_RPCSTATS_H
#define CONCH_RPCSTATS_H

#include <stdint.h>

#include "server/rpc.h"

#define RPCSTATS_CODES 17   /* rpc_code 0..16 */
#define RPCSTATS_BUCKETS 12 /* upper bounds in rpcstats_le, then +Inf */
#define RPCSTATS_ROUTES 32  /* conch.routes */

extern const double rpcstats_le[RPCSTATS_BUCKETS];

typedef struct rpcstats_route {
  uint64_t codes[RPCSTATS_CODES];
  uint64_t bucket[RPCSTATS_BUCKETS + 1]; /* unary calls by duration, not cumulative */
  uint64_t count, sum_ns;                /* unary calls */
} rpcstats_route;

/* A call of m ended with code after ns nanoseconds. */
void rpcstats_end(const rpc_method *m, rpc_code code, uint64_t ns);
/* The figures of conch.routes[i] (zeros when none ended). */
const rpcstats_route *rpcstats_route_at(size_t i);

#endif
