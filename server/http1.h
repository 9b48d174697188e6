/* http1 — HTTP/1.1 server side of a connection (libhttp-parser).
 *
 * Keep-alive, pipelined requests served one at a time in order,
 * Content-Length and chunked bodies in both directions, 100-continue,
 * `Upgrade: h2c` (the request, body included, becomes HTTP/2 stream 1),
 * header block ≤ 64 KiB (431), request headers within 10 s, idle 60 s.
 */
#ifndef CONCH_HTTP1_H
#define CONCH_HTTP1_H

#include "server/sink.h"

#define HTTP1_MAX_HEADER_BYTES (64u * 1024)
/* the header (10 s) and idle (60 s) timers: conch.http_header_ms / http_idle_ms */
#define HTTP1_HEADER_TIMEOUT_MS conch.http_header_ms
#define HTTP1_IDLE_TIMEOUT_MS conch.http_idle_ms

extern const hproto http1_conn_proto;
int http1_conn_init(hsink *c);

#endif
