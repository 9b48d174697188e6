/* connect_int — what connect.c (the call's lifecycle, output and entry)
 * and connect_in.c (its request input) share; nothing else includes it.
 * The lifecycle is one call_state (callstate.h), changed only by
 * connect__step (docs/internals/connect.md). */
#ifndef CONCH_CONNECT_INT_H
#define CONCH_CONNECT_INT_H

#include <uv.h>

#include "core/budget.h"
#include "server/callstate.h"
#include "server/gzq.h"
#include "server/hx.h"
#include "server/rpc.h"
#include "server/tokhold.h"
#include "server/users.h"
#include "proto/pbwire.h"

typedef enum wire { W_CONNECT_UNARY, W_CONNECT_STREAM, W_GRPC, W_GRPC_WEB } wire;

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
  call_input input; /* changed only by call_input_step */
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
  call_req req_own; /* who frees c->req (call_req_step) */
  ProtobufCMessage *msg_cur; /* inside on_message: the message, until taken */
  /* output */
  void *unary_owner; /* owner word (bufref.h) of the answer's bytes */
  uint8_t *unary_out;
  size_t unary_off, unary_len; /* the answer is unary_out[off, off+len) */
  call_output out; /* changed only by call_output_step */
  /* the end, kept while HELD or FLUSHING */
  rpc_code end_code;
  char *end_msg;
  int had_nul;
  void (*drain_cb)(rpc_call *);
  void (*room_cb)(rpc_call *); /* rpc_out_room said no: ask again then */
  void *user;
  const rpc_ident *ident; /* a hold (users.h), or NULL: the implicit root */
  users_wait uw;          /* queued while the user's files are read: no input goes on */
  /* response compression (api.md §9) */
  int gzip_out;               /* the client accepts gzip answers */
  gzq gzq;                    /* stream sends from the first pool deflate on, in order */
  budget_waiter bw; /* rpc_out_room refused for the daemon-wide budget: in its FIFO */
  size_t breserved; /* rpc_out_room granted this much: counted in conch.held until the next send */
  tokhold tok;      /* a stream: the token generation it authenticated with (tokhold.h) */
};

static inline int streams_in(const rpc_method *m) {
  return m->kind == RPC_CLIENT_STREAM || m->kind == RPC_BIDI_STREAM;
}

/* The service holds the call. */
static inline int call_serving(const rpc_call *c) { return c->state == CALL_SERVING; }

/* The end is decided: the service finished, was cancelled, or never ran. */
static inline int call_over(const rpc_call *c) { return c->state > CALL_SERVING; }

/* ---- connect.c ---- */
/* The one place the state changes (callstate.h asserts it is legal). */
void connect__step(rpc_call *c, call_event ev);
/* The layer ends the call with an error: cancel the service, answer. */
void connect__fail(rpc_call *c, rpc_code code, const char *msg);
/* ENDED → CLOSING once no pool job holds the call. */
void connect__maybe_free(rpc_call *c);

/* ---- connect_in.c ---- */
/* READING → SERVING: the service gets the call (req, if any, is freed with
 * allocator a once the service has not taken it). */
void connect__start_service(rpc_call *c, ProtobufCMessage *req, ProtobufCAllocator *a);
/* Envelope parsing for streaming protocols: deliver what is complete. */
void connect__pump(rpc_call *c);
/* A Connect unary body is all in: decode it, start the service. */
void connect__unary_body_end(rpc_call *c);
/* The transport's body callbacks (hx_handler). */
void connect__on_body(hx *x, const uint8_t *d, size_t n);
uint8_t *connect__on_body_into(hx *x, size_t *len);
void connect__on_body_end(hx *x);

#endif
