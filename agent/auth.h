/* auth — the conch-init-token check of api.md §4 (constant time). */
#ifndef CONCH_AUTH_H
#define CONCH_AUTH_H

#include "agent/rpc.h"

/* RPC_OK, or RPC_UNAUTHENTICATED with *msg set to the spec's text. */
rpc_code auth_check(const char *header_value, const char **msg);
/* Constant-time equality of two byte strings (time depends only on the
 * length of `given`). */
int auth_equal(const char *given, size_t glen, const char *want, size_t wlen);

#endif
