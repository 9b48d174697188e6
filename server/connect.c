/* connect — see connect.h.  One rpc_call per exchange; its lifecycle is
 * one call_state (callstate.h), changed only by connect__step; its request
 * input is connect_in.c's. */
#include "server/connect.h"

#include "server/connect_int.h"
#include "server/rpcstats.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "server/auth.h"
#include "core/daemon.h"
#include "core/log.h"
#include "server/rpcerr.h"
#include "server/tokhold.h"
#include "proto/envelope.h"
#include "proto/gzip.h"
#include "proto/pbjson.h"


/* Client streaming and bidi: messages go to on_message as they arrive. */

static const char *ct_for(const rpc_call *c) {
  switch (c->w) {
    case W_CONNECT_UNARY: return c->json ? "application/json" : "application/proto";
    case W_CONNECT_STREAM: return c->json ? "application/connect+json" : "application/connect+proto";
    case W_GRPC: return c->json ? "application/grpc+json" : "application/grpc";
    case W_GRPC_WEB: return c->json ? "application/grpc-web+json" : "application/grpc-web+proto";
  }
  return "application/proto";
}

/* ---------------------------------------------------------------- lifetime */

/* The one place the state changes (callstate.h asserts it is legal). */
void connect__step(rpc_call *c, call_event ev) {
  call_state from = c->state;
  if (call_state_step(&c->state, ev) == 0)
    LOG_DEBUG("rpc %s %s: %s -> %s", c->m->path, call_event_name(ev), call_state_name(from),
              call_state_name(c->state));
}

static void call_closed(uv_handle_t *h) {
  rpc_call *c = h->data;
  if (--c->handles == 0) {
    budget_unwait(&c->bw);
    tokhold_drop(&c->tok);
    conch.held -= c->breserved;
    free(c->in);
    conch.rx_buffered -= c->in_cap + c->big.len;
    conch.held -= c->in_cap + c->big.len;
    free(c->big.data);
    bufref_owner_free(c->unary_owner);
    if (c->req) protobuf_c_message_free_unpacked(c->req, NULL);
    free(c->end_msg);
    rpc_ident_release(c->ident);
    free(c);
  }
}

/* ENDED → CLOSING once no pool job (a decode, a deflate) holds the call:
 * then neither the service, the transport nor the pool can reach it. */
void connect__maybe_free(rpc_call *c) {
  if (c->state != CALL_ENDED || c->decode || c->gzq.jobs) return;
  users_cancel(&c->uw);
  connect__step(c, CALL_EV_CLOSE);
  uv_close((uv_handle_t *)&c->deadline, call_closed);
  uv_close((uv_handle_t *)&c->soon, call_closed);
}

/* ---------------------------------------------------------------- output */

static void start_stream(rpc_call *c, hx *x) {
  if (c->out == OUT_STARTED) return;
  call_output_step(&c->out, OUT_STARTED);
  hx_header h[3] = {{"content-type", ct_for(c)}, {NULL, NULL}, {NULL, NULL}};
  size_t n = 1;
  if (c->w == W_GRPC || c->w == W_GRPC_WEB) h[n++] = (hx_header){"grpc-accept-encoding", "gzip"};
  if (c->gzip_out) /* messages of GZQ_MIN bytes and more carry the compressed flag */
    h[n++] = (hx_header){c->w == W_CONNECT_STREAM ? "connect-content-encoding" : "grpc-encoding", "gzip"};
  hx_respond(x, 200, h, n, -1);
}

