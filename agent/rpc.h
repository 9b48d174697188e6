/* rpc — the service-facing side of one RPC call.
 *
 * Services (fs/, proc/) see only this header: a call is a typed request (or a
 * stream of them) in, protobuf messages and one final status out.  Which
 * HTTP version carries it (HTTP/1.1, h2c) and which RPC protocol frames it
 * (Connect unary/streaming, later gRPC, gRPC-Web) is the protocol layer's
 * business (agent/connect.c, agent/http1.c, agent/h2.c).  Auth, content-type,
 * decoding, the 16 MiB message cap and (unless RPC_F_OWN_DEADLINE) the
 * deadline are all handled before a service callback runs.
 *
 * Lifetime: a call is live from the first service callback until the service
 * calls rpc_finish() or the layer calls on_cancel(); after either the service
 * must not touch the call again — except that on_cancel may call
 * rpc_defer_end() and then owes one rpc_end_deferred().  Everything runs on
 * the loop thread.
 *
 * Backpressure out: rpc_send() always queues (bounded only by the caller);
 * a producer that can outpace the client checks rpc_outq_bytes() against
 * RPC_OUTQ_HIGH and waits for the drain callback before producing more.
 * Backpressure in (client streaming): rpc_pause_input(c, 1) stops delivery
 * of on_message (and reading from the socket/stream window) until resumed.
 */
#ifndef CONCH_RPC_H
#define CONCH_RPC_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "agent/bufref.h"

typedef struct rpc_call rpc_call;

/* Numbered as gRPC status codes. */
typedef enum rpc_code {
  RPC_OK = 0,
  RPC_CANCELED = 1,
  RPC_UNKNOWN = 2,
  RPC_INVALID_ARGUMENT = 3,
  RPC_DEADLINE_EXCEEDED = 4,
  RPC_NOT_FOUND = 5,
  RPC_ALREADY_EXISTS = 6,
  RPC_PERMISSION_DENIED = 7,
  RPC_RESOURCE_EXHAUSTED = 8,
  RPC_FAILED_PRECONDITION = 9,
  RPC_ABORTED = 10,
  RPC_OUT_OF_RANGE = 11,
  RPC_UNIMPLEMENTED = 12,
  RPC_INTERNAL = 13,
  RPC_UNAVAILABLE = 14,
  RPC_DATA_LOSS = 15,
  RPC_UNAUTHENTICATED = 16,
} rpc_code;

/* Connect name ("invalid_argument") and HTTP status (400) of a code. */
const char *rpc_code_name(rpc_code code);
int rpc_code_http_status(rpc_code code);

/* RPC_BIDI_STREAM: client-streaming input (on_request(c, NULL), on_message,
 * on_input_end) and server-streaming output on one call; the service may
 * send before the client half-closes.  HTTP/2 only: over HTTP/1.1 the call
 * is answered 505 with Connection: close (as connect-go and connect-es). */
typedef enum rpc_kind { RPC_UNARY, RPC_SERVER_STREAM, RPC_CLIENT_STREAM, RPC_BIDI_STREAM } rpc_kind;

/* The service handles Connect-Timeout-Ms itself (StartProcess: process
 * lifetime); the layer then never cancels the call for the deadline. */
#define RPC_F_OWN_DEADLINE 0x1u

/* A request message of RPC_POOL_DECODE_MIN bytes or more is decoded in the
 * thread pool, not on the loop, whatever the method (a 16 MiB JSON upload
 * chunk takes ~150 ms to decode); messages still reach the service in order. */
#define RPC_POOL_DECODE_MIN (64u * 1024)

/* Outbound queue high-water mark for producers (bytes). */
#define RPC_OUTQ_HIGH (4u * 1024 * 1024)
/* Largest single message in either direction (api.md §1 DECISION). */
#define RPC_MAX_MESSAGE (16u * 1024 * 1024)

typedef struct rpc_method {
  const char *path; /* "/pb.FileService/ListFiles" */
  rpc_kind kind;
  const ProtobufCMessageDescriptor *input;
  const ProtobufCMessageDescriptor *output;
  unsigned flags;
  /* Unary and server streaming: once, with the decoded request.
   * Client and bidi streaming: once with req == NULL when the call opens.
   * req is freed when the callback returns: copy what you keep. */
  void (*on_request)(rpc_call *c, const ProtobufCMessage *req);
  /* Client and bidi streaming: each decoded message in order (freed on return). */
  void (*on_message)(rpc_call *c, const ProtobufCMessage *msg);
  /* Client and bidi streaming: the client half-closed its side. */
  void (*on_input_end)(rpc_call *c);
  /* The call ended from outside (peer reset or disconnect, deadline, bad
   * input, shutdown); `why` says which.  Never called after rpc_finish(). */
  void (*on_cancel)(rpc_call *c, rpc_code why);
} rpc_method;

/* Queue one response message (unary: exactly one on success, then
 * rpc_finish(c, RPC_OK, NULL)).  Returns 0, or -1 when the message could
 * not be queued (larger than RPC_MAX_MESSAGE, out of memory, or the call
 * already ended): the call stays the service's, which then ends it with
 * rpc_finish (e.g. RPC_RESOURCE_EXHAUSTED).  Never calls back into the
 * service. */
