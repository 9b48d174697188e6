/* auth — the conch-init-token check of api.md §4 (constant time). */
#ifndef CONCH_AUTH_H
#define CONCH_AUTH_H

#include "server/hx.h"
#include "server/rpc.h"

/* RPC_OK, or RPC_UNAUTHENTICATED with *msg set to the spec's text. */
rpc_code auth_check(const char *header_value, const char **msg);
/* auth_check on the exchange's conch-init-token header: a request carrying
 * it more than once is refused (`agent token is invalid`) — taking the first
 * let a proxy's or client's own token header mask an injected one. */
rpc_code auth_check_hx(const hx *x, const char **msg);
/* The same, where the token may also come as "Authorization: Bearer
 * <token>" (GET /metrics: what Prometheus's `authorization` scrape
 * setting sends).  With both headers conch-init-token decides; another
 * scheme counts as no token. */
rpc_code auth_check_hx_bearer(const hx *x, const char **msg);
/* Constant-time equality of two byte strings (time depends only on the
 * length of `given`). */
int auth_equal(const char *given, size_t glen, const char *want, size_t wlen);

#endif
