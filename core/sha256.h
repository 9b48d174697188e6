/* sha256 — SHA-256 (FIPS 180-4), for the Upgrade RPC's `sha256` check
 * (api.md §9 "Upgrading the agent in place") and HMAC-SHA256 for signed
 * URLs.  Our own compact code: the
 * build has no crypto library (tests/unit/test_sha256.c: the FIPS and
 * NIST test vectors, and input split at every offset).
 *
 *   sha256_ctx s;
 *   sha256_init(&s);
 *   sha256_update(&s, data, len);   // any number of times
 *   sha256_final(&s, digest);       // 32 bytes
 *
 * Pure functions, any thread; no state beyond the context.
 */
#ifndef CONCH_SHA256_H
#define CONCH_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

typedef struct sha256_ctx {
  uint32_t h[8];
  uint64_t bytes;    /* message length so far */
  uint8_t block[64]; /* a partial block */
  size_t used;       /* bytes in block */
} sha256_ctx;

void sha256_init(sha256_ctx *s);
void sha256_update(sha256_ctx *s, const void *data, size_t len);
void sha256_final(sha256_ctx *s, uint8_t out[SHA256_LEN]);

/* HMAC-SHA256 (RFC 2104) of msg keyed by key: for signed URLs (api.md §9
 * "Files over plain HTTP"). */
void hmac_sha256(const void *key, size_t klen, const void *msg, size_t mlen, uint8_t out[SHA256_LEN]);

/* The 32 bytes of 64 hex digits (either case) in hex[0..len): 0, else -1. */
int sha256_from_hex(const char *hex, size_t len, uint8_t out[SHA256_LEN]);

#endif