/* Write the final answer and let go of the exchange (c->x is live). */
static void call_render_end(rpc_call *c, rpc_code code, const char *msg) {
  hx *x = c->x;
  c->x = NULL;
  if (c->w == W_CONNECT_UNARY) {
    if (code == RPC_OK) {
      hx_header h[2] = {{"content-type", ct_for(c)}, {"content-encoding", "gzip"}};
      if (c->out == OUT_NONE) { /* no message sent: the empty message */
        bufref_owner_free(c->unary_owner);
        c->unary_owner = c->unary_out = NULL;
        c->unary_off = c->unary_len = 0;
        if (c->json) {
          c->unary_owner = c->unary_out = (uint8_t *)strdup("{}");
          c->unary_len = 2;
        }
      }
      hx_respond(x, 200, h, c->out == OUT_UNARY_GZ ? 2 : 1, (int64_t)c->unary_len);
      if (c->unary_len) hx_write_owned(x, c->unary_owner, c->unary_out + c->unary_off, c->unary_len);
      else bufref_owner_free(c->unary_owner);
      c->unary_owner = c->unary_out = NULL;
      hx_end(x, NULL, 0);
    } else {
      char *body = error_json(code, msg, 0);
      hx_simple(x, rpc_code_http_status(code), "application/json", body ? body : "{}", NULL, 0);
      free(body);
    }
    return;
  }
  if (c->w == W_CONNECT_STREAM) {
    start_stream(c, x);
    char *body = code == RPC_OK ? strdup("{}") : error_json(code, msg, 1);
    size_t bl = body ? strlen(body) : 0;
    uint8_t *env = env_frame(ENV_END_STREAM, body, bl);
    if (env) hx_write(x, env, 5 + bl);
    free(body);
    hx_end(x, NULL, 0);
    return;
  }
  /* gRPC / gRPC-Web: status in trailers */
  char st[8];
  snprintf(st, sizeof st, "%d", (int)code);
  char *pm = grpc_pct(msg ? msg : "");
  hx_header tr[2] = {{"grpc-status", st}, {"grpc-message", pm ? pm : ""}};
  size_t ntr = (msg && *msg) ? 2 : 1;
  if (c->w == W_GRPC) {
    if (c->out != OUT_STARTED) { /* trailers-only response */
      hx_header h[3] = {{"content-type", ct_for(c)}, tr[0], tr[1]};
      call_output_step(&c->out, OUT_STARTED);
      hx_respond(x, 200, h, 1 + ntr, -1);
      hx_end(x, NULL, 0);
    } else {
      hx_end(x, tr, ntr);
    }
  } else {
    start_stream(c, x);
    size_t el;
    uint8_t *env = env_grpc_web_trailer((int)code, ntr == 2 ? pm : NULL, &el);
    if (env) hx_write(x, env, el);
    hx_end(x, NULL, 0);
  }
  free(pm);
}

static void gz_unary(rpc_call *c);

/* The end: answered now (→ ENDED), or, with deflates ahead of it, kept
 * until they have left (→ FLUSHING).  With no exchange left there is
 * nobody to answer: ENDED. */
/* The call's end for /metrics, once. */
static void call_count(rpc_call *c, rpc_code code) {
  if (c->t_start) rpcstats_end(c->m, code, uv_hrtime() - c->t_start);
  c->t_start = 0;
}

static void call_end(rpc_call *c, rpc_code code, const char *msg) {
  call_count(c, code);
  if (c->x && c->w == W_CONNECT_UNARY && code == RPC_OK) gz_unary(c);
  if (c->x && gzq_busy(&c->gzq)) {
    connect__step(c, CALL_EV_FLUSH);
    c->end_code = code;
    c->end_msg = msg ? strdup(msg) : NULL;
    return;
  }
  connect__step(c, CALL_EV_END);
  if (c->x) call_render_end(c, code, msg);
}

/* SERVING → CANCELLING, the service's on_cancel, then CANCELLING (the
 * caller ends the call) or HELD (on_cancel called rpc_defer_end). */
static void call_cancel(rpc_call *c, rpc_code why) {
  connect__step(c, CALL_EV_CANCEL);
  if (c->m->on_cancel) c->m->on_cancel(c, why);
  if (c->state == CALL_CANCEL_HELD) connect__step(c, CALL_EV_HOLD);
}

/* The layer ends the call with an error: cancel the service, answer. */
void connect__fail(rpc_call *c, rpc_code code, const char *msg) {
  if (call_over(c)) return;
  uv_timer_stop(&c->deadline);
  if (call_serving(c)) call_cancel(c, code);
  LOG_DEBUG("rpc failed path=%s code=%s msg=%s", c->m->path, rpc_code_name(code), msg);
  if (c->state == CALL_HELD) { /* the service finishes its cleanup first */
    c->end_code = code;
    c->end_msg = msg ? strdup(msg) : NULL;
    return;
  }
  call_end(c, code, msg);
  connect__maybe_free(c);
}

