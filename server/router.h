/* router — maps a request to its handler: GET /health, GET /metrics (metrics.h), the RPC routes
 * registered by the services (served through the protocol layer in
 * connect.c), 404 for everything else. */
#ifndef CONCH_ROUTER_H
#define CONCH_ROUTER_H

#include <stddef.h>

#include "server/hx.h"
#include "server/rpc.h"

/* Add a service's methods (the array must outlive the daemon). */
int router_register(const rpc_method *methods, size_t n);
void router_dispatch(hx *x);

#endif
