/* envelope — the 5-byte message framing that Connect streaming, gRPC and
 * gRPC-Web share (api.md §3): 1 flag byte, 4-byte big-endian length, then
 * the payload.  Pure functions, any thread. */
#ifndef CONCH_PROTO_ENVELOPE_H
#define CONCH_PROTO_ENVELOPE_H

#include <stddef.h>
#include <stdint.h>

#define ENV_HEADER 5
#define ENV_COMPRESSED 0x01u /* the payload is compressed (the call's encoding) */
#define ENV_END_STREAM 0x02u /* Connect: the end-of-stream message (JSON) */
#define ENV_TRAILER 0x80u    /* gRPC-Web: the trailer frame (HTTP/1-style header lines) */

/* The header for a payload of len bytes with these flags, at h[0, 5). */
void env_put_header(uint8_t *h, uint8_t flags, size_t len);

typedef enum env_status {
  ENV_NEED,      /* p[0, n) holds no whole envelope yet (*len is set once
                    the 5 header bytes are there) */
  ENV_MSG,       /* one whole envelope: *flags, payload p[5, 5 + *len) */
  ENV_TOO_BIG,   /* the header announces more than max bytes (*len): known
                    before the payload arrives */
  ENV_BAD_FLAGS, /* a whole envelope with a flag outside `allowed` */
} env_status;

/* The envelope at the start of p[0, n). */
env_status env_next(const uint8_t *p, size_t n, uint32_t max, uint8_t allowed, uint8_t *flags,
                    uint32_t *len);

/* A whole envelope of body[0, n) in a new malloc'd buffer (5 + n bytes);
 * NULL when out of memory. */
uint8_t *env_frame(uint8_t flags, const void *body, size_t n);

/* The gRPC-Web trailer frame: "grpc-status: <status>\r\n" and, when msg is
 * not NULL, "grpc-message: <msg>\r\n" (msg already percent-encoded), with
 * flag 0x80; *len bytes in all.  NULL when out of memory. */
uint8_t *env_grpc_web_trailer(int status, const char *msg, size_t *len);

#endif
