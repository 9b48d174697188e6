/* rpcerr — how an RPC status is rendered: the code table (Connect names,
 * HTTP statuses), the Connect JSON error body and gRPC's grpc-message
 * percent-encoding.  Pure functions (malloc'd strings), any thread. */
#include "server/rpcerr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/text.h"

/* ---------------------------------------------------------------- codes */

static const char *const code_names[] = {
    "ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found",
    "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
    "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss",
    "unauthenticated"};
static const int code_http[] = {200, 499, 500, 400, 504, 404, 409, 403, 429,
                                400, 409, 400, 501, 500, 503, 500, 401};

const char *rpc_code_name(rpc_code c) {
  return (unsigned)c < sizeof code_names / sizeof *code_names ? code_names[c] : "unknown";
}
int rpc_code_http_status(rpc_code c) {
  return (unsigned)c < sizeof code_http / sizeof *code_http ? code_http[c] : 500;
}

/* ---------------------------------------------------------------- small helpers */

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->len + n + 1) cap *= 2;
    char *q = realloc(b->p, cap);
    if (!q) return;
    b->p = q;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }

/* A JSON string of s, escaped as proto/text.h says (invalid UTF-8 — a file
 * name from disk, a cut message — becomes \ufffd: the document stays
 * valid JSON). */
static void sb_json_string(sbuf *b, const char *s) {
  size_t n = strlen(s);
  char *q = malloc(text_json_string(NULL, s, n));
  if (!q) return;
  sb_put(b, q, text_json_string(q, s, n));
  free(q);
}

/* {"code":"…","message":"…"} */
char *error_json(rpc_code code, const char *msg, int wrap) {
  sbuf b = {0};
  sb_str(&b, wrap ? "{\"error\":{\"code\":" : "{\"code\":");
  sb_json_string(&b, rpc_code_name(code));
  if (msg && *msg) {
    sb_str(&b, ",\"message\":");
    sb_json_string(&b, msg);
  }
  sb_str(&b, wrap ? "}}" : "}");
  return b.p;
}

/* grpc-message: percent-encode outside printable ASCII and '%'. */
char *grpc_pct(const char *s) {
  sbuf b = {0};
  sb_str(&b, "");
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p < 0x20 || *p > 0x7e || *p == '%') {
      char e[4];
      snprintf(e, sizeof e, "%%%02X", *p);
      sb_put(&b, e, 3);
    } else {
      sb_put(&b, (const char *)p, 1);
    }
  }
  return b.p;
}
