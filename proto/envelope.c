/* envelope — see envelope.h. */
#include "proto/envelope.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void env_put_header(uint8_t *h, uint8_t flags, size_t len) {
  h[0] = flags;
  h[1] = (uint8_t)(len >> 24);
  h[2] = (uint8_t)(len >> 16);
  h[3] = (uint8_t)(len >> 8);
  h[4] = (uint8_t)len;
}

env_status env_next(const uint8_t *p, size_t n, uint32_t max, uint8_t allowed, uint8_t *flags,
                    uint32_t *len) {
  if (n < ENV_HEADER) return ENV_NEED;
  uint32_t l = (uint32_t)p[1] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 8 | p[4];
  *len = l;
  if (l > max) return ENV_TOO_BIG;
  if (n - ENV_HEADER < (size_t)l) return ENV_NEED;
  *flags = p[0];
  return p[0] & ~allowed ? ENV_BAD_FLAGS : ENV_MSG;
}

uint8_t *env_frame(uint8_t flags, const void *body, size_t n) {
  uint8_t *env = malloc(ENV_HEADER + n);
  if (!env) return NULL;
  env_put_header(env, flags, n);
  if (n) memcpy(env + ENV_HEADER, body, n);
  return env;
}

uint8_t *env_grpc_web_trailer(int status, const char *msg, size_t *len) {
  size_t cap = ENV_HEADER + 32 + (msg ? strlen(msg) + 18 : 0);
  uint8_t *env = malloc(cap);
  if (!env) return NULL;
  int n = msg ? snprintf((char *)env + ENV_HEADER, cap - ENV_HEADER,
                         "grpc-status: %d\r\ngrpc-message: %s\r\n", status, msg)
              : snprintf((char *)env + ENV_HEADER, cap - ENV_HEADER, "grpc-status: %d\r\n", status);
  env_put_header(env, ENV_TRAILER, (size_t)n);
  *len = ENV_HEADER + (size_t)n;
  return env;
}
