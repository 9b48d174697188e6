/* rpc — the service-facing side of one RPC call.
 *
 * Services (fs/, proc/, net/, reflect/) see only this header of server/
 * (and core/ but daemon.h and pool.h): a call is a typed request (or a
 * stream of them) in, protobuf messages and one final status out;
 * thread-pool work goes through rpc_work_submit, and what else a service
 * needs (its loop, its state) it gets from its own init function, never
 * from core/daemon.h or core/pool.h (tests/tools/check-layers.sh, run by
 * `make unit`, fails otherwise).  Which
 * HTTP version carries it (HTTP/1.1, h2c) and which RPC protocol frames it
 * (Connect unary/streaming, later gRPC, gRPC-Web) is the protocol layer's
 * business (server/connect.c, server/http1.c, server/h2.c).  Auth, content-type,
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

#include "core/budget.h"
#include "core/bufref.h"

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
/* A unary call that lasts (Upgrade's trial) holds the token it was opened
 * with as a stream does: replaced, on_cancel(RPC_UNAUTHENTICATED) and the
 * call ends unauthenticated "agent token was replaced". */
#define RPC_F_HOLDS_TOKEN 0x2u
/* A stream that may last (Connect, WatchDir, WatchPorts, a download): an
 * upgrade's drain ends it with `unavailable` "agent is upgrading; resume"
 * (the client resumes against the next program: replay, offset). */
#define RPC_F_DRAIN_END 0x4u
#define RPC_DRAIN_MSG "agent is upgrading; resume"

/* A request message of RPC_POOL_DECODE_MIN bytes or more is decoded in the
 * thread pool, not on the loop, whatever the method (a 16 MiB JSON upload
 * chunk takes ~150 ms to decode) — except a binary, uncompressed one whose
 * type has a bytes field of its own (file chunks: a memcpy); messages still
 * reach the service in order. */
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
   * input, shutdown; RPC_UNAUTHENTICATED: the token it was opened with was
   * replaced — the client is not gone, what it started lives on); `why`
   * says which.  Never called after rpc_finish(). */
  void (*on_cancel)(rpc_call *c, rpc_code why);
} rpc_method;

/* Inside on_request or on_message: take the request or message instead of
 * copying it (a service that copies a big request in the thread pool, an
 * upload that keeps a chunk's bytes until they are written).  It is then
 * the caller's, freed with protobuf_c_message_free_unpacked(m, NULL) on any
 * thread.  NULL when it cannot be taken (a unary request decoded on the
 * stack): copy it as usual. */
ProtobufCMessage *rpc_take_request(rpc_call *c);

/* ---- sending: one message form, one bytes form (and its tail variant) ----
 *
 * All three return 0, or -1 when the message could not be queued (larger than
 * RPC_MAX_MESSAGE, out of memory, or the call already ended): the call
 * stays the service's, which then ends it with rpc_finish (e.g.
 * RPC_RESOURCE_EXHAUSTED).  None ever calls back into the service.
 * Unary: exactly one message on success, then rpc_finish(c, RPC_OK, NULL). */

/* Encode msg in the call's codec (on the loop) and queue it. */
int rpc_send(rpc_call *c, const ProtobufCMessage *msg);

/* 1 when the call speaks JSON, 0 for the binary codec.  Fixed for the
 * call's life: read it on the loop, encode with it anywhere. */
int rpc_is_json(const rpc_call *c);

/* 1 when the call's answers of 1 KiB or more go out gzipped (the client
 * accepts gzip, api.md §9): they must then be readable memory, which a
 * rpc_send_bytes_tail tail is not (it is sent as it is).  Fixed for the
 * call's life. */
int rpc_compresses(const rpc_call *c);

/* Headroom rule (the only one): bytes handed to rpc_send_bytes have
 * RPC_HEADROOM writable bytes in front of them, inside the owner's memory,
 * where the layer writes the framing (no copy of the message).  Encoders
 * here leave it; a service packing a message itself (file chunks, process
 * output) keeps at least that much free in front. */
#define RPC_HEADROOM 5

/* Encoding off the loop (a pure function, any thread): msg in the JSON
 * (json != 0) or binary codec into a new malloc'd buffer, *len bytes at
 * buf + RPC_HEADROOM; NULL when out of memory.  Hand it over with
 * rpc_send_bytes(c, buf, buf + RPC_HEADROOM, *len). */
uint8_t *rpc_encode(int json, const ProtobufCMessage *msg, size_t *len);

/* Queue len bytes at data — one message already encoded in the call's
 * codec (rpc_is_json), RPC_HEADROOM free in front — held by owner, an
 * owner word (bufref.h: a malloc'd pointer, or a bufref).  The owner is
 * released once the bytes are written, or at once on failure (also for a
 * NULL data, which just fails: pass rpc_encode's result unchecked). */
int rpc_send_bytes(rpc_call *c, void *owner, uint8_t *data, size_t len);

/* The same for a message whose tail the service does not own through
 * malloc (retained process output, shared by its readers): the message is
 * data[0, len) followed by tail[0, tail_len), and tail_ref->release(tail_ref) runs exactly once,
 * when the tail is written or at once on failure.  The tail only ever
 * reaches the kernel, never a user-space read.  Streaming calls in the
 * binary codec only (-1 for a unary call, which needs its answer in one
 * piece, and for JSON, which has no raw bytes). */
