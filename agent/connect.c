/* connect — see connect.h.  One rpc_call per exchange; its lifecycle is
 * one call_state (callstate.h), changed only by call_step. */
#include "agent/connect.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <uv.h>

#include "agent/auth.h"
#include "agent/budget.h"
#include "agent/callstate.h"
#include "agent/daemon.h"
#include "agent/gzq.h"
#include "agent/log.h"
#include "agent/rpcdecode.h"
#include "agent/rpcerr.h"
#include "agent/tokhold.h"
#include "proto/envelope.h"
#include "proto/gzip.h"
#include "proto/pbjson.h"
#include "proto/pbwire.h"

typedef enum wire { W_CONNECT_UNARY, W_CONNECT_STREAM, W_GRPC, W_GRPC_WEB } wire;

/* The request body, as the call has seen it. */
typedef enum call_input {
  IN_OPEN,      /* more may come */
  IN_ENDED,     /* the transport's body end: all of it is in c->in */
  IN_DELIVERED, /* its end went to the service (or failed the call) */
} call_input;

struct decode_job;

struct rpc_call {
  call_state state; /* changed only by call_step */
  hx *x;            /* the exchange; NULL once the answer is written or the peer is gone */
  const rpc_method *m;
  wire w;
  int json;
  int gzip_in;
  int64_t timeout_ms;
  uv_timer_t deadline, soon;
  int handles;
  /* input */
  uint8_t *in;
  size_t in_len, in_cap;
  size_t msgs_in;
  call_input input;
  int in_paused; /* the service's rpc_pause_input */
  /* the envelope at in[0]: where pbwire_find_big has walked; then (big.data)
   * its big bytes field, read into a block of its own (call_split) */
  pbwire_big scan;
  int scan_done; /* NONE: no big field in this envelope */
  struct {
    uint8_t *data;  /* malloc'd, len bytes; the message's once decoded */
    size_t len, got;
  } big; /* where it was in `in` (5 + scan.key) and the key and length dropped
            * (scan.val - scan.key) are the walk's */
  ProtobufCMessage *req; /* server streaming: the request until body end */
  int req_nul;
  struct decode_job *decode; /* a request decode in the pool (pool_decode): it holds the call */
  int req_taken;    /* rpc_take_request: the service frees the request */
  int req_takable;  /* inside on_request with a malloc-decoded request */
  ProtobufCMessage *msg_cur; /* inside on_message: the message, until taken */
  /* output */
  void *unary_owner; /* owner word (bufref.h) of the answer's bytes */
  uint8_t *unary_out;
  size_t unary_off, unary_len; /* the answer is unary_out[off, off+len) */
  int unary_set;
  int started; /* response head sent */
  /* the end, kept while HELD or FLUSHING */
  rpc_code end_code;
  char *end_msg;
  int had_nul;
  void (*drain_cb)(rpc_call *);
  void (*room_cb)(rpc_call *); /* rpc_out_room said no: ask again then */
  void *user;
  /* response compression (api.md §9) */
  int gzip_out;               /* the client accepts gzip answers */
  int unary_gz;               /* the unary answer: 1 compressed, -1 tried (out of memory) */
  gzq gzq;                    /* stream sends from the first pool deflate on, in order */
  budget_waiter bw; /* rpc_out_room refused for the daemon-wide budget: in its FIFO */
  size_t breserved; /* rpc_out_room granted this much: counted in conch.held until the next send */
  tokhold tok;      /* a stream: the token generation it authenticated with (tokhold.h) */
};

/* Client streaming and bidi: messages go to on_message as they arrive. */
static int streams_in(const rpc_method *m) {
  return m->kind == RPC_CLIENT_STREAM || m->kind == RPC_BIDI_STREAM;
}

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
static void call_step(rpc_call *c, call_event ev) {
  call_state from = c->state;
  if (call_state_step(&c->state, ev) == 0)
    LOG_DEBUG("rpc %s %s: %s -> %s", c->m->path, call_event_name(ev), call_state_name(from),
              call_state_name(c->state));
}

/* The service holds the call. */
static int call_serving(const rpc_call *c) { return c->state == CALL_SERVING; }