/* tokhold: the token this stream authenticated with was replaced (api.md §4). */
static void call_token_replaced(tokhold *t) {
  connect__fail((rpc_call *)((char *)t - offsetof(rpc_call, tok)), RPC_UNAUTHENTICATED, "agent token was replaced");
}

/* ---- an upgrade's drain ---- */

static int call_drain_ends(const tokhold *t) {
  const rpc_call *c = (const rpc_call *)((const char *)t - offsetof(rpc_call, tok));
  return t->revoke == call_token_replaced && (c->m->flags & RPC_F_DRAIN_END);
}

static void call_drain_end(tokhold *t) {
  connect__fail((rpc_call *)((char *)t - offsetof(rpc_call, tok)), RPC_UNAVAILABLE, RPC_DRAIN_MSG);
}

size_t connect_drain(void) {
  size_t n = tokhold_each_out(call_drain_ends, call_drain_end);
  if (n) LOG_INFO("upgrade: %zu streams ended (%s)", n, RPC_DRAIN_MSG);
  return n;
}

void rpc_defer_end(rpc_call *c) {
  if (c->state == CALL_CANCELLING) connect__step(c, CALL_EV_DEFER);
}

void rpc_end_deferred(rpc_call *c) {
  if (c->state == CALL_CANCEL_HELD) { /* still inside on_cancel: its caller answers as usual */
    connect__step(c, CALL_EV_UNDEFER);
    return;
  }
  if (c->state != CALL_HELD) return;
  char *m = c->end_msg;
  c->end_msg = NULL;
  call_end(c, c->end_code, m);
  free(m);
  connect__maybe_free(c);
}

uint8_t *rpc_encode(int json, const ProtobufCMessage *msg, size_t *len) {
  if (json) return (uint8_t *)pbjson_encode_fixed(msg, RPC_HEADROOM, NULL, 0, len);
  size_t n = protobuf_c_message_get_packed_size(msg);
  *len = n;
  if (n > RPC_MAX_MESSAGE) return malloc(RPC_HEADROOM); /* not worth packing: refused anyway */
  uint8_t *buf = malloc(RPC_HEADROOM + n + 1);
  if (buf) protobuf_c_message_pack(msg, buf + RPC_HEADROOM);
  return buf;
}

/* ---------------------------------------------------------------- response compression */

/* The queue (gzq.h) writes each message in order; the exchange gone, it
 * is dropped. */
static void call_gz_write(gzq *q, void *owner, uint8_t *frame, size_t len, const uint8_t *tail,
                          size_t tail_len, bufref *tail_ref) {
  rpc_call *c = (rpc_call *)((char *)q - offsetof(rpc_call, gzq));
  if (!c->x) {
    bufref_owner_free(owner);
    if (tail_ref) tail_ref->release(tail_ref);
    return;
  }
  start_stream(c, c->x);
  if (tail_ref) hx_write_pair(c->x, owner, (size_t)(frame - (uint8_t *)owner), len, tail, tail_len, tail_ref);
  else hx_write_owned(c->x, owner, frame, len);
}

static void call_gz_unary(gzq *q, uint8_t *z, size_t zl) {
  rpc_call *c = (rpc_call *)((char *)q - offsetof(rpc_call, gzq));
  if (!c->x) {
    free(z);
    return;
  }
  bufref_owner_free(c->unary_owner);
  c->unary_owner = c->unary_out = z;
  c->unary_off = 0;
  c->unary_len = zl;
  call_output_step(&c->out, OUT_UNARY_GZ);
}

static void call_on_soon(uv_timer_t *t);

/* Nothing queued or deflating: a FLUSHING end goes now; a waiting
 * producer is asked again (the transport may have no drain of its own to
 * report). */
