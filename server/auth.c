/* auth — see auth.h. */
#include "server/auth.h"

#include <string.h>
#include <strings.h>

#include "core/daemon.h"

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

/* The last value of request header lname (NULL: none); *seen: how many
 * times it came. */
static const char *auth_header(const hx *x, const char *lname, size_t *seen) {
  size_t l = strlen(lname);
  const char *v = NULL;
  *seen = 0;
  for (size_t i = 0; i < x->nhdr; i++)
    if (x->hdr[i].nlen == l && memcmp(x->hdr[i].name, lname, l) == 0) {
      v = x->hdr[i].value;
      (*seen)++;
    }
  return v;
}

rpc_code auth_check_hx(const hx *x, const char **msg) {
  size_t seen;
  const char *v = auth_header(x, "conch-init-token", &seen);
  if (seen > 1 && conch.token_set) { /* never valid, whatever the copies say */
    *msg = "agent token is invalid";
    return RPC_UNAUTHENTICATED;
  }
  return auth_check(v, msg);
}

rpc_code auth_check_hx_bearer(const hx *x, const char **msg) {
  size_t seen;
  const char *v = auth_header(x, "authorization", &seen);
  if (!v || hx_get(x, "conch-init-token")) return auth_check_hx(x, msg);
  if (seen > 1 && conch.token_set) {
    *msg = "agent token is invalid";
    return RPC_UNAUTHENTICATED;
  }
  if (strncasecmp(v, "bearer ", 7) != 0) return auth_check(NULL, msg);
  v += 7;
  while (*v == ' ') v++;
  return auth_check(v, msg);
}
