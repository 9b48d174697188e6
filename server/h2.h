/* h2 — HTTP/2 cleartext server side of a connection (nghttp2).
 *
 * Entered by the client preface (prior knowledge) or by an HTTP/1.1
 * `Upgrade: h2c` request, which becomes stream 1.  SETTINGS: ≤ 128
 * concurrent streams, header list ≤ 64 KiB; request bodies are flow
 * controlled by what the handlers consume (hx_pause_body holds the window).
 */
#ifndef CONCH_H2_H
#define CONCH_H2_H

#include "server/sink.h"
#include "server/hx.h"

#define H2_MAX_STREAMS 128
#define H2_MAX_HEADER_LIST (64u * 1024)
#define H2_STREAM_WINDOW (1u * 1024 * 1024)
#define H2_CONN_WINDOW (16u * 1024 * 1024)
/* open streams an unauthenticated connection may have (then it is closed,
 * counted with CONN_UNAUTH_OUTQ's): each costs a few KiB however little
 * it asks */
#define H2_UNAUTH_STREAMS 32

extern const hproto h2_conn_proto;
/* An HTTP2-Settings header value that decodes (base64url, whole frames). */
int h2_settings_valid(const char *v);
/* upgrade: the HTTP/1.1 request (taken over, becomes stream 1) and its body
 * (malloc'd, taken over); NULL/0 for prior knowledge. */
int h2_conn_init(hsink *c, hx *upgrade, uint8_t *body, size_t body_len);

#endif
