/* conn — one accepted TCP connection: the socket behind a sink (sink.h):
 * reading, bounded writing, timers, and the choice of protocol from the
 * table it is handed (HTTP/2 preface → serve->h2_init, anything else →
 * serve->http1_init).
 */
#ifndef CONCH_CONN_H
#define CONCH_CONN_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/sink.h"

#define CONN_READ_BUF (64u * 1024)
/* Before any request on it is authenticated a connection may leave at most
 * this many bytes unsent (the kernel's socket buffers not counted); past
 * it, it is closed and counted (conch.unauth_closed): a client that sends
 * no token and never reads gets nothing buffered for it. */
#define CONN_UNAUTH_OUTQ (64u * 1024)
/* A connection whose reads of this loop turn dispatched this many requests
 * (sink_turn_request)
 * reads no more until the next turn (libuv would read up to 32 buffers in
 * a row): a peer flooding tiny requests must not keep the loop from the
 * others.  Counted by requests, not bytes: a big upload is one request and
 * reads at full speed. */
#define CONN_TURN_REQS 64
/* malloc_trim this long after a connection closed (server/conn.c) */
#define CONN_TRIM_MS 1000

/* malloc_trim in CONN_TRIM_MS (once, however often asked meanwhile):
 * after a connection closed, or an exchange that sent a lot ended. */
void conn_trim_soon(void);

/* on: no connection reads any more (an upgrade in place is draining: no
 * new request starts work); off: they read again (the exec failed). */
void conn_freeze(int on);
/* 1 while some connection holds output not yet handed to the kernel (an
 * upgrade waits for the Upgrade call's answer to leave). */
int conn_pending_output(void);

/* Accept on a listening stream; the connection speaks what serve offers. */
void conn_accept(uv_stream_t *server, const hserve *serve);
/* A connection carried over by an upgrade (conn_carry's): served anew. */
void conn_adopt(int fd, const hserve *serve);

/* An upgrade's drain (server/handover.c).  on: every connection with an
 * exchange under way finishes it and closes (HTTP/1.1 `Connection:
 * close` on the answer, HTTP/2 new streams refused and GOAWAY once the
 * open ones ended); those between requests go on reading, and one whose
 * request comes in is answered and closed the same way.  conn_busy: 1
 * while some connection is not between requests.  conn_carry: the
 * descriptors of those that are, with nothing left to send (at most max):
 * the next program serves them, so no request is cut by the exec. */
void conn_drain(int on);
int conn_busy(void);
size_t conn_carry(int *fds, size_t max);

#endif