int rpc_send_bytes_tail(rpc_call *c, void *owner, uint8_t *data, size_t len, const uint8_t *tail,
                        size_t tail_len, bufref *tail_ref);

/* ---- thread-pool work ----
 * Short blocking jobs (stat, a directory walk, a big encode, a file read) on
 * the daemon's batched thread pool (core/pool.h): run(data) in a pool
 * thread — touching only data — then done(data, canceled) on the loop,
 * exactly once, never from inside rpc_work_submit or rpc_work_cancel.  c is the
 * call the work serves, or NULL for clean-up that outlives its call.  With
 * a call, run() has the call's file-system identity (rpc_ident_of(c):
 * fsuid, fsgid, supplementary groups) on its thread, and root's again
 * after it; with NULL it runs as root.
 * Returns a handle, valid until done runs, or NULL when out of memory
 * (nothing will run: the service fails the call itself).
 *
 * Cancellation: the job belongs to the service, not to the call, so a call
 * that ends does not stop it, and done runs whatever became of c (a
 * service checks in done whether its call is still live: it has seen
 * on_cancel).  A service that no longer wants the result calls
 * rpc_work_cancel(w) — from on_cancel, typically: 0 when no thread had
 * started run (done(data, 1) follows later, run never runs), -1 when it
 * runs or ran (done(data, 0) follows as usual). */
typedef struct rpc_work rpc_work;
rpc_work *rpc_work_submit(rpc_call *c, void (*run)(void *data), void (*done)(void *data, int canceled),
                          void *data);
int rpc_work_cancel(rpc_work *w);

/* ---- who the work runs as (api.md §9 "Commands and files as a user") ----
 * The header conch-init-user (`name`, `uid` or `uid:gid`), else the default
 * user (serve --default-user, init key defaultUser), else root: resolved
 * by the layer against the sandbox's /etc/passwd and /etc/group before any
 * service callback runs.  A hold keeps an identity past its call (a
 * process record); holds and releases happen on the loop, reads anywhere. */
typedef struct rpc_ident {
  unsigned refs;       /* the layer's (0: the static implicit root) */
  uint32_t uid, gid;
  int implicit;        /* nobody named a user: root as before (HOME etc. untouched) */
  int has_entry;       /* the uid has a passwd entry (name and home are its) */
  const char *name;    /* the entry's name, else the request's text ("1000", "1000:50") */
  const char *home;    /* the entry's home directory, else "/" */
  size_t ngroups;      /* supplementary groups: every /etc/group entry listing the name */
  const uint32_t *groups;
} rpc_ident;

const rpc_ident *rpc_ident_of(const rpc_call *c);
const rpc_ident *rpc_ident_hold(const rpc_ident *id);
void rpc_ident_release(const rpc_ident *id);
/* A held identity for a record carried over by an upgrade in place (its
 * user's name, uid and gid, as List shows them); "" → root as nobody named. */
const rpc_ident *rpc_ident_restored(const char *name, uint32_t uid, uint32_t gid);

/* In a pool thread: this thread's fsuid, fsgid and groups become id's (a
 * no-op for root); rpc_fs_restore() makes it root's again.  Per thread
 * (raw setfsuid/setfsgid/setgroups system calls, not glibc's broadcast).
 * 0, or -1 when the kernel refused (the thread is left as root). */
int rpc_fs_become(const rpc_ident *id);
void rpc_fs_restore(void);

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
/* rpc_out_room also says no while everything the daemon holds for clients
 * is past half of the memory budget (core/budget.h: budget_take,
 * budget_give, budget_over for input held for a client that cannot wait). */

/* From inside on_cancel only: hold the call's final answer (the error the
 * layer raised — bad input, deadline) until the service has undone what the
 * client must not see afterwards (an upload's temp file), and then calls
 * rpc_end_deferred(c) exactly once; the call stays valid for that call alone.
 * A peer that went away gets no answer either way. */
void rpc_defer_end(rpc_call *c);
void rpc_end_deferred(rpc_call *c);

/* 1 when the daemon routes calls of this service ("pb.ProcessService"):
 * a service whose start failed (PID 1 without its process service) is not. */
int rpc_service_served(const char *service);

/* Client streaming: stop (1) / resume (0) delivering messages. */
void rpc_pause_input(rpc_call *c, int paused);

/* The call's answer is small and waits on something outside its
 * connection (SendInput to a child that does not read): it no longer
 * holds back the connection's other requests (HTTP/2 admission). */
void rpc_waiting(rpc_call *c);

/* The call's answer is bulk data (a file's bytes): until the call's
 * exchange is gone, its connection keeps the bytes the kernel holds
 * unsent short (conn.c), so that the connection's other answers queue
 * behind about one chunk of it, not behind a socket buffer of it
 * (megabytes).  It costs more writes per MiB: not for streams of small
 * events. */
void rpc_bulk(rpc_call *c);