static void call_gz_settled(gzq *q) {
  rpc_call *c = (rpc_call *)((char *)q - offsetof(rpc_call, gzq));
  if (c->state == CALL_FLUSHING) {
    char *m = c->end_msg;
    c->end_msg = NULL;
    connect__step(c, CALL_EV_END);
    if (c->x) call_render_end(c, c->end_code, m);
    free(m);
  } else if (call_serving(c) && (c->drain_cb || c->room_cb)) {
    uv_timer_start(&c->soon, call_on_soon, 0, 0);
  }
  connect__maybe_free(c);
}

static const gzq_ops call_gz_ops = {call_gz_write, call_gz_unary, call_gz_settled};

/* The unary answer, when it should be compressed (once). */
static void gz_unary(rpc_call *c) {
  if (!c->gzip_out || c->out != OUT_UNARY || c->unary_len < GZQ_MIN || bufref_owner_is_ref(c->unary_owner))
    return;
  call_output_step(&c->out, OUT_UNARY_GZ_TRIED);
  gzq_unary(&c->gzq, c->unary_out + c->unary_off, c->unary_len);
}

/* The one send path: len bytes at data in the call's codec, RPC_HEADROOM
 * writable bytes in front (the envelope header goes there); owner (bufref.h)
 * is released once written or on failure.  A tail (tail_ref) follows the
 * bytes in the same message (streaming only). */
int rpc_send_bytes_tail(rpc_call *c, void *owner, uint8_t *data, size_t len, const uint8_t *tail,
                        size_t tail_len, bufref *tail_ref) {
  conch.held -= c->breserved; /* the room it asked for is now these bytes */
  c->breserved = 0;
  if (!data || call_over(c) || !c->x || len > RPC_MAX_MESSAGE ||
      tail_len > RPC_MAX_MESSAGE - len || (tail_ref && (c->w == W_CONNECT_UNARY || c->json))) {
    bufref_owner_free(owner);
    if (tail_ref) tail_ref->release(tail_ref);
    return -1;
  }
  if (c->w == W_CONNECT_UNARY) {
    bufref_owner_free(c->unary_owner);
    c->unary_owner = owner;
    c->unary_out = data;
    c->unary_off = 0;
    c->unary_len = len;
    call_output_step(&c->out, OUT_UNARY);
    return 0;
  }
  int rc;
  if (!tail_ref) {
    if (gzq_send(&c->gzq, c->gzip_out, owner, data, len, &rc)) return rc;
    env_put_header(data - RPC_HEADROOM, 0, len);
    start_stream(c, c->x);
    return hx_write_owned(c->x, owner, data - RPC_HEADROOM, len + RPC_HEADROOM);
  }
  /* hx_write_pair takes a malloc'd head (the message at head + off): a
   * bufref-held one is copied (the few bytes of framing and field tags in
   * front of the tail) */
  uint8_t *head = owner;
  size_t off = (size_t)(data - head);
  if (bufref_owner_is_ref(owner)) {
    head = malloc(len + RPC_HEADROOM);
    if (head) memcpy(head + RPC_HEADROOM, data, len);
    off = RPC_HEADROOM;
    bufref_owner_free(owner);
    if (!head) {
      tail_ref->release(tail_ref);
      return -1;
    }
  }
  if (gzq_send_pair(&c->gzq, head, off, len, tail, tail_len, tail_ref, &rc)) return rc;
  env_put_header(head + off - RPC_HEADROOM, 0, len + tail_len);
  start_stream(c, c->x);
  return hx_write_pair(c->x, head, off - RPC_HEADROOM, len + RPC_HEADROOM, tail, tail_len, tail_ref);
}

int rpc_send_bytes(rpc_call *c, void *owner, uint8_t *data, size_t len) {
  return rpc_send_bytes_tail(c, owner, data, len, NULL, 0, NULL);
}

int rpc_send(rpc_call *c, const ProtobufCMessage *msg) {
  if (call_over(c) || !c->x) return -1;
  size_t len;
  uint8_t *buf = rpc_encode(c->json, msg, &len);
  return rpc_send_bytes(c, buf, buf ? buf + RPC_HEADROOM : NULL, len);
}

