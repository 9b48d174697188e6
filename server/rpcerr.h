/* rpcerr — rendering of RPC errors (see rpcerr.c); rpc_code_name and
 * rpc_code_http_status (rpc.h) live here too. */
#ifndef CONCH_RPCERR_H
#define CONCH_RPCERR_H

#include "server/rpc.h"

/* {"code":"…","message":"…"} (message omitted when empty); wrap != 0:
 * {"error":{…}} as in Connect's end-of-stream message.  NULL when out of
 * memory. */
char *error_json(rpc_code code, const char *msg, int wrap);

/* grpc-message: percent-encode outside printable ASCII and '%'. */
char *grpc_pct(const char *s);

#endif