void rpc_set_user(rpc_call *c, void *user);
void *rpc_user(const rpc_call *c);

/* 1 when the request message just delivered (on_request / on_message) had
 * a NUL byte inside some string field — the C string the service sees is
 * cut at the NUL (protobuf-c strings are NUL-terminated). */
int rpc_input_had_nul(const rpc_call *c);

/* Connect-Timeout-Ms / grpc-timeout in ms; 0 = none. */
int64_t rpc_timeout_ms(const rpc_call *c);
/* "connect+json", "connect+proto", "grpc+proto", "grpc-web+json", … — for
 * logs only (the codec: rpc_is_json). */
const char *rpc_protocol_name(const rpc_call *c);

/* ---- plain HTTP routes (api.md §9 "Files over plain HTTP") ----
 * A service serves a plain HTTP path (registered by agent/ with
 * router_add_http) through this interface, whatever the HTTP version: the
 * request line and headers, an answer (status, headers, a body streamed
 * with back-pressure), the request body streamed with back-pressure.
 * rpc_http_open first, then rpc_http_admit (token or signed URL, then the
 * user); the service's callbacks run only after its ready() said RPC_OK.
 * Everything runs on the loop; after rpc_http_end, or after on_abort
 * returned, the request is gone. */
typedef struct hx rpc_http;

typedef struct rpc_http_hdr {
  const char *name; /* lower case */
  const char *value;
} rpc_http_hdr;

typedef struct rpc_http_handler {
  /* body bytes, valid during the call (delivery stops while paused) */
  void (*on_body)(rpc_http *r, const uint8_t *data, size_t len);
  void (*on_body_end)(rpc_http *r);
  /* the peer went away before rpc_http_end: r is gone when it returns */
  void (*on_abort)(rpc_http *r);
  /* rpc_http_room said no and there is room now: ask again (or a file
   * range of rpc_http_write_file was sent) */
  void (*on_drain)(rpc_http *r);
  /* Optional: the service's memory where the next *len body bytes may be
   * read (or NULL); they then come to on_body at that address. */
  uint8_t *(*body_into)(rpc_http *r, size_t *len);
} rpc_http_handler;

/* Take the request over (from the route's function, at once); the body is
 * paused until rpc_http_pause_body(r, 0).  -1 when out of memory (the
 * request has been answered 500). */
int rpc_http_open(rpc_http *r, const rpc_http_handler *h, void *data);
void *rpc_http_data(const rpc_http *r);
const char *rpc_http_method(const rpc_http *r);
const char *rpc_http_query(const rpc_http *r); /* after '?', or NULL */
const char *rpc_http_header(const rpc_http *r, const char *lname);
int64_t rpc_http_content_length(const rpc_http *r); /* -1: unknown (chunked) */
int rpc_http_is_h2(const rpc_http *r);

/* Authentication and identity.  sign_method NULL: the conch-init-token
 * header; else a signed URL (its `expires` and `signature` texts, the
 * method class "GET" or "PUT" and the path that were signed).  user: the
 * user named (NULL: the conch-init-user header, else the default user).
 * ready(r, RPC_OK, NULL) once both passed (r's identity set), else
 * ready(r, code, message); it may run before rpc_http_admit returns. */
typedef struct rpc_http_auth {
  const char *sign_method, *path, *expires, *signature;
  const char *user;
} rpc_http_auth;
void rpc_http_admit(rpc_http *r, const rpc_http_auth *a, void (*ready)(rpc_http *r, rpc_code code,
                                                                       const char *msg));
const rpc_ident *rpc_http_ident(const rpc_http *r);

/* content_length -1: streamed (HTTP/1.1 chunked).  0 or -1. */
int rpc_http_respond(rpc_http *r, int status, const rpc_http_hdr *h, size_t n, int64_t content_length);
/* len bytes at data held by owner (bufref.h), released once written or at
 * once on failure.  0 or -1. */
int rpc_http_write(rpc_http *r, void *owner, const uint8_t *data, size_t len);
/* Send len bytes of fd from offset off (after the head and what was
 * written before) without a copy through user space where the transport
 * can (HTTP/1.1: sendfile, in the thread pool; fd is dup'd): 0 started,
 * and on_drain runs once they all left; 1 not on this transport (nothing
 * done: send them yourself); -1 failed. */
int rpc_http_write_file(rpc_http *r, int fd, uint64_t off, uint64_t len);
int rpc_http_end(rpc_http *r);
/* Cut the answer short (after its head: a read error, a file that
 * shrank): HTTP/2 resets the stream, HTTP/1.1 closes the connection; r is
 * gone, and the service's on_abort does not run. */
void rpc_http_abort(rpc_http *r);
/* As rpc_out_room: 1 when about n more bytes may be made now (counted in
 * the memory budget until the next write), else 0 and on_drain follows. */
int rpc_http_room(rpc_http *r, size_t n);
void rpc_http_pause_body(rpc_http *r, int paused);

/* rpc_work_submit with an identity (NULL: root) instead of a call's. */
rpc_work *rpc_work_submit_as(const rpc_ident *id, void (*run)(void *data),
                             void (*done)(void *data, int canceled), void *data);

#endif