int rpc_is_json(const rpc_call *c) { return c->json != 0; }

int rpc_compresses(const rpc_call *c) { return c->gzip_out != 0; }

void rpc_finish(rpc_call *c, rpc_code code, const char *message) {
  if (!call_serving(c)) return; /* cancelled meanwhile: on_cancel was the end */
  uv_timer_stop(&c->deadline);
  if (code != RPC_OK)
    LOG_DEBUG("rpc error path=%s code=%s msg=%s", c->m->path, rpc_code_name(code),
              message ? message : "");
  call_end(c, code, message);
  connect__maybe_free(c);
}

void rpc_finishf(rpc_call *c, rpc_code code, const char *fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  rpc_finish(c, code, buf);
}

size_t rpc_outq_bytes(const rpc_call *c) { return c->x ? hx_outq(c->x) + c->gzq.bytes : 0; }

/* The budget FIFO (budget.h) says room may be there: ask rpc_out_room
 * again through the producer (the transport's own bounds next). */
static void call_budget_wake(budget_waiter *w) {
  rpc_call *c = (rpc_call *)((char *)w - offsetof(rpc_call, bw));
  if (!call_serving(c) || !c->room_cb) return;
  void (*rcb)(rpc_call *) = c->room_cb;
  c->room_cb = NULL;
  rcb(c);
}

int rpc_out_room(rpc_call *c, size_t n, void (*cb)(rpc_call *c)) {
  if (call_over(c) || !c->x) return 1; /* the send will say */
  if (budget_waiting(&c->bw) || conch.held + n > budget_out_limit()) { /* behind those already waiting */
    c->room_cb = cb;
    budget_wait(&c->bw, n);
    return 0;
  }
  if (!gzq_busy(&c->gzq) && hx_room(c->x, n)) {
    c->room_cb = NULL;
    conch.held += n - c->breserved;
    c->breserved = n;
    return 1;
  }
  c->room_cb = cb;
  return 0;
}


/* Deferred work of a call: resumed input, a drain callback due. */
static void call_on_soon(uv_timer_t *t) {
  rpc_call *c = t->data;
  if (call_over(c)) return;
  if (!c->in_paused && c->w != W_CONNECT_UNARY &&
      (c->in_len >= 5 || c->input == IN_ENDED))
    connect__pump(c);
  if (c->room_cb && !gzq_busy(&c->gzq) && call_serving(c)) { /* the queue settled: ask again */
    void (*rcb)(rpc_call *) = c->room_cb;
    c->room_cb = NULL;
    rcb(c);
    return;
  }
  void (*cb)(rpc_call *) = c->drain_cb;
  if (!call_serving(c) || !cb) return;
  if (rpc_outq_bytes(c) > RPC_OUTQ_HIGH / 2) return; /* the transport's drain will call */
  c->drain_cb = NULL;
  cb(c);
}

void rpc_on_drain(rpc_call *c, void (*cb)(rpc_call *c)) {
  c->drain_cb = cb;
  if (cb && rpc_outq_bytes(c) <= RPC_OUTQ_HIGH / 2) uv_timer_start(&c->soon, call_on_soon, 0, 0);
}

void rpc_set_user(rpc_call *c, void *user) { c->user = user; }
void *rpc_user(const rpc_call *c) { return c->user; }
int64_t rpc_timeout_ms(const rpc_call *c) { return c->timeout_ms; }
int rpc_input_had_nul(const rpc_call *c) { return c->had_nul; }
const rpc_ident *rpc_ident_of(const rpc_call *c) { return c->ident ? c->ident : &users_root; }

const char *rpc_protocol_name(const rpc_call *c) {
  static const char *const names[][2] = {{"connect+proto", "connect+json"},
                                         {"connect-stream+proto", "connect-stream+json"},
                                         {"grpc+proto", "grpc+json"},
                                         {"grpc-web+proto", "grpc-web+json"}};
  return names[c->w][c->json ? 1 : 0];
}

/* The peer is gone (reset, disconnect, shutdown): nobody is left to
 * answer.  A held end still waits for rpc_end_deferred, and a call inside
 * on_cancel is ended by its caller. */
