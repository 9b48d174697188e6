/* gzip — whole-message gzip (RFC 1952) for the RPC layer: pure functions
 * on caller-owned bytes, no libuv, any thread.
 *
 * gz_inflate bounds its output (a gzip bomb stops at max + 1 bytes of
 * output, never more); several concatenated gzip members are one message,
 * as zlib's gunzip reads them. */
#ifndef CONCH_PROTO_GZIP_H
#define CONCH_PROTO_GZIP_H

#include <stddef.h>
#include <stdint.h>

typedef enum gz_result {
  GZ_OK = 0,
  GZ_TOO_BIG,  /* the output would pass max */
  GZ_BAD,      /* not gzip, corrupt, truncated */
  GZ_NOMEM,
} gz_result;

/* in[0, n) → *out (malloc'd, *olen bytes; freed by the caller). */
gz_result gz_inflate(const uint8_t *in, size_t n, size_t max, uint8_t **out, size_t *olen);

/* gzip of a[0, an) followed by b[0, bn) (b may be NULL), at zlib level
 * `level`, into a malloc'd buffer with `head` bytes free in front: the
 * compressed bytes are at ret + head, *olen of them.  NULL when out of
 * memory. */
uint8_t *gz_deflate(const uint8_t *a, size_t an, const uint8_t *b, size_t bn, size_t head,
                    int level, size_t *olen);

/* Streaming gzip, for bodies of any size (/files): an encoder (gzip of
 * what is fed) or a decoder (gunzip; concatenated members are one
 * stream).  Output goes to sink(arg, p, n) as it is made, in pieces of at
 * most GZ_STREAM_OUT bytes; sink returns 0, or -1 to stop (then
 * GZ_TOO_BIG).  GZ_BAD: bad input.  finish: no input after this; the
 * decoder then wants its stream complete (else GZ_BAD). */
#define GZ_STREAM_OUT (64u * 1024)
typedef struct gz_stream gz_stream;
typedef int (*gz_sink)(void *arg, const uint8_t *p, size_t n);
gz_stream *gz_stream_new(int encode, int level);
gz_result gz_stream_feed(gz_stream *g, const uint8_t *in, size_t n, int finish, gz_sink sink, void *arg);
void gz_stream_free(gz_stream *g);

/* 1 when an Accept-Encoding style header value ("deflate, gzip;q=0.5",
 * "identity,gzip") lists gzip with a q-value above 0 (NULL: 0). */
int gz_accepted(const char *value);

#endif
