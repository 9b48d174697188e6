/* router — maps a request to its handler: GET /health, the plain HTTP
 * routes registered with router_add_http (agent/ registers /metrics), the
 * RPC routes registered by the services (served through the protocol layer
 * in connect.c), 404 for everything else. */
#ifndef CONCH_ROUTER_H
#define CONCH_ROUTER_H

#include <stddef.h>

#include "server/hx.h"
#include "server/rpc.h"

/* Add a service's methods (the array must outlive the daemon). */
int router_register(const rpc_method *methods, size_t n);
/* Serve requests whose path (without the query) is `path` with serve(x),
 * whatever their method (the handler answers 405 itself).  At most 8;
 * -1 past that.  path must outlive the daemon. */
typedef void (*router_http_fn)(hx *x);
int router_add_http(const char *path, router_http_fn serve);
void router_dispatch(hx *x);

#endif