static void on_abort(hx *x) {
  rpc_call *c = x->hdata;
  c->x = NULL;
  call_count(c, RPC_CANCELED);
  switch (c->state) {
    case CALL_READING:
      uv_timer_stop(&c->deadline);
      connect__step(c, CALL_EV_END);
      break;
    case CALL_SERVING:
      uv_timer_stop(&c->deadline);
      call_cancel(c, RPC_CANCELED);
      if (c->state == CALL_CANCELLING) connect__step(c, CALL_EV_END);
      break;
    case CALL_FLUSHING: /* the queue drops what is left */
      free(c->end_msg);
      c->end_msg = NULL;
      connect__step(c, CALL_EV_END);
      break;
    default:
      break;
  }
  connect__maybe_free(c);
}

static void on_drain(hx *x) {
  rpc_call *c = x->hdata;
  if (call_serving(c) && c->room_cb) { /* may end the call: nothing after it */
    void (*rcb)(rpc_call *) = c->room_cb;
    c->room_cb = NULL;
    rcb(c);
    return;
  }
  if (!call_serving(c) || !c->drain_cb) return;
  if (rpc_outq_bytes(c) > RPC_OUTQ_HIGH / 2) return;
  void (*cb)(rpc_call *) = c->drain_cb;
  c->drain_cb = NULL;
  cb(c);
}

static const hx_handler call_handler = {connect__on_body, connect__on_body_end, on_abort, on_drain, connect__on_body_into};

void rpc_waiting(rpc_call *c) {
  if (c->x) hx_waiting(c->x);
}

void rpc_bulk(rpc_call *c) {
  if (c->x) hx_bulk(c->x);
}

void rpc_pause_input(rpc_call *c, int paused) {
  if (call_over(c) || c->in_paused == paused) return;
  c->in_paused = paused;
  if (c->x) hx_pause_body(c->x, paused);
  if (!paused) uv_timer_start(&c->soon, call_on_soon, 0, 0);
}

static void on_deadline(uv_timer_t *t) {
  rpc_call *c = t->data;
  connect__fail(c, RPC_DEADLINE_EXCEEDED, "the operation timed out");
}

/* ---------------------------------------------------------------- entry */

static void call_checks_rest(rpc_call *c);

static void call_user_error(rpc_call *c, users_status st, const char *spec) {
  char e[300];
  if (st == USERS_ERROR) { /* the files could not be read: try again later */
    connect__fail(c, RPC_UNAVAILABLE, "cannot read the user database");
    return;
  }
  if (st == USERS_UNKNOWN) snprintf(e, sizeof e, "unknown user: %.256s", spec);
  else snprintf(e, sizeof e, "invalid user: %.256s", spec);
  connect__fail(c, RPC_INVALID_ARGUMENT, e);
}

/* users.h: the files were read; what arrived meanwhile goes on now. */
static void call_user_resolved(users_wait *w, users_status st, const rpc_ident *id) {
  rpc_call *c = (rpc_call *)((char *)w - offsetof(rpc_call, uw));
  if (c->x && !c->in_paused) hx_pause_body(c->x, 0);
  if (st != USERS_OK) {
    call_user_error(c, st, w->spec);
    return;
  }
  c->ident = id;
  call_checks_rest(c);
  if (call_over(c)) return;
  if (c->w == W_CONNECT_UNARY) {
    if (c->input == IN_ENDED) connect__unary_body_end(c);
  } else if (c->in_len >= 5 || c->input == IN_ENDED) {
    connect__pump(c);
  }
}

static int parse_connect_timeout(const char *v, int64_t *ms) {
  size_t n = strlen(v);
  if (n == 0 || n > 10) return -1;
  int64_t r = 0;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    r = r * 10 + (v[i] - '0');
  }
  *ms = r;
  return 0;
}

