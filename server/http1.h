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

/* The connection's lifecycle, one request at a time (docs/internals/http1.md has
 * the table); changed only by http1.c's h1_set_state. */
typedef enum h1_state {
  H1_IDLE,    /* between requests: the next one is read when it comes */
  H1_HELD,    /* between requests, the next not parsed: too much output queued */
  H1_HEAD,    /* a request head is being read (x made, not dispatched) */
  H1_UPGRADE, /* an accepted h2c upgrade: its body is buffered, the switch at its end */
  H1_BODY,    /* dispatched: the handler has x; its body is being read */
  H1_DONE,    /* the request is all in: parsing waits until the exchange ends */
  H1_CLOSING, /* nothing more is read: it closes once its output is written
               * (input that could not be parsed, or revoked between requests) */
  H1_NSTATES
} h1_state;

extern const hproto http1_conn_proto;
int http1_conn_init(hsink *c);

/* 1 when `to` may follow `from` (the table alone). */
int http1_state_legal(h1_state from, h1_state to);
const char *http1_state_name(h1_state st);
/* The step from `from` to `to` on a scratch connection, checked as every
 * step is (lifecycle.h): 0 when taken, -1 when refused (for the tests). */
int http1_state_try(h1_state from, h1_state to);

#endif
