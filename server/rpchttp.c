/* rpchttp — the plain HTTP side of rpc.h (rpc_http_*): a service's route
 * over an hx, with the token or a signed URL, the user, the memory budget.
 *
 * The exchange's handler data is one rh from rpc_http_open until
 * rpc_http_end or the peer's abort; the service's callbacks are forwarded
 * from it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/budget.h"
#include "core/daemon.h"
#include "core/sha256.h"
#include "proto/text.h"
#include "server/auth.h"
#include "core/log.h"
#include "server/hx.h"
#include "server/sink.h"
#include "server/rpc.h"
#include "server/users.h"

typedef struct rh {
  hx *x;
  const rpc_http_handler *h;
  void *data;
  const rpc_ident *id; /* a hold once admitted, or NULL (root) */
  users_wait uw;
  void (*ready)(rpc_http *r, rpc_code code, const char *msg);
  budget_waiter bw;
  size_t breserved; /* counted in conch.held by rpc_http_room until the next write */
  int room_wait;
} rh;

static rh *rh_of(const rpc_http *r) { return r->hdata; }

static void rh_free(rh *s) {
  users_cancel(&s->uw);
  budget_unwait(&s->bw);
  conch.held -= s->breserved;
  rpc_ident_release(s->id);
  free(s);
}

static void rh_on_body(hx *x, const uint8_t *d, size_t n) {
  rh *s = x->hdata;
  if (s->h->on_body) s->h->on_body(x, d, n);
}

static void rh_on_body_end(hx *x) {
  rh *s = x->hdata;
  if (s->h->on_body_end) s->h->on_body_end(x);
}

static void rh_on_abort(hx *x) {
  rh *s = x->hdata;
  if (s->h->on_abort) s->h->on_abort(x);
  rh_free(s);
}

static void rh_on_drain(hx *x) {
  rh *s = x->hdata;
  if (!s->room_wait) return;
  s->room_wait = 0;
  if (s->h->on_drain) s->h->on_drain(x);
}

static uint8_t *rh_body_into(hx *x, size_t *len) {
  rh *s = x->hdata;
  return s->h->body_into ? s->h->body_into(x, len) : NULL;
}

static const hx_handler rh_handler = {rh_on_body, rh_on_body_end, rh_on_abort, rh_on_drain, rh_body_into};

static void rh_budget_wake(budget_waiter *w) {
  rh *s = (rh *)((char *)w - offsetof(rh, bw));
  rh_on_drain(s->x);
}

int rpc_http_open(rpc_http *r, const rpc_http_handler *h, void *data) {
  rh *s = calloc(1, sizeof *s);
  if (!s) {
    hx_simple(r, 500, "text/plain; charset=utf-8", "out of memory\n", NULL, 0);
    return -1;
  }
  s->x = r;
  s->h = h;
  s->data = data;
  s->bw.wake = rh_budget_wake;
  hx_set_handler(r, &rh_handler, s);
  hx_pause_body(r, 1);
  return 0;
}

void *rpc_http_data(const rpc_http *r) { return rh_of(r)->data; }
const char *rpc_http_method(const rpc_http *r) { return r->method; }
const char *rpc_http_query(const rpc_http *r) { return r->query; }
const char *rpc_http_header(const rpc_http *r, const char *lname) { return hx_get(r, lname); }
int64_t rpc_http_content_length(const rpc_http *r) { return r->content_length; }
int rpc_http_is_h2(const rpc_http *r) { return r->http2; }
const rpc_ident *rpc_http_ident(const rpc_http *r) {
  const rh *s = rh_of(r);
  return s->id ? s->id : &users_root;
}

/* ---------------------------------------------------------------- admission */

/* base64url without padding of the HMAC of the signed text */
static void rh_signature(const char *method, const char *path, const char *user, const char *expires,
                         char out[44]) {
  size_t ml = strlen(method), pl = strlen(path), ul = strlen(user), el = strlen(expires);
  char *msg = malloc(ml + pl + ul + el + 3);
  uint8_t mac[SHA256_LEN];
  if (!msg) { /* an impossible signature: compares unequal */
    out[0] = 0;
    return;
  }
  char *p = msg;
  memcpy(p, method, ml), p += ml, *p++ = '\n';
  memcpy(p, path, pl), p += pl, *p++ = '\n';
  memcpy(p, user, ul), p += ul, *p++ = '\n';
  memcpy(p, expires, el), p += el;
  hmac_sha256(conch.token, conch.token_len, msg, (size_t)(p - msg), mac);
  free(msg);
  char b[48];
  size_t n = text_b64_encode(mac, sizeof mac, b);
  size_t k = 0;
  for (size_t i = 0; i < n && b[i] != '='; i++) out[k++] = b[i] == '+' ? '-' : b[i] == '/' ? '_' : b[i];
  out[k] = 0;
}

