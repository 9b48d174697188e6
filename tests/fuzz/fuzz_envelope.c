/* fuzz_envelope — a request body cut into envelopes as the server does
 * (proto/envelope.c), the first byte choosing the size limit.  Properties:
 * a parsed envelope re-framed gives the same bytes; the parse consumes no
 * more than it was given; "too big" only past the limit, "need more" only
 * when the announced envelope is not all there; a gRPC-Web trailer frame
 * built from the input parses back as one trailer envelope. */
#include <string.h>

#include "proto/envelope.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint32_t max = data[0] & 1 ? 0xffffffffu : (uint32_t)data[0] * 64;
  const uint8_t *p = data + 1;
  size_t n = size - 1, off = 0;
  for (;;) {
    uint8_t flags = 0;
    uint32_t len = 0;
    env_status s = env_next(p + off, n - off, max, ENV_COMPRESSED, &flags, &len);
    if (s == ENV_NEED) {
      FUZZ_CHECK(n - off < ENV_HEADER || n - off - ENV_HEADER < len);
      break;
    }
    if (s == ENV_TOO_BIG) {
      FUZZ_CHECK(len > max);
      break;
    }
    FUZZ_CHECK(len <= max && ENV_HEADER + (size_t)len <= n - off);
    FUZZ_CHECK((s == ENV_BAD_FLAGS) == ((flags & ~ENV_COMPRESSED) != 0));
    uint8_t *f = env_frame(flags, p + off + ENV_HEADER, len);
    FUZZ_CHECK(f && memcmp(f, p + off, ENV_HEADER + (size_t)len) == 0);
    free(f);
    off += ENV_HEADER + (size_t)len;
    if (s == ENV_BAD_FLAGS) break;
  }
  /* the trailer frame for a status and a message taken from the input */
  char *msg = malloc(n + 1);
  FUZZ_CHECK(msg != NULL);
  memcpy(msg, p, n);
  msg[n] = 0;
  size_t tl;
  uint8_t *t = env_grpc_web_trailer(data[0], data[0] & 2 ? msg : NULL, &tl);
  FUZZ_CHECK(t != NULL);
  uint8_t tf;
  uint32_t tlen;
  FUZZ_CHECK(env_next(t, tl, 0xffffffffu, ENV_TRAILER, &tf, &tlen) == ENV_MSG);
  FUZZ_CHECK(tf == ENV_TRAILER && ENV_HEADER + (size_t)tlen == tl);
  FUZZ_CHECK(tlen >= 16 && memcmp(t + ENV_HEADER, "grpc-status: ", 13) == 0);
  FUZZ_CHECK(memcmp(t + tl - 2, "\r\n", 2) == 0);
  free(t);
  free(msg);
  return 0;
}
