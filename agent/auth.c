/* auth — see auth.h. */
#include "agent/auth.h"

#include <string.h>

#include "agent/daemon.h"

int auth_equal(const char *given, size_t glen, const char *want, size_t wlen) {
  unsigned diff = (unsigned)(glen ^ wlen);
  for (size_t i = 0; i < glen; i++) {
    unsigned char w = wlen ? (unsigned char)want[i % wlen] : 0;
    diff |= (unsigned)((unsigned char)given[i] ^ w);
  }
  return diff == 0;
}

rpc_code auth_check(const char *v, const char **msg) {
  if (!conch.token_set) {
    *msg = "agent token is not initialized";
    return RPC_UNAUTHENTICATED;
  }
  if (!v || !*v) {
    *msg = "agent token is required";
    return RPC_UNAUTHENTICATED;
  }
  size_t len = strlen(v);
  if (len > CONCH_TOKEN_MAX || !auth_equal(v, len, conch.token, conch.token_len)) {
    *msg = "agent token is invalid";
    return RPC_UNAUTHENTICATED;
  }
  return RPC_OK;
}