/* Inside on_request: take the request instead of copying it (a service
 * that copies a big request in the thread pool).  It is then the caller's,
 * freed with protobuf_c_message_free_unpacked(req, NULL) on any thread.
 * NULL when it cannot be taken (a unary request decoded on the stack):
 * copy it as usual. */
ProtobufCMessage *rpc_take_request(rpc_call *c);

int rpc_send(rpc_call *c, const ProtobufCMessage *msg);

/* Encoding off the loop.  rpc_encode is a pure function (any thread):
 * msg in the JSON (json != 0) or binary codec, in a malloc'd buffer with
 * RPC_HEADROOM bytes free in front, *len bytes at buf + RPC_HEADROOM; NULL
 * when out of memory.  A service may encode in the thread pool with the
 * codec it read on the loop (!rpc_is_proto(c)), then hand the bytes over
 * on the loop with rpc_send_encoded (takes buf, even NULL; same result as
 * rpc_send, -1 also when *len is over RPC_MAX_MESSAGE). */
uint8_t *rpc_encode(int json, const ProtobufCMessage *msg, size_t *len);
int rpc_send_encoded(rpc_call *c, uint8_t *buf, size_t len);
/* The same into buf (cap bytes), which is never reallocated or freed here:
 * returns buf when the message fits, else a new malloc'd buffer, or NULL
 * when out of memory.  A service that allocates buf on the loop (as
 * fs/listing.c does) before handing the work to the pool keeps a small answer's memory
 * within the loop thread (no allocation in the pool, no free across
 * threads). */
uint8_t *rpc_encode_fixed(int json, const ProtobufCMessage *msg, uint8_t *buf, size_t cap, size_t *len);
/* rpc_send_encoded for bytes held by an owner word (bufref.h; give a
 * bufref as bufref_owner_plain so that transports may copy the bytes):
 * released once written, or at once on failure. */
int rpc_send_encoded_ref(rpc_call *c, uint8_t *buf, size_t len, void *owner);

/* Zero-copy send for producers of large messages (file chunks): when
 * rpc_is_proto(c), a caller may pack the message itself at buf + off, with
 * off >= RPC_HEADROOM bytes free in front for the framing, and hand the
 * malloc'd buf over (it is freed in every case).  Same result as rpc_send. */
#define RPC_HEADROOM 5
int rpc_is_proto(const rpc_call *c);
int rpc_send_packed(rpc_call *c, uint8_t *buf, size_t off, size_t len);
/* The same for a message whose tail the caller does not own through malloc
 * (a mapped file window): the message is buf[off, off+len) followed by
 * data[0, dlen), and ref->release(ref) runs exactly once, when the tail is
 * written or at once on failure.  The tail only ever reaches the kernel,
 * never a user-space read.  Streaming calls only (-1 for a unary call). */
int rpc_send_packed_ref(rpc_call *c, uint8_t *buf, size_t off, size_t len, const uint8_t *data,
                        size_t dlen, bufref *ref);

/* End the call: RPC_OK or an error code with its message (NULL = none). */
void rpc_finish(rpc_call *c, rpc_code code, const char *message);
void rpc_finishf(rpc_call *c, rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Bytes queued for this call and not yet handed to the kernel. */
size_t rpc_outq_bytes(const rpc_call *c);
/* One-shot: cb runs once the queue falls below RPC_OUTQ_HIGH/2 (or at once,
 * from the loop, if it already is).  NULL cancels. */
void rpc_on_drain(rpc_call *c, void (*cb)(rpc_call *c));

/* For producers of large messages (file chunks), before making the next
 * one: 1 when the transport has room for about n more bytes now (they
 * are counted as queued until the next send); else 0, and cb runs once
 * it has — then ask again.  Room comes when what this call sent before has
 * left for the socket (HTTP/2: into the peer's open flow-control window)
 * and the connection's queue is about empty, so a connection holds about
 * one chunk at a time however many calls it carries. */
int rpc_out_room(rpc_call *c, size_t n, void (*cb)(rpc_call *c));

/* From inside on_cancel only: hold the call's final answer (the error the
 * layer raised — bad input, deadline) until the service has undone what the
 * client must not see afterwards (an upload's temp file), and then calls
 * rpc_end_deferred(c) exactly once; the call stays valid for that call alone.
 * A peer that went away gets no answer either way. */
void rpc_defer_end(rpc_call *c);
void rpc_end_deferred(rpc_call *c);

/* Client streaming: stop (1) / resume (0) delivering messages. */
void rpc_pause_input(rpc_call *c, int paused);

void rpc_set_user(rpc_call *c, void *user);
void *rpc_user(const rpc_call *c);

/* 1 when the request message just delivered (on_request / on_message) had
 * a NUL byte inside some string field — the C string the service sees is
 * cut at the NUL (protobuf-c strings are NUL-terminated). */
int rpc_input_had_nul(const rpc_call *c);

/* Connect-Timeout-Ms / grpc-timeout in ms; 0 = none. */
int64_t rpc_timeout_ms(const rpc_call *c);
/* "connect+json", "connect+proto", "grpc+proto", "grpc-web+json", … — for logs. */
const char *rpc_protocol_name(const rpc_call *c);

#endif