/* RPC_OK, or RPC_UNAUTHENTICATED with the spec's text */
static rpc_code rh_check_signed(const rpc_http_auth *a, const char *user, const char **msg) {
  if (!conch.token_set) {
    *msg = "agent token is not initialized";
    return RPC_UNAUTHENTICATED;
  }
  const char *e = a->expires ? a->expires : "";
  char *end = NULL;
  unsigned long long exp = *e >= '0' && *e <= '9' && strlen(e) <= 19 ? strtoull(e, &end, 10) : 0;
  char want[44];
  rh_signature(a->sign_method, a->path ? a->path : "", user, e, want);
  const char *sig = a->signature ? a->signature : "";
  int same = auth_equal(sig, strlen(sig), want, strlen(want));
  if (!end || *end || !same) {
    *msg = "signature mismatch";
    return RPC_UNAUTHENTICATED;
  }
  if ((unsigned long long)time(NULL) > exp) {
    *msg = "signature expired";
    return RPC_UNAUTHENTICATED;
  }
  return RPC_OK;
}

static void rh_user_done(users_wait *w, users_status st, const rpc_ident *id) {
  rh *s = (rh *)((char *)w - offsetof(rh, uw));
  char e[300];
  if (st == USERS_OK) {
    s->id = id;
    s->ready(s->x, RPC_OK, NULL);
    return;
  }
  if (st == USERS_ERROR) {
    s->ready(s->x, RPC_UNAVAILABLE, "cannot read the user database");
    return;
  }
  snprintf(e, sizeof e, "%s user: %.256s", st == USERS_UNKNOWN ? "unknown" : "invalid", w->spec);
  s->ready(s->x, RPC_INVALID_ARGUMENT, e);
}

void rpc_http_admit(rpc_http *r, const rpc_http_auth *a,
                    void (*ready)(rpc_http *r, rpc_code code, const char *msg)) {
  rh *s = rh_of(r);
  s->ready = ready;
  const char *user = a->user ? a->user : hx_get(r, "conch-init-user");
  const char *amsg;
  rpc_code code;
  if (!a->sign_method || hx_get(r, "conch-init-token"))
    code = auth_check_hx(r, &amsg);
  else
    code = rh_check_signed(a, user ? user : "", &amsg);
  if (code != RPC_OK) {
    ready(r, code, amsg);
    return;
  }
  hx_authed(r);
  if (!user && conch.default_user[0]) user = conch.default_user;
  if (!user) {
    ready(r, RPC_OK, NULL);
    return;
  }
  s->uw.done = rh_user_done;
  const rpc_ident *id = NULL;
  users_status st = users_resolve(user, &id, &s->uw);
  if (st == USERS_PENDING) return;
  snprintf(s->uw.spec, sizeof s->uw.spec, "%s", user);
  rh_user_done(&s->uw, st, id);
}

/* ---------------------------------------------------------------- answer */

int rpc_http_respond(rpc_http *r, int status, const rpc_http_hdr *h, size_t n, int64_t content_length) {
  hx_header hh[24];
  if (n > sizeof hh / sizeof hh[0]) return -1;
  for (size_t i = 0; i < n; i++) hh[i] = (hx_header){h[i].name, h[i].value, 0};
  return hx_respond(r, status, hh, n, content_length);
}

int rpc_http_write(rpc_http *r, void *owner, const uint8_t *data, size_t len) {
  rh *s = rh_of(r);
  conch.held -= s->breserved; /* the room asked for is now these bytes */
  s->breserved = 0;
  return hx_write_owned(r, owner, data, len);
}

int rpc_http_write_file(rpc_http *r, int fd, uint64_t off, uint64_t len) {
  rh *s = rh_of(r);
  int z = hx_write_file(r, fd, off, len);
  if (z == 0) s->room_wait = 1; /* its end comes as on_drain */
  return z;
}

int rpc_http_end(rpc_http *r) {
  rh *s = rh_of(r);
  int ret = hx_end(r, NULL, 0);
  rh_free(s);
  return ret;
}

void rpc_http_abort(rpc_http *r) {
  static const rpc_http_handler none;
  rh *s = rh_of(r);
  s->h = &none; /* its on_abort frees s alone */
  if (!r->ended && r->ops->reset && r->ops->reset(r) == 0) {
    LOG_WARN("an answer was cut short: its stream reset on connection %llu", (unsigned long long)r->sink->id);
    return;
  }
  LOG_WARN("an answer was cut short: closing connection %llu", (unsigned long long)r->sink->id);
  sink_close(r->sink);
}

int rpc_http_room(rpc_http *r, size_t n) {
  rh *s = rh_of(r);
  if (budget_waiting(&s->bw) || conch.held - s->breserved + n > budget_out_limit()) {
    s->room_wait = 1;
    budget_wait(&s->bw, n);
    return 0;
  }
  if (hx_room(r, n)) {
    s->room_wait = 0;
    conch.held += n - s->breserved;
    s->breserved = n;
    return 1;
  }
  s->room_wait = 1;
  return 0;
}

void rpc_http_pause_body(rpc_http *r, int paused) { hx_pause_body(r, paused); }