static int parse_grpc_timeout(const char *v, int64_t *ms) {
  size_t n = strlen(v);
  if (n < 2 || n > 9) return -1;
  int64_t r = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    if (v[i] < '0' || v[i] > '9') return -1;
    r = r * 10 + (v[i] - '0');
  }
  switch (v[n - 1]) {
    case 'H': r *= 3600000; break;
    case 'M': r *= 60000; break;
    case 'S': r *= 1000; break;
    case 'm': break;
    case 'u': r = (r + 999) / 1000; break;
    case 'n': r = (r + 999999) / 1000000; break;
    default: return -1;
  }
  *ms = r;
  return 0;
}

/* "application/json; charset=utf-8" → media type in lower case. */
static void media_type(const char *ct, char *out, size_t cap) {
  size_t i = 0;
  while (*ct == ' ') ct++;
  for (; *ct && *ct != ';' && *ct != ' ' && i + 1 < cap; ct++)
    out[i++] = (char)((*ct >= 'A' && *ct <= 'Z') ? *ct + 32 : *ct);
  out[i] = 0;
}

void connect_serve(hx *x, const rpc_method *m) {
  if (m->kind == RPC_BIDI_STREAM && !x->http2) {
    /* as connect-go and connect-es answer, before any other check: a client
     * that expects full duplex would hang on HTTP/1.1, the close frees it */
    hx_header close = {"connection", "close"};
    hx_simple(x, 505, "text/plain; charset=utf-8", "505 bidi streams require HTTP/2\n", &close, 1);
    return;
  }
  if (strcmp(x->method, "POST") != 0) {
    hx_header allow = {"allow", "POST"};
    hx_simple(x, 405, "text/plain; charset=utf-8", "405 method not allowed\n", &allow, 1);
    return;
  }
  char mt[96];
  const char *ct = hx_get(x, "content-type");
  media_type(ct ? ct : "", mt, sizeof mt);
  wire w;
  int json;
  if (!strcmp(mt, "application/json")) w = W_CONNECT_UNARY, json = 1;
  else if (!strcmp(mt, "application/proto")) w = W_CONNECT_UNARY, json = 0;
  else if (!strcmp(mt, "application/connect+json")) w = W_CONNECT_STREAM, json = 1;
  else if (!strcmp(mt, "application/connect+proto")) w = W_CONNECT_STREAM, json = 0;
  else if (!strcmp(mt, "application/grpc") || !strcmp(mt, "application/grpc+proto")) w = W_GRPC, json = 0;
  else if (!strcmp(mt, "application/grpc+json")) w = W_GRPC, json = 1;
  else if (!strcmp(mt, "application/grpc-web") || !strcmp(mt, "application/grpc-web+proto")) w = W_GRPC_WEB, json = 0;
  else if (!strcmp(mt, "application/grpc-web+json")) w = W_GRPC_WEB, json = 1;
  else {
    hx_simple(x, 415, "text/plain; charset=utf-8", "415 unsupported media type\n", NULL, 0);
    return;
  }
  if ((w == W_CONNECT_UNARY) != (m->kind == RPC_UNARY) && w != W_GRPC && w != W_GRPC_WEB) {
    hx_simple(x, 415, "text/plain; charset=utf-8", "415 unsupported media type\n", NULL, 0);
    return;
  }
  if (w == W_GRPC && !x->http2) {
    hx_simple(x, 415, "text/plain; charset=utf-8", "gRPC requires HTTP/2\n", NULL, 0);
    return;
  }
  rpc_call *c = calloc(1, sizeof *c);
  if (!c) {
    hx_simple(x, 503, "text/plain", "out of memory\n", NULL, 0);
    return;
  }
  c->x = x;
  c->m = m;
  c->t_start = uv_hrtime();
  c->w = w;
  c->json = json;
  c->state = CALL_READING;
  gzq_init(&c->gzq, conch.loop, &call_gz_ops);
  c->bw.wake = call_budget_wake;
  uv_timer_init(conch.loop, &c->deadline);
  uv_timer_init(conch.loop, &c->soon);
  c->deadline.data = c->soon.data = c;
  c->handles = 2;
  hx_set_handler(x, &call_handler, c);

  /* Connect-Protocol-Version */
  const char *pv = hx_get(x, "connect-protocol-version");
  if (w == W_CONNECT_UNARY && !pv) {
    connect__fail(c, RPC_INVALID_ARGUMENT, "missing required header: set Connect-Protocol-Version to \"1\"");
    return;
  }
  if ((w == W_CONNECT_UNARY || w == W_CONNECT_STREAM) && pv && strcmp(pv, "1") != 0) {
    char e[300];
    snprintf(e, sizeof e, "Connect-Protocol-Version must be \"1\": got \"%.200s\"", pv);
    connect__fail(c, RPC_INVALID_ARGUMENT, e);
    return;
  }
  /* auth */
  const char *amsg;
  if (auth_check_hx(x, &amsg) != RPC_OK) {
    connect__fail(c, RPC_UNAUTHENTICATED, amsg);
    return;
  }
  hx_authed(x); /* the connection's output is no longer held to CONN_UNAUTH_OUTQ */
  if (m->kind != RPC_UNARY || (m->flags & RPC_F_HOLDS_TOKEN)) /* a unary call finishes */
    tokhold_take(&c->tok, call_token_replaced);
  /* the user, right after authentication (api.md §9) */
  const char *uspec = hx_get(x, "conch-init-user");
  if (!uspec && conch.default_user[0]) uspec = conch.default_user;
  if (uspec) {
    c->uw.done = call_user_resolved;
    const rpc_ident *id = NULL;
    users_status st = users_resolve(uspec, &id, &c->uw);
    if (st == USERS_OK) c->ident = id;
    if (st == USERS_PENDING) { /* the files are read in the pool: the rest then */
      hx_pause_body(x, 1);
      return;
    }
    if (st != USERS_OK) {
      call_user_error(c, st, uspec);
      return;
    }
  }
  call_checks_rest(c);
}

