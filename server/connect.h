/* connect — the RPC protocol layer: Connect (unary and streaming, JSON and
 * proto), gRPC and gRPC-Web, on top of an hx exchange; implements rpc.h.
 *
 * Order of checks for an RPC route: POST (405), content type (415), then,
 * answered in the protocol's own error format: Connect-Protocol-Version,
 * token (auth.c), timeout header, compression; then the body.
 */
#ifndef CONCH_CONNECT_H
#define CONCH_CONNECT_H

#include "server/hx.h"
#include "server/rpc.h"

void connect_serve(hx *x, const rpc_method *m);
/* An upgrade's drain: every call of a RPC_F_DRAIN_END method ends
 * `unavailable` RPC_DRAIN_MSG; how many. */
size_t connect_drain(void);

#endif