/* The end is decided: the service finished, was cancelled, or never ran. */
static int call_over(const rpc_call *c) { return c->state > CALL_SERVING; }

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
    free(c);
  }
}

/* ENDED → CLOSING once no pool job (a decode, a deflate) holds the call:
 * then neither the service, the transport nor the pool can reach it. */
static void call_maybe_free(rpc_call *c) {
  if (c->state != CALL_ENDED || c->decode || c->gzq.jobs) return;
  call_step(c, CALL_EV_CLOSE);
  uv_close((uv_handle_t *)&c->deadline, call_closed);
  uv_close((uv_handle_t *)&c->soon, call_closed);
}

/* ---------------------------------------------------------------- output */

static void start_stream(rpc_call *c, hx *x) {
  if (c->started) return;
  c->started = 1;
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
      if (!c->unary_set) { /* no message sent: the empty message */
        bufref_owner_free(c->unary_owner);
        c->unary_owner = c->unary_out = NULL;
        c->unary_off = c->unary_len = 0;
        if (c->json) {
          c->unary_owner = c->unary_out = (uint8_t *)strdup("{}");
          c->unary_len = 2;
        }
      }
      hx_respond(x, 200, h, c->unary_gz == 1 ? 2 : 1, (int64_t)c->unary_len);
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
    if (!c->started) { /* trailers-only response */
      hx_header h[3] = {{"content-type", ct_for(c)}, tr[0], tr[1]};
      c->started = 1;
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
static void call_end(rpc_call *c, rpc_code code, const char *msg) {
  if (c->x && c->w == W_CONNECT_UNARY && code == RPC_OK) gz_unary(c);
  if (c->x && gzq_busy(&c->gzq)) {
    call_step(c, CALL_EV_FLUSH);
    c->end_code = code;
    c->end_msg = msg ? strdup(msg) : NULL;
    return;
  }
  call_step(c, CALL_EV_END);
  if (c->x) call_render_end(c, code, msg);
}

/* SERVING → CANCELLING, the service's on_cancel, then CANCELLING (the
 * caller ends the call) or HELD (on_cancel called rpc_defer_end). */
static void call_cancel(rpc_call *c, rpc_code why) {
  call_step(c, CALL_EV_CANCEL);
  if (c->m->on_cancel) c->m->on_cancel(c, why);
  if (c->state == CALL_CANCEL_HELD) call_step(c, CALL_EV_HOLD);
}

/* The layer ends the call with an error: cancel the service, answer. */
static void call_fail(rpc_call *c, rpc_code code, const char *msg) {
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
  call_maybe_free(c);
}

/* tokhold: the token this stream authenticated with was replaced (api.md §4). */
static void call_token_replaced(tokhold *t) {
  call_fail((rpc_call *)((char *)t - offsetof(rpc_call, tok)), RPC_UNAUTHENTICATED, "agent token was replaced");
}

void rpc_defer_end(rpc_call *c) {
  if (c->state == CALL_CANCELLING) call_step(c, CALL_EV_DEFER);
}

void rpc_end_deferred(rpc_call *c) {
  if (c->state == CALL_CANCEL_HELD) { /* still inside on_cancel: its caller answers as usual */
    call_step(c, CALL_EV_UNDEFER);
    return;
  }
  if (c->state != CALL_HELD) return;
  char *m = c->end_msg;
  c->end_msg = NULL;
  call_end(c, c->end_code, m);
  free(m);
  call_maybe_free(c);
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
  c->unary_gz = 1;
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
    call_step(c, CALL_EV_END);
    if (c->x) call_render_end(c, c->end_code, m);
    free(m);
  } else if (call_serving(c) && (c->drain_cb || c->room_cb)) {
    uv_timer_start(&c->soon, call_on_soon, 0, 0);
  }
  call_maybe_free(c);
}

static const gzq_ops call_gz_ops = {call_gz_write, call_gz_unary, call_gz_settled};

/* The unary answer, when it should be compressed (once). */
static void gz_unary(rpc_call *c) {
  if (!c->gzip_out || c->unary_gz || !c->unary_set || c->unary_len < GZQ_MIN ||
      bufref_owner_is_ref(c->unary_owner))
    return;
  c->unary_gz = -1; /* tried */
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
    c->unary_set = 1;
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
  call_maybe_free(c);
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
  if (c->bw.waiting || conch.held + n > budget_out_limit()) { /* behind those already waiting */
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

static void call_pump(rpc_call *c);

/* Deferred work of a call: resumed input, a drain callback due. */
static void call_on_soon(uv_timer_t *t) {
  rpc_call *c = t->data;
  if (call_over(c)) return;
  if (!c->in_paused && c->w != W_CONNECT_UNARY &&
      (c->in_len >= 5 || c->input == IN_ENDED))
    call_pump(c);
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

const char *rpc_protocol_name(const rpc_call *c) {
  static const char *const names[][2] = {{"connect+proto", "connect+json"},
                                         {"connect-stream+proto", "connect-stream+json"},
                                         {"grpc+proto", "grpc+json"},
                                         {"grpc-web+proto", "grpc-web+json"}};
  return names[c->w][c->json ? 1 : 0];
}

/* ---------------------------------------------------------------- input */

/* Decode one message into mem (pbmem.h: the scratch buffer first, then
 * malloc, within the decode budget); on error fails the call and returns
 * NULL.  Free the message with protobuf_c_message_free_unpacked(m, &mem->a). */
static ProtobufCMessage *call_decode(rpc_call *c, const uint8_t *p, size_t n, int compressed,
                                     void *scratch, size_t scratch_len, pbmem *mem, size_t whole,
                                     size_t charged) {
  rpc_code code = RPC_INTERNAL;
  char err[700];
  int nul = 0;
  ProtobufCMessage *m = rpc_decode_message(c->m->input, c->json, c->gzip_in, p, n, compressed, scratch,
                                       scratch_len, mem, &code, err, sizeof err, &nul, whole, charged);
  if (!m) {
    call_fail(c, code, err);
    return NULL;
  }
  c->req_nul = nul;
  return m;
}

/* ---- a big request message decoded in the thread pool ---- */
struct decode_job {
  uv_work_t w;
  rpc_call *c;
  const ProtobufCMessageDescriptor *d;
  int json, gzip_in, compressed, nul;
  uint8_t *bytes; /* the message: in buf, or in c->in itself for a Connect unary body */
  uint8_t *buf;   /* owned: a copy (freed in the pool), or c->in taken from the call */
  size_t held;    /* a taken c->in's size, counted as held until done (0: a copy) */
  size_t n;
  int unary;      /* the Connect unary body: the service starts when it is decoded */
  ProtobufCMessage *m;
  rpc_code code;
  char err[700];
};

static void decode_job_run(uv_work_t *w) {
  struct decode_job *j = (struct decode_job *)w;
  pbmem mem; /* no scratch: the message is plain malloc'd (freed with NULL) */
  j->m = rpc_decode_message(j->d, j->json, j->gzip_in, j->bytes, j->n, j->compressed, NULL, 0, &mem, &j->code,
                        j->err, sizeof j->err, &j->nul, 0, 0);
  if (!j->held) { /* a copy, or NULL for a unary body (c->in is the loop's) */
    free(j->buf);
    j->buf = NULL;
  }
}

static void call_drop_input(rpc_call *c) {
  free(c->in);
  conch.rx_buffered -= c->in_cap;
  conch.held -= c->in_cap;
  c->in = NULL;
  c->in_len = c->in_cap = 0;
}

static void call_pump(rpc_call *c);
static void deliver_message(rpc_call *c, ProtobufCMessage *m);
static void start_service(rpc_call *c, ProtobufCMessage *req, ProtobufCAllocator *a);

static void decode_job_done(uv_work_t *w, int status) {
  struct decode_job *j = (struct decode_job *)w;
  rpc_call *c = j->c;
  c->decode = NULL;
  if (j->unary) call_drop_input(c);
  /* a taken c->in is freed here, not in the pool: the read that ended the
   * message may still have been inside it (http1.c keeps the byte the
   * parser paused on) */
  free(j->buf);
  conch.rx_buffered -= j->held;
  conch.held -= j->held;
  if (!j->unary && !c->in_paused && c->x) hx_pause_body(c->x, 0);
  if (call_over(c) || status != 0) { /* aborted, deadline, shutdown */
    if (j->m) protobuf_c_message_free_unpacked(j->m, NULL);
    free(j);
    if (!call_over(c)) call_fail(c, RPC_CANCELED, "canceled");
    call_maybe_free(c);
    return;
  }
  if (!j->m) {
    call_fail(c, j->code, j->err);
  } else if (j->unary) {
    c->req_nul = j->nul;
    start_service(c, j->m, NULL);
  } else {
    c->req_nul = j->nul;
    deliver_message(c, j->m);
    call_pump(c); /* the end of input may be waiting */
  }
  free(j);
}

/* A binary message whose own fields include bytes (a file chunk, input)
 * is mostly those bytes: protobuf-c copies them at memcpy speed (16 MiB in
 * a few ms), so the pool hop and the copy for it would only add latency. */
static int plain_bytes_message(const ProtobufCMessageDescriptor *d) {
  for (unsigned i = 0; i < d->n_fields; i++)
    if (d->fields[i].type == PROTOBUF_C_TYPE_BYTES) return 1;
  return 0;
}

static void call_scan_reset(rpc_call *c);

#define CALL_TAKE_MIN (4u << 20)

/* 1: the message went to the pool (or failed the call), 2: the same, and
 * it was at the start of c->in, which went with it, so c->in now holds
 * only what followed it; 0: decode it here.  Messages are delivered in
 * order: the pump waits while one decodes.  A message of CALL_TAKE_MIN or
 * more is taken rather than copied: its copy would be a fresh mmap
 * (main.c's M_MMAP_THRESHOLD) whose every page faults in on the loop;
 * below it the copy reuses heap and c->in keeps its room. */
static int pool_decode(rpc_call *c, const uint8_t *p, size_t n, int compressed) {
  if (n < RPC_POOL_DECODE_MIN) return 0;
  if (!c->json && !compressed && plain_bytes_message(c->m->input)) return 0;
  int unary = c->w == W_CONNECT_UNARY;
  int take = !unary && p == c->in + 5 && n >= CALL_TAKE_MIN;
  size_t rest = take ? c->in_len - 5 - n : 0, cap = rest > 1024 ? rest : 1024;
  struct decode_job *j = calloc(1, sizeof *j);
  uint8_t *buf = !j || unary ? NULL : malloc(take ? cap : n);
  if (!j || (!unary && !buf)) {
    free(j);
    call_fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return 1;
  }
  *j = (struct decode_job){.c = c, .d = c->m->input, .json = c->json, .gzip_in = c->gzip_in,
                           .compressed = compressed, .bytes = (uint8_t *)p, .n = n, .unary = unary};
  if (take) { /* buf becomes c->in, the old one the job's */
    memcpy(buf, p + n, rest);
    j->buf = c->in;
    j->held = c->in_cap;
    c->in = buf;
    c->in_len = rest;
    c->in_cap = cap;
    conch.rx_buffered += cap;
    conch.held += cap;
    call_scan_reset(c);
  } else if (!unary) {
    memcpy(buf, p, n);
    j->buf = j->bytes = buf;
  }
  if (uv_queue_work(conch.loop, &j->w, decode_job_run, decode_job_done) != 0) {
    free(j->buf);
    conch.rx_buffered -= j->held;
    conch.held -= j->held;
    free(j);
    call_fail(c, RPC_INTERNAL, "cannot queue work");
    return take ? 2 : 1;
  }
  c->decode = j;
  /* no more input while it decodes (the pump waits anyway): a fast writer
   * must not fill c->in meanwhile */
  if (!unary && !c->in_paused && c->x) hx_pause_body(c->x, 1);
  return take ? 2 : 1;
}

static void deliver_message(rpc_call *c, ProtobufCMessage *m) {
  c->had_nul = c->req_nul;
  if (streams_in(c->m)) {
    c->msg_cur = m; /* for rpc_take_request during the callback */
    if (c->m->on_message) c->m->on_message(c, m);
    if (c->msg_cur) protobuf_c_message_free_unpacked(m, NULL);
    c->msg_cur = NULL;
    return;
  }
  /* server streaming over envelopes: exactly one request message */
  if (c->req) {
    protobuf_c_message_free_unpacked(m, NULL);
    call_fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
    return;
  }
  c->req = m;
}

/* req (if any) is freed with allocator a once the service has taken it. */
static void start_service(rpc_call *c, ProtobufCMessage *req, ProtobufCAllocator *a) {
  call_step(c, CALL_EV_START);
  c->had_nul = c->req_nul;
  c->req = req; /* for rpc_take_request during the callback */
  c->req_takable = a == NULL; /* not one decoded on the stack */
  c->req_taken = 0;
  c->m->on_request(c, req);
  if (!c->req_taken && req) protobuf_c_message_free_unpacked(req, a);
  c->req = NULL;
  c->req_takable = c->req_taken = 0;
}

ProtobufCMessage *rpc_take_request(rpc_call *c) {
  if (c->msg_cur) {
    ProtobufCMessage *m = c->msg_cur;
    c->msg_cur = NULL;
    return m;
  }
  if (!c->req_takable || c->req_taken || !c->req) return NULL;
  c->req_taken = 1;
  return c->req;
}

/* ---- a big bytes field read into its own block ----
 *
 * A binary message with a bytes field of CALL_BIG_MIN bytes or more (a file
 * chunk's content) would be assembled in `in` and then copied by
 * protobuf-c's unpack.  Instead, once the field's key and length are here
 * (within the message's first CALL_BIG_WITHIN bytes), its bytes go to a
 * block of their own — read there in place (on_body_into) or copied there
 * from the transport's buffer, once either way — while `in` keeps the
 * envelope's header and the rest of the message; the rest is decoded and
 * the field given the block (pbwire.h).  One copy less per byte uploaded.
 * The block counts in the input budget like `in` until the message is
 * decoded, as protobuf-c's copy would then be the message's. */
#define CALL_BIG_MIN (64u * 1024)
#define CALL_BIG_WITHIN (8u * 1024)

/* The big field's key and length: bytes of the envelope in neither buffer. */
static size_t big_cut(const rpc_call *c) { return c->scan.val - c->scan.key; }

static void call_scan_reset(rpc_call *c) {
  memset(&c->scan, 0, sizeof c->scan);
  c->scan_done = 0;
}

/* The envelope at in[0] is incomplete: move its big field out of `in` if it
 * has one (the envelope stays incomplete: its last byte is still to come). */
static void call_split(rpc_call *c) {
  uint8_t flags;
  uint32_t mlen;
  if (c->big.data || c->scan_done || c->json || c->w == W_CONNECT_UNARY || call_over(c) ||
      c->decode || c->input != IN_OPEN || c->in_len < 5 || c->in[0] != 0 /* compressed, or bad flags */ ||
      env_next(c->in, c->in_len, RPC_MAX_MESSAGE, ENV_COMPRESSED, &flags, &mlen) != ENV_NEED ||
      mlen < CALL_BIG_MIN)
    return;
  pbwire_big_status st = pbwire_find_big(c->m->input, c->in + 5, c->in_len - 5, mlen, CALL_BIG_MIN,
                                         CALL_BIG_WITHIN, &c->scan);
  if (st == PBWIRE_BIG_NEED) return;
  c->scan_done = 1;
  if (st != PBWIRE_BIG_FOUND) return;
  size_t key = 5 + c->scan.key, val = 5 + c->scan.val, len = c->scan.len;
  /* as on_body's growth: within the budgets, else assembled in `in` (which
   * then fails the call there if it must) */
  if (conch.rx_buffered + len > conch.rx_budget || conch.held + len > conch.budget) return;
  uint8_t *b = malloc(len);
  if (!b) return;
  conch.rx_buffered += len;
  conch.held += len;
  size_t have = c->in_len - val, take = have < len ? have : len;
  memcpy(b, c->in + val, take);
  memmove(c->in + key, c->in + val + take, have - take);
  c->in_len = key + (have - take);
  c->big.data = b;
  c->big.len = len;
  c->big.got = take;
  /* `in` may have been sized for the whole body (a Content-Length): what
   * it still has to hold is the rest of the message */
  if (c->in_cap > 2 * CALL_BIG_WITHIN && c->in_cap > 2 * c->in_len) {
    size_t cap = c->in_len > CALL_BIG_WITHIN ? c->in_len : CALL_BIG_WITHIN;
    uint8_t *q = realloc(c->in, cap);
    if (q) {
      conch.rx_buffered -= c->in_cap - cap;
      conch.held -= c->in_cap - cap;
      c->in = q;
      c->in_cap = cap;
    }
  }
}

/* The split envelope at in[0] once all of it is here: the rest decoded,
 * the block attached.  NULL when the call failed. */
static ProtobufCMessage *call_decode_split(rpc_call *c, size_t end) {
  pbmem mem;
  /* the whole message's memory budget, less the block as protobuf-c's
   * allocation of it would have been charged (pbmem.h): the same messages
   * refused as "needs more memory" */
  size_t at = 5 + c->scan.key;
  size_t whole = end - 5 + big_cut(c) + c->big.len, charged = ((c->big.len + 15) & ~(size_t)15) + 16;
  ProtobufCMessage *m = call_decode(c, c->in + 5, end - 5, 0, NULL, 0, &mem, whole, charged);
  if (m && !pbwire_attach_big(m, c->scan.f, c->in + at, end - at, c->big.data, c->big.len))
    free(c->big.data); /* the field is set again later on: that one wins */
  if (!m) free(c->big.data);
  conch.rx_buffered -= c->big.len;
  conch.held -= c->big.len;
  memset(&c->big, 0, sizeof c->big);
  return m;
}

/* Envelope parsing for streaming protocols: deliver what is complete. */
static void call_pump(rpc_call *c) {
  size_t off = 0;
  while (!call_over(c) && !c->in_paused && !c->decode && c->in_len - off >= 5) {
    const uint8_t *h = c->in + off;
    uint8_t flags;
    uint32_t len;
    if (c->big.data && off == 0) { /* its header was checked when it was split */
      env_next(h, c->in_len, RPC_MAX_MESSAGE, ENV_COMPRESSED, &flags, &len);
      size_t end = 5 + (size_t)len - big_cut(c) - c->big.len;
      if (c->big.got < c->big.len || c->in_len < end) break;
      if (c->req) {
        call_fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
        return;
      }
      c->msgs_in++;
      ProtobufCMessage *m = call_decode_split(c, end);
      off = end;
      if (!m) return;
      deliver_message(c, m);
      continue;
    }
    env_status es = env_next(h, c->in_len - off, RPC_MAX_MESSAGE, ENV_COMPRESSED, &flags, &len);
    if (es == ENV_TOO_BIG) {
      char e[128];
      snprintf(e, sizeof e, "message size %u is larger than configured max %u", len, RPC_MAX_MESSAGE);
      call_fail(c, RPC_RESOURCE_EXHAUSTED, e);
      return;
    }
    if (es == ENV_NEED) break;
    if (es == ENV_BAD_FLAGS) {
      call_fail(c, RPC_INVALID_ARGUMENT, "protocol error: invalid envelope flags");
      return;
    }
    if (c->req) { /* server streaming: exactly one request message */
      call_fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
      return;
    }
    c->msgs_in++;
    int pooled = pool_decode(c, h + 5, len, flags & 1);
    if (pooled) {
      off = pooled == 2 ? 0 : off + 5 + (size_t)len; /* 2: c->in starts after it now */
      if (call_over(c)) return;
      break;
    }
    pbmem mem; /* no scratch: messages outlive this frame (deliver_message) */
    ProtobufCMessage *m = call_decode(c, h + 5, len, flags & 1, NULL, 0, &mem, 0, 0);
    off += 5 + (size_t)len;
    if (!m) return;
    deliver_message(c, m);
  }
  if (call_over(c)) return;
  if (off) {
    memmove(c->in, c->in + off, c->in_len - off);
    c->in_len -= off;
    off = 0;
    call_scan_reset(c);
  }
  call_split(c);
  if (c->input == IN_ENDED && !c->in_paused && !c->decode) {
    c->input = IN_DELIVERED;
    size_t left = c->in_len + (c->big.data ? big_cut(c) + c->big.got : 0);
    if (left) {
      char e[160];
      snprintf(e, sizeof e, "protocol error: incomplete envelope: %zu bytes left over", left);
      call_fail(c, RPC_INVALID_ARGUMENT, e);
      return;
    }
    if (streams_in(c->m)) {
      if (c->m->on_input_end) c->m->on_input_end(c);
    } else {
      ProtobufCMessage *req = c->req;
      c->req = NULL;
      if (!req) {
        call_fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected one request message, got none");
        return;
      }
      start_service(c, req, NULL);
    }
  }
}

static void on_body(hx *x, const uint8_t *d, size_t n) {
  rpc_call *c = x->hdata;
  if (call_over(c)) return;
  if (c->big.got < c->big.len) { /* the big field's bytes come first */
    size_t k = c->big.len - c->big.got < n ? c->big.len - c->big.got : n;
    if (d != c->big.data + c->big.got) memcpy(c->big.data + c->big.got, d, k); /* else read there */
    c->big.got += k;
    d += k;
    n -= k;
    if (!n) {
      if (c->big.got == c->big.len) call_pump(c);
      return;
    }
  }
  size_t limit = (size_t)RPC_MAX_MESSAGE + (c->w == W_CONNECT_UNARY ? 0 : 5);
  if (c->w == W_CONNECT_UNARY && c->in_len + n > limit) {
    call_fail(c, RPC_RESOURCE_EXHAUSTED, "message is larger than configured max 16777216 bytes");
    return;
  }
  if (c->in_len + n > c->in_cap) {
    /* first block: the declared length when it is known and in bounds
     * (a unary body then needs no regrowth), else what arrived */
    size_t cap = c->in_cap;
    if (!cap) {
      int64_t cl = x->content_length;
      cap = cl > 0 && (uint64_t)cl <= limit ? (size_t)cl : 1024;
    }
    while (cap < c->in_len + n) cap *= 2;
    /* all calls together hold at most conch.rx_budget bytes of request
     * input (128 streams x 16 MiB on one connection would be 2 GiB), and
     * it counts in the one budget of everything held for clients */
    if (conch.rx_buffered - c->in_cap + cap > conch.rx_budget ||
        conch.held - c->in_cap + cap > conch.budget) {
      call_fail(c, RPC_RESOURCE_EXHAUSTED, "server is busy: too much request data buffered");
      return;
    }
    uint8_t *q = realloc(c->in, cap);
    if (!q) {
      call_fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    conch.rx_buffered += cap - c->in_cap;
    conch.held += cap - c->in_cap;
    c->in = q;
    c->in_cap = cap;
  }
  if (d != c->in + c->in_len) memcpy(c->in + c->in_len, d, n); /* else read there: on_body_into */
  c->in_len += n;
  if (c->w != W_CONNECT_UNARY) call_pump(c);
}

/* hx_handler.body_into: the next body bytes may be read straight into
 * c->in, within the room it already has (no growth, so the budget is
 * unchanged and d above is still c->in + c->in_len) and never past the
 * envelope being assembled — which, after call_pump, starts at c->in[0]
 * — so that the pump's memmove of what follows a message stays small.
 * A unary body takes the room its Content-Length sized. */
static uint8_t *on_body_into(hx *x, size_t *len) {
  rpc_call *c = x->hdata;
  if (call_over(c) || c->in_paused || c->decode || !c->in) return NULL;
  if (c->big.got < c->big.len) {
    *len = c->big.len - c->big.got;
    return c->big.data + c->big.got;
  }
  size_t room = c->in_cap - c->in_len, want = room;
  if (c->w != W_CONNECT_UNARY) {
    if (c->in_len < 5) return NULL;
    uint8_t flags;
    uint32_t mlen;
    if (env_next(c->in, c->in_len, RPC_MAX_MESSAGE, ENV_COMPRESSED, &flags, &mlen) != ENV_NEED)
      return NULL;
    size_t end = 5 + (size_t)mlen - (c->big.data ? big_cut(c) + c->big.len : 0);
    if (c->in_len >= end) return NULL;
    want = end - c->in_len;
  }
  *len = want < room ? want : room;
  return *len ? c->in + c->in_len : NULL;
}

static void on_body_end(hx *x) {
  rpc_call *c = x->hdata;
  if (call_over(c)) return;
  c->input = IN_ENDED;
  if (c->w != W_CONNECT_UNARY) {
    call_pump(c);
    return;
  }
  if (pool_decode(c, c->in, c->in_len, c->gzip_in)) return; /* c->in goes with it */
  /* the one request is freed when the service returns: it is decoded on
   * the stack (a small one needs no malloc) */
  _Alignas(16) uint8_t scratch[1024];
  pbmem mem;
  ProtobufCMessage *m = call_decode(c, c->in, c->in_len, c->gzip_in, scratch, sizeof scratch, &mem, 0, 0);
  call_drop_input(c);
  if (m) start_service(c, m, &mem.a);
}

/* The peer is gone (reset, disconnect, shutdown): nobody is left to
 * answer.  A held end still waits for rpc_end_deferred, and a call inside
 * on_cancel is ended by its caller. */
static void on_abort(hx *x) {
  rpc_call *c = x->hdata;
  c->x = NULL;
  switch (c->state) {
    case CALL_READING:
      uv_timer_stop(&c->deadline);
      call_step(c, CALL_EV_END);
      break;
    case CALL_SERVING:
      uv_timer_stop(&c->deadline);
      call_cancel(c, RPC_CANCELED);
      if (c->state == CALL_CANCELLING) call_step(c, CALL_EV_END);
      break;
    case CALL_FLUSHING: /* the queue drops what is left */
      free(c->end_msg);
      c->end_msg = NULL;
      call_step(c, CALL_EV_END);
      break;
    default:
      break;
  }
  call_maybe_free(c);
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

static const hx_handler call_handler = {on_body, on_body_end, on_abort, on_drain, on_body_into};

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
  call_fail(c, RPC_DEADLINE_EXCEEDED, "the operation timed out");
}

/* ---------------------------------------------------------------- entry */

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
    call_fail(c, RPC_INVALID_ARGUMENT, "missing required header: set Connect-Protocol-Version to \"1\"");
    return;
  }
  if ((w == W_CONNECT_UNARY || w == W_CONNECT_STREAM) && pv && strcmp(pv, "1") != 0) {
    char e[300];
    snprintf(e, sizeof e, "Connect-Protocol-Version must be \"1\": got \"%.200s\"", pv);
    call_fail(c, RPC_INVALID_ARGUMENT, e);
    return;
  }
  /* auth */
  const char *amsg;
  if (auth_check_hx(x, &amsg) != RPC_OK) {
    call_fail(c, RPC_UNAUTHENTICATED, amsg);
    return;
  }
  hx_authed(x); /* the connection's output is no longer held to CONN_UNAUTH_OUTQ */
  if (m->kind != RPC_UNARY) tokhold_take(&c->tok, call_token_replaced); /* a unary call finishes */
  /* timeout */
  const char *tv = (w == W_GRPC || w == W_GRPC_WEB) ? hx_get(x, "grpc-timeout")
                                                    : hx_get(x, "connect-timeout-ms");
  if (tv) {
    int bad = (w == W_GRPC || w == W_GRPC_WEB) ? parse_grpc_timeout(tv, &c->timeout_ms)
                                               : parse_connect_timeout(tv, &c->timeout_ms);
    if (bad) {
      char e[300];
      snprintf(e, sizeof e, "protocol error: invalid timeout %.200s", tv);
      call_fail(c, RPC_INVALID_ARGUMENT, e);
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
      call_fail(c, RPC_UNIMPLEMENTED, e);
      return;
    }
  }
  c->gzip_out = gz_accepted(w == W_CONNECT_UNARY    ? hx_get(x, "accept-encoding")
                            : w == W_CONNECT_STREAM ? hx_get(x, "connect-accept-encoding")
                                                    : hx_get(x, "grpc-accept-encoding"));
  if (w == W_CONNECT_UNARY && x->content_length > (int64_t)RPC_MAX_MESSAGE) {
    call_fail(c, RPC_RESOURCE_EXHAUSTED, "message is larger than configured max 16777216 bytes");
    return;
  }
  if (c->timeout_ms > 0 && !(m->flags & RPC_F_OWN_DEADLINE))
    uv_timer_start(&c->deadline, on_deadline, (uint64_t)c->timeout_ms, 0);
  if (streams_in(m)) start_service(c, NULL, NULL);
}