/* The checks after the user's: timeout, encodings, size; then the call
 * runs (the deadline, and a stream's service at once). */
static void call_checks_rest(rpc_call *c) {
  hx *x = c->x;
  wire w = c->w;
  const rpc_method *m = c->m;
  /* timeout */
  const char *tv = (w == W_GRPC || w == W_GRPC_WEB) ? hx_get(x, "grpc-timeout")
                                                    : hx_get(x, "connect-timeout-ms");
  if (tv) {
    int bad = (w == W_GRPC || w == W_GRPC_WEB) ? parse_grpc_timeout(tv, &c->timeout_ms)
                                               : parse_connect_timeout(tv, &c->timeout_ms);
    if (bad) {
      char e[300];
      snprintf(e, sizeof e, "protocol error: invalid timeout %.200s", tv);
      connect__fail(c, RPC_INVALID_ARGUMENT, e);
      return;
    }
  }
  /* compression */
  const char *enc = w == W_CONNECT_UNARY ? hx_get(x, "content-encoding")
                    : w == W_CONNECT_STREAM ? hx_get(x, "connect-content-encoding")
                                            : hx_get(x, "grpc-encoding");
  if (enc && strcasecmp(enc, "identity") != 0) {
    if (strcasecmp(enc, "gzip") == 0) {
      c->gzip_in = 1;
    } else {
      char e[300];
      snprintf(e, sizeof e, "unknown compression \"%.100s\": supported encodings are gzip", enc);
      connect__fail(c, RPC_UNIMPLEMENTED, e);
      return;
    }
  }
  c->gzip_out = gz_accepted(w == W_CONNECT_UNARY    ? hx_get(x, "accept-encoding")
                            : w == W_CONNECT_STREAM ? hx_get(x, "connect-accept-encoding")
                                                    : hx_get(x, "grpc-accept-encoding"));
  if (w == W_CONNECT_UNARY && x->content_length > (int64_t)RPC_MAX_MESSAGE) {
    connect__fail(c, RPC_RESOURCE_EXHAUSTED, "message is larger than configured max 16777216 bytes");
    return;
  }
  if (c->timeout_ms > 0 && !(m->flags & RPC_F_OWN_DEADLINE))
    uv_timer_start(&c->deadline, on_deadline, (uint64_t)c->timeout_ms, 0);
  if (streams_in(m)) connect__start_service(c, NULL, NULL);
}
