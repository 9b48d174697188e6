/* rpcstats — see rpcstats.h. */
#include "server/rpcstats.h"

#include "core/daemon.h"

const double rpcstats_le[RPCSTATS_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                              0.05,   0.1,   0.25,   0.5,   1,    5};

static rpcstats_route rpcstats[RPCSTATS_ROUTES];

void rpcstats_end(const rpc_method *m, rpc_code code, uint64_t ns) {
  size_t i = 0;
  while (i < conch.nroutes && i < RPCSTATS_ROUTES && conch.routes[i] != m) i++;
  if (i == conch.nroutes || i == RPCSTATS_ROUTES || (unsigned)code >= RPCSTATS_CODES) return;
  rpcstats_route *r = &rpcstats[i];
  r->codes[code]++;
  if (m->kind != RPC_UNARY) return;
  double s = (double)ns / 1e9;
  size_t b = 0;
  while (b < RPCSTATS_BUCKETS && s > rpcstats_le[b]) b++;
  r->bucket[b]++;
  r->count++;
  r->sum_ns += ns;
}

const rpcstats_route *rpcstats_route_at(size_t i) {
  static const rpcstats_route none;
  return i < RPCSTATS_ROUTES ? &rpcstats[i] : &none;
}
