/* test_connect — the RPC protocol layer (server/connect.c) over a fake hx
 * transport: envelope framing (whole, split anywhere, several per write,
 * truncated, oversized, bad flags, gzip), error rendering for Connect unary
 * (HTTP status + JSON), Connect streaming (end-of-stream envelope), gRPC
 * (trailers-only / trailers) and gRPC-Web (0x80 trailer frame), the header
 * checks of api.md §3/§4 in order, timeouts and deadlines, input pausing,
 * drain callbacks, call lifetime on transport abort (ASan checks that
 * nothing is used after free or leaked), and response compression (order
 * through pool deflates, thresholds, headers, abort while deflating).
 *
 * The fake transport records what connect.c answers; fake "services" record
 * what they receive in svc.log ("open;msg(a.txt,5,532);end;" …).
 *
 * The bug_* tests at the end cover bugs this suite found (fixed). */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>
#include <zlib.h>

#include "server/callstate.h"
#include "server/connect.h"
#include "core/daemon.h"
#include "server/tokhold.h"
#include "proto/agent.pb-c.h"
#include "tests/unit/test.h"

#define TOKEN "s3cret-token"
#define MIB (1024u * 1024u)

static uv_loop_t *loop;

/* ------------------------------------------------------------ byte buffers */

typedef struct bb {
  uint8_t *p;
  size_t len, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n) {
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    b->p = realloc(b->p, cap);
    if (!b->p) abort();
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->len, d, n);
  b->len += n;
  b->p[b->len] = 0; /* always a C string too */
}
static void bb_env(bb *b, uint8_t flags, const void *d, size_t n) {
  uint8_t h[5] = {flags, (uint8_t)(n >> 24), (uint8_t)(n >> 16), (uint8_t)(n >> 8), (uint8_t)n};
  bb_put(b, h, 5);
  bb_put(b, d, n);
}
static void bb_env_str(bb *b, uint8_t flags, const char *s) { bb_env(b, flags, s, strlen(s)); }
static void bb_free(bb *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* gzip (RFC 1952) of d. */
static bb gz(const void *d, size_t n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    abort();
  bb o = {0};
  o.cap = deflateBound(&z, (uLong)n) + 1;
  o.p = malloc(o.cap);
  z.next_in = (Bytef *)d;
  z.avail_in = (uInt)n;
  z.next_out = o.p;
  z.avail_out = (uInt)o.cap;
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) abort();
  o.len = z.total_out;
  deflateEnd(&z);
  return o;
}

/* ------------------------------------------------------------ messages */

static bb pack(const ProtobufCMessage *m) {
  bb b = {0};
  size_t n = protobuf_c_message_get_packed_size(m);
  uint8_t *tmp = malloc(n + 1);
  protobuf_c_message_pack(m, tmp);
  bb_put(&b, tmp, n);
  free(tmp);
  return b;
}
static bb lfr(const char *path, int depth) {
  Pb__ListFilesRequest r = PB__LIST_FILES_REQUEST__INIT;
  r.path = (char *)path;
  r.depth = depth;
  return pack(&r.base);
}
static bb chunk(const char *name, const void *content, size_t n) {
  Pb__FileChunk c = PB__FILE_CHUNK__INIT;
  c.filepath = (char *)name;
  c.content.data = (uint8_t *)content;
  c.content.len = n;
  return pack(&c.base);
}
static bb pfr(int count) {
  Pb__PostFilesResponse r = PB__POST_FILES_RESPONSE__INIT;
  r.uploaded_count = count;
  return pack(&r.base);
}
/* Envelope of a packed message. */
static void bb_env_msg(bb *b, uint8_t flags, bb m) {
  bb_env(b, flags, m.p, m.len);
  bb_free(&m);
}

/* ------------------------------------------------------------ fake transport */

typedef struct fake {
  hx x; /* first: the ops cast back */
  int nrespond, status;
  int64_t clen;
  char hdrs[2048]; /* "name: value\n" … as responded */
  bb body;
  int nend;
  char trailers[1024];
  int paused, npause;
  size_t outq;
  int used;
} fake;

static fake F;

static void cat(char *dst, size_t cap, const char *a, const char *b) {
  size_t l = strlen(dst);
  snprintf(dst + l, cap - l, "%s: %s\n", a, b);
}
static int fk_respond(hx *x, int status, const hx_header *h, size_t n, int64_t cl) {
  fake *f = (fake *)x;
  f->nrespond++;
  f->status = status;
  f->clen = cl;
  for (size_t i = 0; i < n; i++) cat(f->hdrs, sizeof f->hdrs, h[i].name, h[i].value);
  return 0;
}
static int fk_write(hx *x, const hx_part *parts, unsigned n) {
  fake *f = (fake *)x;
  for (unsigned i = 0; i < n; i++) {
    bb_put(&f->body, parts[i].data, parts[i].len);
    bufref_owner_free(parts[i].owner);
  }
  return 0;
}
static int fk_end(hx *x, const hx_header *t, size_t n) {
  fake *f = (fake *)x;
  f->nend++;
  for (size_t i = 0; i < n; i++) cat(f->trailers, sizeof f->trailers, t[i].name, t[i].value);
  return 0;
}
static void fk_pause(hx *x, int p) {
  fake *f = (fake *)x;
  f->paused = p;
  f->npause++;
}
static size_t fk_outq(const hx *x) { return ((const fake *)x)->outq; }
static const hx_ops fk_ops = {fk_respond, fk_write, fk_end, fk_pause, fk_outq};

/* Let go of the previous exchange: the peer "disconnects" if it is still
 * running (as http1.c/h2.c do: ended = 1, then on_abort), then the loop runs
 * until every handle of the call is closed. */
static void fake_done(void) {
  if (!F.used) return;
  if (!F.x.ended && F.x.h && F.x.h->on_abort) {
    F.x.ended = 1;
    F.x.h->on_abort(&F.x);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  hx_free_request(&F.x);
  bb_free(&F.body);
  memset(&F, 0, sizeof F);
}

static void fake_vnew(const char *method, const char *path, va_list ap) {
  fake_done();
  F.used = 1;
  F.x.ops = &fk_ops;
  F.x.method = strdup(method);
  F.x.path = strdup(path);
  F.x.content_length = -1;
  F.clen = -2;
  const char *n;
  while ((n = va_arg(ap, const char *))) {
    const char *v = va_arg(ap, const char *);
    if (hx_add_header(&F.x, n, strlen(n), v, strlen(v)) != 0) abort();
  }
}
/* A request with exactly these headers (name, value, …, NULL). */
static void fake_new(const char *method, const char *path, ...) {
  va_list ap;
  va_start(ap, path);
  fake_vnew(method, path, ap);
  va_end(ap);
}

/* Body delivery as a transport does it: nothing once the response ended. */
static void feed(const void *d, size_t n, size_t step) {
  const uint8_t *p = d;
  for (size_t off = 0; off < n;) {
    if (F.x.ended || !F.x.h) return;
    size_t k = n - off < step ? n - off : step;
    F.x.h->on_body(&F.x, p + off, k);
    off += k;
  }
}
static void feed_bb(const bb *b, size_t step) { feed(b->p, b->len, step ? step : b->len + 1); }
static void feed_end(void) {
  if (!F.x.ended && F.x.h) F.x.h->on_body_end(&F.x);
}
static void peer_abort(void) {
  ASSERT(!F.x.ended);
  F.x.ended = 1;
  F.x.h->on_abort(&F.x);
}

/* Response body envelopes. */
typedef struct env {
  uint8_t flags;
  const uint8_t *p;
  size_t len;
} env;
static size_t envs(env *e, size_t max) {
  size_t n = 0, off = 0;
  while (off < F.body.len) {
    ASSERT(F.body.len - off >= 5);
    const uint8_t *h = F.body.p + off;
    size_t len = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
    ASSERT(F.body.len - off - 5 >= len);
    ASSERT(n < max);
    e[n++] = (env){h[0], h + 5, len};
    off += 5 + len;
  }
  return n;
}
/* The response is a Connect stream ending with this end-of-stream JSON. */
static void expect_stream_end(const char *json) {
  env e[16];
  size_t n = envs(e, 16);
  ASSERT(n >= 1);
  ASSERT_EQ(e[n - 1].flags, 0x02);
  char got[1024];
  ASSERT(e[n - 1].len < sizeof got);
  memcpy(got, e[n - 1].p, e[n - 1].len);
  got[e[n - 1].len] = 0;
  ASSERT_STR_EQ(got, json);
  ASSERT_EQ(F.status, 200);
  ASSERT_EQ(F.nend, 1);
}
/* A Connect unary error answer. */
static void expect_unary(int status, const char *json) {
  ASSERT_EQ(F.nrespond, 1);
  ASSERT_EQ(F.status, status);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/json\n");
  ASSERT_STR_EQ((char *)F.body.p, json);
  ASSERT_EQ(F.clen, (int64_t)F.body.len);
  ASSERT_EQ(F.nend, 1);
}

/* ------------------------------------------------------------ fake services */

enum { S_REPLY, S_HOLD, S_REPLY2, S_EMPTY, S_ERROR, S_REPLY_ERROR, S_PACKED, S_PACKED_REF,
       S_PAUSE_OPEN, S_PAUSE_FIRST, S_HOLD_END, S_SEND_HUGE };

/* A bufref that counts its releases (rpc_send_bytes_tail's tail). */
typedef struct {
  bufref ref;
  int released;
} count_ref;
static void count_ref_release(bufref *r) { ((count_ref *)r)->released++; }
static count_ref tail_ref = {{count_ref_release}, 0};

static struct {
  int mode;
  rpc_code ecode;
  const char *emsg;
  rpc_call *call;
  char log[4096];
  int nmsg, send_fail, drained, packed_rc;
  int hold_end; /* on_cancel calls rpc_defer_end */
  int64_t timeout;
  const char *proto;
} svc;

static void svc_reset(int mode) {
  memset(&svc, 0, sizeof svc);
  svc.mode = mode;
}
static void logf_(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logf_(const char *fmt, ...) {
  size_t l = strlen(svc.log);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(svc.log + l, sizeof svc.log - l, fmt, ap);
  va_end(ap);
}

static void send_chunk(rpc_call *c, const char *name) {
  Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
  ch.filepath = (char *)name;
  ch.content.data = (uint8_t *)"hi";
  ch.content.len = 2;
  if (rpc_send(c, &ch.base) != 0) svc.send_fail++;
}
static void svc_done(rpc_call *c, rpc_code code, const char *msg) {
  svc.call = NULL;
  rpc_finish(c, code, msg);
}

static void svc_on_request(rpc_call *c, const ProtobufCMessage *req) {
  svc.call = c;
  svc.timeout = rpc_timeout_ms(c);
  svc.proto = rpc_protocol_name(c);
  if (!req) {
    logf_("open;");
    if (svc.mode == S_PAUSE_OPEN) rpc_pause_input(c, 1);
    return;
  }
  const Pb__ListFilesRequest *r = (const Pb__ListFilesRequest *)req;
  logf_("req(%s,%d%s);", r->path, (int)r->depth, rpc_input_had_nul(c) ? ",nul" : "");
  switch (svc.mode) {
    case S_REPLY:
      send_chunk(c, r->path);
      svc_done(c, RPC_OK, NULL);
      break;
    case S_REPLY2:
      send_chunk(c, "one");
      send_chunk(c, "two");
      svc_done(c, RPC_OK, NULL);
      break;
    case S_EMPTY: svc_done(c, RPC_OK, NULL); break;
    case S_ERROR: svc_done(c, svc.ecode, svc.emsg); break;
    case S_REPLY_ERROR:
      send_chunk(c, "one");
      svc_done(c, svc.ecode, svc.emsg);
      break;
    case S_PACKED: {
      if (rpc_is_json(c)) { /* pre-encoded in the call's codec: JSON */
        Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
        ch.filepath = r->path;
        ch.content.data = (uint8_t *)"hi";
        ch.content.len = 2;
        size_t n;
        uint8_t *e = rpc_encode(1, &ch.base, &n);
        svc.packed_rc = rpc_send_bytes(c, e, e ? e + RPC_HEADROOM : NULL, n);
        svc_done(c, RPC_OK, NULL);
        break;
      }
      bb m = chunk(r->path, "hi", 2);
      size_t off = 8;
      uint8_t *buf = malloc(off + m.len);
      memcpy(buf + off, m.p, m.len);
      svc.packed_rc = rpc_send_bytes(c, buf, buf + off, m.len);
      bb_free(&m);
      svc_done(c, RPC_OK, NULL);
      break;
    }
    case S_PACKED_REF: { /* the message's last 2 bytes ("hi") by reference */
      static const uint8_t tail[2] = {'h', 'i'};
      bb m = chunk(r->path, "hi", 2);
      size_t off = 8;
      uint8_t *buf = malloc(off + m.len - 2);
      memcpy(buf + off, m.p, m.len - 2);
      tail_ref.released = 0;
      svc.packed_rc = rpc_send_bytes_tail(c, buf, buf + off, m.len - 2, tail, 2, &tail_ref.ref);
      bb_free(&m);
      svc_done(c, RPC_OK, NULL);
      break;
    }
    case S_SEND_HUGE: { /* over the cap: rpc_send fails, the call stays ours to finish */
      uint8_t *huge = calloc(1, 16 * MIB + 1);
      Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
      ch.filepath = "huge";
      ch.content.data = huge;
      ch.content.len = 16 * MIB + 1;
      if (rpc_send(c, &ch.base) != 0) {
        svc.send_fail++;
        svc_done(c, RPC_RESOURCE_EXHAUSTED, "message is larger than configured max 16777216 bytes");
      } else {
        svc_done(c, RPC_OK, NULL);
      }
      free(huge);
      break;
    }
    default: break; /* hold */
  }
}

static void svc_on_message(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__FileChunk *ch = (const Pb__FileChunk *)msg;
  unsigned sum = 0;
  for (size_t i = 0; i < ch->content.len; i++) sum += ch->content.data[i];
  logf_("msg(%s,%zu,%u);", ch->filepath, ch->content.len, sum);
  svc.nmsg++;
  if (svc.mode == S_PAUSE_FIRST && svc.nmsg == 1) rpc_pause_input(c, 1);
}

static void svc_on_input_end(rpc_call *c) {
  logf_("end;");
  if (svc.mode == S_HOLD_END) return;
  Pb__PostFilesResponse r = PB__POST_FILES_RESPONSE__INIT;
  r.uploaded_count = svc.nmsg;
  if (rpc_send(c, &r.base) != 0) svc.send_fail++;
  svc_done(c, RPC_OK, NULL);
}

static rpc_call *held_call; /* on_cancel held the answer (svc.hold_end) */

static void svc_on_cancel(rpc_call *c, rpc_code why) {
  logf_("cancel(%s);", rpc_code_name(why));
  svc.call = NULL;
  if (svc.hold_end) {
    rpc_defer_end(c);
    held_call = c;
    if (svc.hold_end == 2) { /* the cleanup was done at once */
      rpc_end_deferred(c);
      held_call = NULL;
    }
  }
}

static const rpc_method m_unary = {"/pb.FileService/ListFiles", RPC_UNARY,
                                   &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                   0, svc_on_request, NULL, NULL, svc_on_cancel};
static const rpc_method m_sstream = {"/pb.FileService/GetFileStream", RPC_SERVER_STREAM,
                                     &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                     0, svc_on_request, NULL, NULL, svc_on_cancel};
static const rpc_method m_sstream_own = {"/pb.ProcessService/StartProcess", RPC_SERVER_STREAM,
                                         &pb__list_files_request__descriptor,
                                         &pb__file_chunk__descriptor, RPC_F_OWN_DEADLINE,
                                         svc_on_request, NULL, NULL, svc_on_cancel};
static const rpc_method m_cstream = {"/pb.FileService/PostFileStream", RPC_CLIENT_STREAM,
                                     &pb__file_chunk__descriptor, &pb__post_files_response__descriptor,
                                     0, svc_on_request, svc_on_message, svc_on_input_end,
                                     svc_on_cancel};

/* A well-formed request (content type, Connect-Protocol-Version 1, token,
 * then the extra headers) handed to connect_serve. */
static void open_call(const rpc_method *m, const char *ctype, ...) {
  va_list ap;
  va_start(ap, ctype);
  fake_vnew("POST", m->path, ap);
  va_end(ap);
  /* hx_get finds the first match: the extra headers above win. */
  hx_add_header(&F.x, "Content-Type", 12, ctype, strlen(ctype));
  hx_add_header(&F.x, "Connect-Protocol-Version", 24, "1", 1);
  hx_add_header(&F.x, "Conch-Init-Token", 16, TOKEN, strlen(TOKEN));
  connect_serve(&F.x, m);
}
static void open_grpc(const rpc_method *m, const char *ctype, int http2, ...) {
  va_list ap;
  va_start(ap, http2);
  fake_vnew("POST", m->path, ap);
  va_end(ap);
  F.x.http2 = http2;
  hx_add_header(&F.x, "content-type", 12, ctype, strlen(ctype));
  hx_add_header(&F.x, "conch-init-token", 16, TOKEN, strlen(TOKEN));
  connect_serve(&F.x, m);
}

/* The three client-stream test messages as one byte string; bounds[] are
 * the envelope boundaries. */
static uint8_t big[300];
static bb three_chunks(size_t bounds[4]) {
  bb in = {0};
  for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7);
  bounds[0] = 0;
  bb_env_msg(&in, 0, chunk("a.txt", "hello", 5));
  bounds[1] = in.len;
  bb_env(&in, 0, NULL, 0); /* the empty message */
  bounds[2] = in.len;
  bb_env_msg(&in, 0, chunk("c", big, sizeof big));
  bounds[3] = in.len;
  return in;
}
static unsigned big_sum(void) {
  unsigned s = 0;
  for (size_t i = 0; i < sizeof big; i++) s += big[i];
  return s;
}
static char three_log[256];
static const char *three_chunks_log(void) {
  snprintf(three_log, sizeof three_log, "open;msg(a.txt,5,532);msg(,0,0);msg(c,300,%u);end;",
           big_sum());
  return three_log;
}
/* The client-stream success answer: PostFilesResponse{n} then {}. */
static void expect_post_ok(int n) {
  bb want = {0};
  bb_env_msg(&want, 0, pfr(n));
  bb_env_str(&want, 2, "{}");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+proto\n");
  ASSERT_EQ(F.clen, -1);
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);
  ASSERT_EQ(F.nend, 1);
  ASSERT_EQ(svc.send_fail, 0);
}

/* ------------------------------------------------------------ codes */

TEST(code_table) {
  static const struct {
    rpc_code c;
    const char *name;
    int http;
  } t[] = {{RPC_OK, "ok", 200},
           {RPC_CANCELED, "canceled", 499},
           {RPC_UNKNOWN, "unknown", 500},
           {RPC_INVALID_ARGUMENT, "invalid_argument", 400},
           {RPC_DEADLINE_EXCEEDED, "deadline_exceeded", 504},
           {RPC_NOT_FOUND, "not_found", 404},
           {RPC_ALREADY_EXISTS, "already_exists", 409},
           {RPC_PERMISSION_DENIED, "permission_denied", 403},
           {RPC_RESOURCE_EXHAUSTED, "resource_exhausted", 429},
           {RPC_FAILED_PRECONDITION, "failed_precondition", 400},
           {RPC_ABORTED, "aborted", 409},
           {RPC_OUT_OF_RANGE, "out_of_range", 400},
           {RPC_UNIMPLEMENTED, "unimplemented", 501},
           {RPC_INTERNAL, "internal", 500},
           {RPC_UNAVAILABLE, "unavailable", 503},
           {RPC_DATA_LOSS, "data_loss", 500},
           {RPC_UNAUTHENTICATED, "unauthenticated", 401}};
  ASSERT_EQ(sizeof t / sizeof *t, 17);
  for (size_t i = 0; i < 17; i++) {
    ASSERT_EQ(t[i].c, (rpc_code)i);
    ASSERT_STR_EQ(rpc_code_name(t[i].c), t[i].name);
    ASSERT_EQ(rpc_code_http_status(t[i].c), t[i].http);
  }
  ASSERT_STR_EQ(rpc_code_name((rpc_code)17), "unknown");
  ASSERT_EQ(rpc_code_http_status((rpc_code)17), 500);
  ASSERT_STR_EQ(rpc_code_name((rpc_code)-1), "unknown");
}

/* ------------------------------------------------------------ routing checks */

TEST(method_and_content_type) {
  svc_reset(S_REPLY);
  fake_new("GET", m_unary.path, "content-type", "application/json", NULL);
  connect_serve(&F.x, &m_unary);
  ASSERT_EQ(F.status, 405);
  ASSERT_STR_EQ(F.hdrs, "content-type: text/plain; charset=utf-8\nallow: POST\n");
  ASSERT_STR_EQ((char *)F.body.p, "405 method not allowed\n");
  ASSERT_EQ(F.nend, 1);

  const char *bad[][2] = {{"unary", "text/plain"},
                          {"unary", ""},
                          {"unary", "application/connect+json"},
                          {"unary", "application/connect+proto"},
                          {"sstream", "application/json"},
                          {"cstream", "application/proto"},
                          {"unary", "application/jsonx"}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    const rpc_method *m = !strcmp(bad[i][0], "unary") ? &m_unary
                          : !strcmp(bad[i][0], "sstream") ? &m_sstream : &m_cstream;
    open_call(m, bad[i][1], NULL);
    ASSERT_EQ(F.status, 415);
    ASSERT_STR_EQ((char *)F.body.p, "415 unsupported media type\n");
    ASSERT_EQ(F.nend, 1);
  }
  /* no content-type at all */
  fake_new("POST", m_unary.path, "connect-protocol-version", "1", NULL);
  connect_serve(&F.x, &m_unary);
  ASSERT_EQ(F.status, 415);
  ASSERT_STR_EQ(svc.log, "");

  /* parameters and case are ignored */
  open_call(&m_unary, "Application/JSON; charset=utf-8", NULL);
  feed("{\"path\":\"/x\"}", 13, 100);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/x,0);");
  ASSERT_EQ(F.status, 200);
  fake_done();
}

/* ------------------------------------------------------------ header checks */

TEST(protocol_version) {
  svc_reset(S_REPLY);
  /* unary: required */
  fake_new("POST", m_unary.path, "content-type", "application/json", "conch-init-token", TOKEN, NULL);
  connect_serve(&F.x, &m_unary);
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"missing required header: set "
                    "Connect-Protocol-Version to \\\"1\\\"\"}");
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version",
           "2", "conch-init-token", TOKEN, NULL);
  connect_serve(&F.x, &m_unary);
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"Connect-Protocol-Version must be "
                    "\\\"1\\\": got \\\"2\\\"\"}");
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version",
           "", "conch-init-token", TOKEN, NULL);
  connect_serve(&F.x, &m_unary);
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"Connect-Protocol-Version must be "
                    "\\\"1\\\": got \\\"\\\"\"}");
  ASSERT_STR_EQ(svc.log, "");

  /* streaming: optional, but must be 1 when present */
  fake_new("POST", m_sstream.path, "content-type", "application/connect+proto", "connect-protocol-version",
           "2", "conch-init-token", TOKEN, NULL);
  connect_serve(&F.x, &m_sstream);
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"Connect-Protocol-Version "
                    "must be \\\"1\\\": got \\\"2\\\"\"}}");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+proto\n");

  fake_new("POST", m_sstream.path, "content-type", "application/connect+proto", "conch-init-token",
           TOKEN, NULL);
  connect_serve(&F.x, &m_sstream);
  bb in = {0};
  bb_env_msg(&in, 0, lfr("/s", 1));
  feed_bb(&in, 0);
  bb_free(&in);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/s,1);");
  ASSERT_STR_EQ(svc.proto, "connect-stream+proto");
  fake_done();
}

TEST(auth) {
  svc_reset(S_REPLY);
  conch.token_set = 0;
  conch.token_len = 0;
  open_call(&m_unary, "application/proto", NULL);
  expect_unary(401, "{\"code\":\"unauthenticated\",\"message\":\"agent token is not initialized\"}");
  daemon_set_token(TOKEN, strlen(TOKEN));

  struct {
    const char *tok;
    const char *msg;
  } t[] = {{NULL, "agent token is required"},
           {"", "agent token is required"},
           {"s3cret-toke", "agent token is invalid"},
           {"s3cret-tokenX", "agent token is invalid"},
           {"S3cret-token", "agent token is invalid"},
           {"x", "agent token is invalid"}};
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    if (t[i].tok)
      fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version",
               "1", "conch-init-token", t[i].tok, NULL);
    else
      fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version",
               "1", NULL);
    connect_serve(&F.x, &m_unary);
    char want[200];
    snprintf(want, sizeof want, "{\"code\":\"unauthenticated\",\"message\":\"%s\"}", t[i].msg);
    expect_unary(401, want);
  }
  /* longer than 4096 bytes: invalid, even when it starts with the token */
  char *longtok = malloc(4098);
  memset(longtok, 'a', 4097);
  memcpy(longtok, TOKEN, strlen(TOKEN));
  longtok[4097] = 0;
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version", "1",
           "conch-init-token", longtok, NULL);
  free(longtok);
  connect_serve(&F.x, &m_unary);
  expect_unary(401, "{\"code\":\"unauthenticated\",\"message\":\"agent token is invalid\"}");

  /* streaming: end-of-stream error, status 200 */
  fake_new("POST", m_cstream.path, "content-type", "application/connect+proto", NULL);
  connect_serve(&F.x, &m_cstream);
  expect_stream_end("{\"error\":{\"code\":\"unauthenticated\",\"message\":\"agent token is required\"}}");
  ASSERT_STR_EQ(svc.log, ""); /* the client-stream service never opened */

  /* header name is case-insensitive; right token passes */
  fake_new("POST", m_unary.path, "Content-Type", "application/proto", "Connect-Protocol-Version", "1",
           "CONCH-INIT-TOKEN", TOKEN, NULL);
  connect_serve(&F.x, &m_unary);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(,0);");
  ASSERT_EQ(F.status, 200);
  fake_done();
}

/* Connect-Protocol-Version, token, timeout, compression: in that order. */
TEST(check_order) {
  svc_reset(S_REPLY);
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-timeout-ms", "x",
           "content-encoding", "br", NULL);
  connect_serve(&F.x, &m_unary);
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"missing required header: set "
                    "Connect-Protocol-Version to \\\"1\\\"\"}");
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version", "1",
           "connect-timeout-ms", "x", "content-encoding", "br", NULL);
  connect_serve(&F.x, &m_unary);
  expect_unary(401, "{\"code\":\"unauthenticated\",\"message\":\"agent token is required\"}");
  open_call(&m_unary, "application/proto", "connect-timeout-ms", "x", "content-encoding", "br", NULL);
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"protocol error: invalid timeout x\"}");
  open_call(&m_unary, "application/proto", "content-encoding", "br", NULL);
  expect_unary(501, "{\"code\":\"unimplemented\",\"message\":\"unknown compression \\\"br\\\": "
                    "supported encodings are gzip\"}");
  open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "zstd", NULL);
  expect_stream_end("{\"error\":{\"code\":\"unimplemented\",\"message\":\"unknown compression "
                    "\\\"zstd\\\": supported encodings are gzip\"}}");
  ASSERT_STR_EQ(svc.log, "");
  fake_done();
}

TEST(connect_timeout_header) {
  svc_reset(S_REPLY);
  const char *bad[] = {"12345678901", "12a", "abc", "", "-5", " 5", "5 ", "1.5", "0x10"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    open_call(&m_unary, "application/proto", "connect-timeout-ms", bad[i], NULL);
    char want[200];
    snprintf(want, sizeof want,
             "{\"code\":\"invalid_argument\",\"message\":\"protocol error: invalid timeout %s\"}", bad[i]);
    expect_unary(400, want);
    /* streaming: same text in the end-of-stream envelope */
    open_call(&m_sstream, "application/connect+proto", "connect-timeout-ms", bad[i], NULL);
    snprintf(want, sizeof want,
             "{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: invalid timeout "
             "%s\"}}",
             bad[i]);
    expect_stream_end(want);
  }
  ASSERT_STR_EQ(svc.log, "");
  /* 10 digits is the maximum; the value reaches the service */
  open_call(&m_unary, "application/proto", "connect-timeout-ms", "9999999999", NULL);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(,0);");
  ASSERT_EQ(svc.timeout, 9999999999LL);
  ASSERT_EQ(F.status, 200);
  svc_reset(S_REPLY);
  open_call(&m_unary, "application/proto", "connect-timeout-ms", "0000000042", NULL);
  feed_end();
  ASSERT_EQ(svc.timeout, 42);
  ASSERT_STR_EQ(svc.proto, "connect+proto");
  fake_done();
}

/* ------------------------------------------------------------ Connect unary */

/* A whole unary proto call for ListFiles(path) with the service in mode. */
static void unary_proto_call(int mode, const char *path) {
  svc_reset(mode);
  open_call(&m_unary, "application/proto", NULL);
  bb req = lfr(path, 0);
  feed_bb(&req, 0);
  bb_free(&req);
  feed_end();
}

TEST(unary_proto_ok) {
  svc_reset(S_REPLY);
  open_call(&m_unary, "application/proto", NULL);
  bb req = lfr("/home/user", 3);
  feed_bb(&req, 4); /* body in pieces */
  ASSERT_STR_EQ(svc.log, "");
  feed_end();
  bb_free(&req);
  ASSERT_STR_EQ(svc.log, "req(/home/user,3);");
  bb want = chunk("/home/user", "hi", 2);
  ASSERT_EQ(F.status, 200);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/proto\n");
  ASSERT_EQ(F.clen, (int64_t)want.len);
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  ASSERT_EQ(F.nend, 1);
  bb_free(&want);

  /* zero-copy variant: same bytes */
  unary_proto_call(S_PACKED, "/p");
  ASSERT_EQ(svc.packed_rc, 0);
  want = chunk("/p", "hi", 2);
  ASSERT_EQ(F.clen, (int64_t)want.len);
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);

  /* a referenced tail is for streams only: refused, released once */
  unary_proto_call(S_PACKED_REF, "/p");
  ASSERT_EQ(svc.packed_rc, -1);
  ASSERT_EQ(tail_ref.released, 1);
  ASSERT_EQ(F.status, 200);
  ASSERT_EQ(F.clen, 0); /* no message was sent: the empty message */

  /* no message sent: the empty message */
  svc_reset(S_EMPTY);
  open_call(&m_unary, "application/proto", NULL);
  feed_end(); /* empty body = empty message for proto */
  ASSERT_STR_EQ(svc.log, "req(,0);");
  ASSERT_EQ(F.status, 200);
  ASSERT_EQ(F.clen, 0);
  ASSERT_EQ(F.body.len, 0);
  ASSERT_EQ(F.nend, 1);
  fake_done();
}

TEST(unary_json_ok) {
  svc_reset(S_REPLY);
  open_call(&m_unary, "application/json", NULL);
  const char *j = "{\"path\":\"/etc\",\"depth\":2}";
  feed(j, strlen(j), 1);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/etc,2);");
  ASSERT_EQ(F.status, 200);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/json\n");
  ASSERT_STR_EQ((char *)F.body.p, "{\"filepath\":\"/etc\",\"content\":\"aGk=\"}");
  ASSERT_EQ(F.clen, (int64_t)F.body.len);

  svc_reset(S_EMPTY);
  open_call(&m_unary, "application/json", NULL);
  feed("{}", 2, 10);
  feed_end();
  ASSERT_STR_EQ((char *)F.body.p, "{}");
  ASSERT_EQ(F.clen, 2);

  /* bytes pre-encoded in the call's codec (rpc_is_json): sent as they are */
  svc_reset(S_PACKED);
  open_call(&m_unary, "application/json", NULL);
  j = "{\"path\":\"/etc\"}";
  feed(j, strlen(j), 10);
  feed_end();
  ASSERT_EQ(svc.packed_rc, 0);
  ASSERT_STR_EQ((char *)F.body.p, "{\"filepath\":\"/etc\",\"content\":\"aGk=\"}");
  fake_done();
}

TEST(unary_errors) {
  /* service error → status from the table, JSON body with escaping */
  svc_reset(S_ERROR);
  svc.ecode = RPC_NOT_FOUND;
  svc.emsg = "no such file: \"/a\"";
  open_call(&m_unary, "application/json", NULL);
  feed("{\"path\":\"/a\"}", 13, 100);
  feed_end();
  expect_unary(404, "{\"code\":\"not_found\",\"message\":\"no such file: \\\"/a\\\"\"}");

  svc_reset(S_ERROR);
  svc.ecode = RPC_FAILED_PRECONDITION;
  svc.emsg = "back\\slash\nnl\ttab\x01";
  open_call(&m_unary, "application/proto", NULL);
  feed_end();
  expect_unary(400, "{\"code\":\"failed_precondition\",\"message\":\"back\\\\slash\\nnl\\ttab"
                    "\\u0001\"}");

  svc_reset(S_ERROR);
  svc.ecode = RPC_INTERNAL;
  svc.emsg = NULL;
  open_call(&m_unary, "application/proto", NULL);
  feed_end();
  expect_unary(500, "{\"code\":\"internal\"}");

  svc_reset(S_ERROR);
  svc.ecode = RPC_PERMISSION_DENIED;
  svc.emsg = "";
  open_call(&m_unary, "application/proto", NULL);
  feed_end();
  expect_unary(403, "{\"code\":\"permission_denied\"}");
  fake_done();
}

static void expect_unmarshal_error(void) {
  const char *pre = "{\"code\":\"invalid_argument\",\"message\":\"unmarshal into pb.ListFilesRequest: ";
  ASSERT_EQ(F.status, 400);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/json\n");
  ASSERT(F.body.len > strlen(pre) + 2);
  ASSERT_MEM_EQ(F.body.p, pre, strlen(pre));
  ASSERT_STR_EQ((char *)F.body.p + F.body.len - 2, "\"}");
  ASSERT_EQ(F.nend, 1);
}

TEST(unary_decode_errors) {
  svc_reset(S_REPLY);
  const char *bad_json[] = {"", "{\"path\":", "{\"depth\":\"x\"}", "[]", "{\"path\":1}",
                            "{} {}", "\"x\"", "{\"path\":\"\xff\"}"};
  for (size_t i = 0; i < sizeof bad_json / sizeof *bad_json; i++) {
    open_call(&m_unary, "application/json", NULL);
    feed(bad_json[i], strlen(bad_json[i]), 3);
    feed_end();
    expect_unmarshal_error();
  }
  /* proto: truncated length-delimited field */
  open_call(&m_unary, "application/proto", NULL);
  feed("\x0a\x05" "ab", 4, 100);
  feed_end();
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"unmarshal into pb.ListFilesRequest: "
                    "invalid protobuf\"}");
  /* proto: a string that is not UTF-8 */
  open_call(&m_unary, "application/proto", NULL);
  feed("\x0a\x02\xff\xfe", 4, 100);
  feed_end();
  expect_unmarshal_error();
  ASSERT_STR_EQ(svc.log, "");

  /* NUL inside a string: delivered cut, flagged */
  open_call(&m_unary, "application/json", NULL);
  feed("{\"path\":\"a\\u0000b\"}", 19, 100);
  feed_end();
  open_call(&m_unary, "application/proto", NULL);
  feed("\x0a\x03" "a\0b", 5, 100);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(a,0,nul);req(a,0,nul);");
  fake_done();
}

TEST(unary_size_limit) {
  svc_reset(S_REPLY);
  /* Content-Length over the cap: refused before the body */
  fake_new("POST", m_unary.path, "content-type", "application/proto", "connect-protocol-version", "1",
           "conch-init-token", TOKEN, NULL);
  F.x.content_length = (int64_t)16 * MIB + 1;
  connect_serve(&F.x, &m_unary);
  expect_unary(429, "{\"code\":\"resource_exhausted\",\"message\":\"message is larger than configured "
                    "max 16777216 bytes\"}");
  /* a chunked body that grows past the cap */
  open_call(&m_unary, "application/proto", NULL);
  uint8_t *mb = calloc(1, MIB);
  for (int i = 0; i < 16; i++) feed(mb, MIB, MIB);
  ASSERT_EQ(F.nrespond, 0);
  feed(mb, 1, 1);
  free(mb);
  expect_unary(429, "{\"code\":\"resource_exhausted\",\"message\":\"message is larger than configured "
                    "max 16777216 bytes\"}");
  ASSERT_STR_EQ(svc.log, "");
  fake_done();
}

TEST(unary_gzip) {
  svc_reset(S_REPLY);
  bb req = lfr("/zipped", 7);
  bb z = gz(req.p, req.len);
  bb_free(&req);
  open_call(&m_unary, "application/proto", "content-encoding", "gzip", NULL);
  feed_bb(&z, 5);
  feed_end();
  bb_free(&z);
  ASSERT_STR_EQ(svc.log, "req(/zipped,7);");
  ASSERT_EQ(F.status, 200);

  open_call(&m_unary, "application/json", "content-encoding", "GZIP", NULL);
  z = gz("{\"path\":\"/j\"}", 13);
  feed_bb(&z, 0);
  bb_free(&z);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/zipped,7);req(/j,0);");

  open_call(&m_unary, "application/proto", "content-encoding", "identity", NULL);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/zipped,7);req(/j,0);req(,0);");

  open_call(&m_unary, "application/proto", "content-encoding", "gzip", NULL);
  feed("not gzip at all", 15, 100);
  feed_end();
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"invalid gzip data\"}");

  /* truncated gzip stream */
  req = lfr("/truncated", 1);
  z = gz(req.p, req.len);
  bb_free(&req);
  open_call(&m_unary, "application/proto", "content-encoding", "gzip", NULL);
  feed(z.p, z.len - 4, 100);
  bb_free(&z);
  feed_end();
  expect_unary(400, "{\"code\":\"invalid_argument\",\"message\":\"invalid gzip data\"}");

  /* a small body that inflates past the cap */
  uint8_t *zeros = calloc(1, 17 * MIB);
  z = gz(zeros, 17 * MIB);
  free(zeros);
  ASSERT(z.len < 100000);
  open_call(&m_unary, "application/proto", "content-encoding", "gzip", NULL);
  feed_bb(&z, 0);
  bb_free(&z);
  feed_end();
  expect_unary(429, "{\"code\":\"resource_exhausted\",\"message\":\"message is larger than configured "
                    "max 16777216 bytes\"}");
  ASSERT_STR_EQ(svc.log, "req(/zipped,7);req(/j,0);req(,0);");
  fake_done();
}

/* ------------------------------------------------------------ Connect streaming: framing */

TEST(envelopes_whole_and_batched) {
  size_t bd[4];
  bb in = three_chunks(bd);
  /* one envelope per write; each is delivered as soon as it is complete */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  ASSERT_STR_EQ(svc.log, "open;");
  feed(in.p + bd[0], bd[1] - bd[0], 1000);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);");
  feed(in.p + bd[1], bd[2] - bd[1], 1000);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);msg(,0,0);");
  feed(in.p + bd[2], bd[3] - bd[2], 1000);
  ASSERT_EQ(F.nrespond, 0);
  feed_end();
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  expect_post_ok(3);
  ASSERT_STR_EQ(svc.proto, "connect-stream+proto");

  /* all three in one write, and twice that in one write */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed_bb(&in, 0);
  feed_end();
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  expect_post_ok(3);

  bb twice = {0};
  bb_put(&twice, in.p, in.len);
  bb_put(&twice, in.p, in.len);
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed_bb(&twice, 0);
  feed_end();
  ASSERT_EQ(svc.nmsg, 6);
  expect_post_ok(6);
  bb_free(&twice);
  bb_free(&in);
  fake_done();
}

TEST(envelopes_byte_by_byte) {
  size_t bd[4];
  bb in = three_chunks(bd);
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  for (size_t i = 0; i < in.len; i++) {
    feed(in.p + i, 1, 1);
    /* the message shows up exactly when its last byte arrives */
    int want = (i + 1 >= bd[3]) ? 3 : (i + 1 >= bd[2]) ? 2 : (i + 1 >= bd[1]) ? 1 : 0;
    ASSERT_EQ(svc.nmsg, want);
  }
  feed_end();
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  expect_post_ok(3);
  bb_free(&in);
  fake_done();
}

TEST(envelopes_split_everywhere) {
  size_t bd[4];
  bb in = three_chunks(bd);
  for (size_t k = 0; k <= in.len; k++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed(in.p, k, in.len + 1);
    feed(in.p + k, in.len - k, in.len + 1);
    feed_end();
    if (strcmp(svc.log, three_chunks_log()) != 0) TEST_FAIL_("split at %zu: %s", k, svc.log);
    expect_post_ok(3);
  }
  /* odd step sizes */
  for (size_t step = 2; step < 12; step++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed_bb(&in, step);
    feed_end();
    ASSERT_STR_EQ(svc.log, three_chunks_log());
  }
  bb_free(&in);
  fake_done();
}

/* Body delivery as HTTP/1.1 with a Content-Length (http1.c h1_read_into):
 * into the call's buffer whenever it offers room, at most `most` bytes of
 * an offer (0: all of it; ASan: an offer past the buffer is written past
 * it), else `step` bytes through on_body's copy.  bd[0..nbd] (or NULL):
 * the envelopes' bounds — an offer starts after its envelope's 5-byte
 * header and ends by its end.  Returns the bytes read in place. */
static size_t feed_into(const bb *in, size_t step, size_t most, const size_t *bd, size_t nbd) {
  size_t off = 0, into = 0;
  while (off < in->len) {
    size_t len = 0;
    uint8_t *p = F.x.h->body_into(&F.x, &len);
    if (!p) {
      size_t k = in->len - off < step ? in->len - off : step;
      feed(in->p + off, k, k);
      off += k;
      continue;
    }
    size_t e = 0;
    while (bd && e + 1 < nbd && off >= bd[e + 1]) e++;
    ASSERT(!bd || (off >= bd[e] + 5 && off + len <= bd[e + 1]));
    size_t k = most && len > most ? most : len;
    ASSERT(k > 0 && off + k <= in->len);
    memcpy(p, in->p + off, k);
    hx_body(&F.x, p, k);
    off += k;
    into += k;
  }
  return into;
}

/* The same messages whichever way the bytes came, most of them in place. */
TEST(envelopes_read_into) {
  size_t bd[4];
  bb in = three_chunks(bd);
  for (size_t step = 1; step < 40; step += 3) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    size_t into = feed_into(&in, step, 2 * step, bd, 4);
    feed_end();
    if (strcmp(svc.log, three_chunks_log()) != 0) TEST_FAIL_("step %zu: %s", step, svc.log);
    expect_post_ok(3);
    if (into < in.len / 2) TEST_FAIL_("step %zu: only %zu of %zu bytes read in place", step, into, in.len);
  }
  bb_free(&in);

  /* a message bigger than the buffer: each offer is only the room it has */
  static uint8_t large[200000];
  unsigned sum = 0;
  for (size_t i = 0; i < sizeof large; i++) sum += large[i] = (uint8_t)(i * 13 + 1);
  bb one = {0};
  bb_env_msg(&one, 0, chunk("L", large, sizeof large));
  size_t obd[2] = {0, one.len};
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  size_t into = feed_into(&one, 4096, 0, obd, 2);
  feed_end();
  char want[64];
  snprintf(want, sizeof want, "open;msg(L,200000,%u);end;", sum);
  ASSERT_STR_EQ(svc.log, want);
  ASSERT(into > one.len / 2);
  bb_free(&one);

  /* none once the call failed (an envelope over the cap) */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  const uint8_t huge[5] = {0, 0x01, 0, 0, 1};
  feed(huge, 5, 5);
  size_t len = 1;
  ASSERT(F.x.h->body_into(&F.x, &len) == NULL);
  fake_done();
}

/* A chunk whose content is 64 KiB or more: the content goes to a block of
 * its own as soon as its key and length are here (server/connect.c
 * call_split), whichever way the bytes come; fields after it, the field
 * set again after it, an envelope cut short, the input budget, a
 * compressed envelope and an abort in the middle. */
TEST(envelopes_big_field) {
  static uint8_t large[200000];
  unsigned sum = 0;
  for (size_t i = 0; i < sizeof large; i++) sum += large[i] = (uint8_t)(i * 11 + 3);
  bb in = {0};
  bb_env_msg(&in, 0, chunk("L", large, sizeof large));
  size_t one = in.len;
  bb_env_msg(&in, 0, chunk("", "hello", 5));
  bb_env_msg(&in, 0, chunk("", large, 70000));
  unsigned sum7 = 0;
  for (size_t i = 0; i < 70000; i++) sum7 += large[i];
  char want[128];
  snprintf(want, sizeof want, "open;msg(L,200000,%u);msg(,5,532);msg(,70000,%u);end;", sum, sum7);
  static const size_t steps[] = {1, 7, 1000, 4096, 65536, 300000};
  for (size_t i = 0; i < sizeof steps / sizeof *steps; i++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed_bb(&in, steps[i]);
    feed_end();
    if (strcmp(svc.log, want) != 0) TEST_FAIL_("step %zu: %s", steps[i], svc.log);
    expect_post_ok(3);
  }
  /* split: once the key and length are here, the offer is the content's
   * rest in one piece (the buffer itself has 1024 bytes) */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed(in.p, 1000, 1000);
  size_t len = 0;
  uint8_t *p = F.x.h->body_into(&F.x, &len);
  size_t head = 5 + 1 + 1 + 1 + 1 + 3; /* envelope, filepath "L", content key and length */
  ASSERT(p != NULL);
  ASSERT_EQ(len, sizeof large - (1000 - head));
  memcpy(p, in.p + 1000, len);
  hx_body(&F.x, p, len);
  ASSERT_EQ(svc.nmsg, 1);
  feed(in.p + one, in.len - one, 333);
  feed_end();
  ASSERT_STR_EQ(svc.log, want);
  expect_post_ok(3);

  /* fields after the content; the content set again after it (the last wins) */
  bb m = chunk("a", large, 100000);
  bb_put(&m, "\x0a\x01" "b", 3);         /* filepath "b" */
  bb_put(&m, "\x78\x05", 2);             /* field 15, varint: unknown */
  bb m2 = chunk("c", large, 100000);
  bb_put(&m2, "\x12\x02" "xy", 4);       /* content "xy" */
  bb in2 = {0};
  bb_env_msg(&in2, 0, m);
  bb_env_msg(&in2, 0, m2);
  unsigned s1 = 0;
  for (size_t i = 0; i < 100000; i++) s1 += large[i];
  snprintf(want, sizeof want, "open;msg(b,100000,%u);msg(c,2,%u);end;", s1, (unsigned)('x' + 'y'));
  for (size_t step = 3; step < 70000; step *= 9) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed_bb(&in2, step);
    feed_end();
    if (strcmp(svc.log, want) != 0) TEST_FAIL_("step %zu: %s", step, svc.log);
  }
  bb_free(&in2);

  /* cut short inside the content, and inside the fields after it: every
   * byte of the envelope counts as left over */
  static const size_t cuts[] = {150000, 200000 + 12};
  for (size_t i = 0; i < 2; i++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    bb t = {0};
    bb m3 = chunk("L", large, sizeof large);
    bb_put(&m3, "\x0a\x01" "b", 3);
    bb_env_msg(&t, 0, m3);
    ASSERT(cuts[i] < t.len);
    feed(t.p, cuts[i], 4096);
    feed_end();
    char e[200];
    snprintf(e, sizeof e, "{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: "
             "incomplete envelope: %zu bytes left over\"}}", cuts[i]);
    expect_stream_end(e);
    bb_free(&t);
  }

  /* the block counts in the input budget: over it, the call fails as a
   * buffer that large would */
  fake_done(); /* the calls before are freed: their input no longer counts */
  size_t saved = conch.rx_budget;
  conch.rx_budget = conch.rx_buffered + 150000;
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed(in.p, one, 4096);
  expect_stream_end("{\"error\":{\"code\":\"resource_exhausted\",\"message\":\"server is busy: too "
                    "much request data buffered\"}}");
  conch.rx_budget = saved;
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  size_t before = conch.rx_buffered;
  feed(in.p, 100000, 4096);
  ASSERT(conch.rx_buffered >= before + sizeof large); /* the block, counted */
  peer_abort(); /* in the middle of the content: ASan sees the block freed */
  fake_done();
  ASSERT_EQ(conch.rx_buffered, before);

  /* what protobuf-c refuses whole is refused however it arrives: a
   * 6-byte length in front of the content */
  bb l6 = {0};
  bb_put(&l6, "\x0a\x01" "A" "\x12\x80\x80\x84\x80\x80\x00", 10);
  bb_put(&l6, large, 65536);
  bb in6 = {0};
  bb_env_msg(&in6, 0, l6);
  static const size_t steps6[] = {4096, 1000000};
  for (size_t i = 0; i < 2; i++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed_bb(&in6, steps6[i]);
    feed_end();
    expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"unmarshal into "
                      "pb.FileChunk: invalid protobuf\"}}");
  }
  bb_free(&in6);

  /* the decode's memory budget is the whole message's either way: 8 MiB
   * of content and 570 000 unknown fields of 2 bytes need more than the
   * 64 MiB a message of that size may take */
  size_t nu = 570000;
  uint8_t *fat = malloc(8 * MIB);
  memset(fat, 'f', 8 * MIB);
  bb mb = chunk("F", fat, 8 * MIB);
  for (size_t i = 0; i < nu; i++) bb_put(&mb, "\x78\x01", 2);
  bb inb = {0};
  bb_env_msg(&inb, 0, mb);
  static const size_t stepsb[] = {65536, 16 * MIB};
  for (size_t i = 0; i < 2; i++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", NULL);
    feed_bb(&inb, stepsb[i]);
    feed_end();
    expect_stream_end("{\"error\":{\"code\":\"resource_exhausted\",\"message\":\"unmarshal into "
                      "pb.FileChunk: message needs more than 67108864 bytes of memory to decode\"}}");
  }
  bb_free(&inb);
  free(fat);

  /* a buffer sized for the whole body by its Content-Length gives back
   * what the block took over: the input is counted once */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  F.x.content_length = (int64_t)one;
  size_t before1 = conch.rx_buffered;
  feed(in.p, 1000, 1000);
  ASSERT(conch.rx_buffered >= before1 + sizeof large);
  ASSERT(conch.rx_buffered <= before1 + sizeof large + 16384);
  feed(in.p + 1000, one - 1000, 65536);
  feed_end();
  snprintf(want, sizeof want, "open;msg(L,200000,%u);end;", sum);
  ASSERT_STR_EQ(svc.log, want);

  /* compressed (incompressible content, so the envelope is big too):
   * assembled whole, inflated and decoded in the pool as before */
  static uint8_t rnd[100000];
  uint32_t x = 12345;
  unsigned rsum = 0;
  for (size_t i = 0; i < sizeof rnd; i++) {
    x = x * 1103515245u + 12345u;
    rsum += rnd[i] = (uint8_t)(x >> 23);
  }
  bb c = chunk("Z", rnd, sizeof rnd);
  bb zc = gz(c.p, c.len);
  ASSERT(zc.len >= 65536);
  bb in3 = {0};
  bb_env(&in3, 1, zc.p, zc.len);
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", "Connect-Content-Encoding", "gzip", NULL);
  feed_bb(&in3, 1000);
  feed_end();
  for (int i = 0; i < 1000 && svc.nmsg == 0; i++) uv_run(loop, UV_RUN_ONCE);
  snprintf(want, sizeof want, "open;msg(Z,100000,%u);end;", rsum);
  ASSERT_STR_EQ(svc.log, want);
  bb_free(&c);
  bb_free(&zc);
  bb_free(&in3);
  bb_free(&in);
  fake_done();
}

/* A message decoded in the pool that opens the input and is 4 MiB or more
 * takes the input buffer with it (no copy on the loop); what followed it
 * in the same read stays, is delivered after it, and the buffered-input
 * count comes back to where it was. */
TEST(stream_big_message_takes_the_buffer) {
  size_t nbig = 5u << 20;
  uint8_t *rnd = malloc(nbig);
  ASSERT(rnd != NULL);
  uint32_t x = 777;
  unsigned bsum = 0;
  for (size_t i = 0; i < nbig; i++) {
    x = x * 1103515245u + 12345u;
    bsum += rnd[i] = (uint8_t)(x >> 23);
  }
  bb c = chunk("T", rnd, nbig);
  bb zc = gz(c.p, c.len);
  ASSERT(zc.len >= (4u << 20));
  bb small = chunk("s", "abc", 3);
  bb in = {0};
  bb_env(&in, 1, zc.p, zc.len);
  bb_env(&in, 0, small.p, small.len);
  size_t before = conch.rx_buffered, held = conch.held;
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", "Connect-Content-Encoding", "gzip", NULL);
  feed_bb(&in, 0); /* one read: the small message is behind the big one */
  for (int i = 0; i < 5000 && svc.nmsg < 2; i++) uv_run(loop, UV_RUN_ONCE);
  feed_end();
  char want[128];
  snprintf(want, sizeof want, "open;msg(T,%zu,%u);msg(s,3,%u);end;", nbig, bsum, (unsigned)('a' + 'b' + 'c'));
  ASSERT_STR_EQ(svc.log, want);
  fake_done();
  ASSERT_EQ(conch.rx_buffered, before);
  ASSERT_EQ(conch.held, held);
  bb_free(&c);
  bb_free(&zc);
  bb_free(&small);
  bb_free(&in);
  free(rnd);
}

/* A unary body with a Content-Length: the rest of it may be read into the
 * buffer that length sized. */
TEST(unary_read_into) {
  svc_reset(S_REPLY);
  open_call(&m_unary, "application/proto", NULL);
  bb req = lfr("/home/user", 3);
  F.x.content_length = (int64_t)req.len;
  size_t len = 0;
  ASSERT(F.x.h->body_into(&F.x, &len) == NULL); /* nothing allocated yet */
  feed(req.p, 2, 2);
  uint8_t *p = F.x.h->body_into(&F.x, &len);
  ASSERT(p != NULL);
  ASSERT_EQ(len, req.len - 2);
  memcpy(p, req.p + 2, len);
  hx_body(&F.x, p, len);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/home/user,3);");
  ASSERT_EQ(F.status, 200);
  bb_free(&req);
  fake_done();
}

TEST(server_stream_request) {
  /* byte by byte; the service starts only at body end */
  bb in = {0};
  bb_env_msg(&in, 0, lfr("/srv", 9));
  svc_reset(S_REPLY2);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&in, 1);
  ASSERT_STR_EQ(svc.log, "");
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/srv,9);");
  bb want = {0};
  bb_env_msg(&want, 0, chunk("one", "hi", 2));
  bb_env_msg(&want, 0, chunk("two", "hi", 2));
  bb_env_str(&want, 2, "{}");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+proto\n");
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);

  /* zero messages */
  svc_reset(S_REPLY);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_end();
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: expected one "
                    "request message, got none\"}}");
  /* two messages (in one write, and in two) */
  bb two = {0};
  bb_put(&two, in.p, in.len);
  bb_put(&two, in.p, in.len);
  for (int split = 0; split < 2; split++) {
    open_call(&m_sstream, "application/connect+proto", NULL);
    if (split) {
      feed_bb(&in, 0);
      feed_bb(&in, 0);
    } else {
      feed_bb(&two, 0);
    }
    feed_end();
    expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: expected "
                      "only one message, but got multiple\"}}");
  }
  ASSERT_STR_EQ(svc.log, "");
  bb_free(&two);
  bb_free(&in);
  fake_done();
}

TEST(truncated_envelope) {
  svc_reset(S_REPLY);
  /* length prefix says 10, 3 bytes follow */
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed("\x00\x00\x00\x00\x0a" "abc", 8, 100);
  ASSERT_EQ(F.nrespond, 0);
  feed_end();
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 8 bytes left over\"}}");
  ASSERT_STR_EQ(svc.log, "open;cancel(invalid_argument);");

  /* a partial header after a good message */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  bb in = {0};
  bb_env_msg(&in, 0, chunk("ok", "", 0));
  bb_put(&in, "\x00\x00\x00", 3);
  feed_bb(&in, 1);
  bb_free(&in);
  feed_end();
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 3 bytes left over\"}}");
  ASSERT_STR_EQ(svc.log, "open;msg(ok,0,0);cancel(invalid_argument);");

  /* server stream: the same text; the service never started */
  svc_reset(S_REPLY);
  open_call(&m_sstream, "application/connect+json", NULL);
  feed("\x00\x00\x00\x00\x10{}", 7, 100);
  feed_end();
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 7 bytes left over\"}}");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+json\n");
  ASSERT_STR_EQ(svc.log, "");

  /* exactly the cap in the prefix is not an error by itself */
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed("\x00\x01\x00\x00\x00" "0123456789", 15, 100);
  ASSERT_EQ(F.nrespond, 0);
  feed_end();
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 15 bytes left over\"}}");
  fake_done();
}

TEST(oversized_envelope) {
  svc_reset(S_REPLY);
  /* refused as soon as the header is seen, without waiting for the body */
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed("\x00\x01\x00\x00\x01", 5, 1);
  expect_stream_end("{\"error\":{\"code\":\"resource_exhausted\",\"message\":\"message size 16777217 is "
                    "larger than configured max 16777216\"}}");
  ASSERT_STR_EQ(svc.log, "open;cancel(resource_exhausted);");

  /* after a good envelope in the same write */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", NULL);
  bb in = {0};
  bb_env_msg(&in, 0, chunk("first", "x", 1));
  bb_put(&in, "\x01\xff\xff\xff\xff", 5);
  feed_bb(&in, 0);
  bb_free(&in);
  expect_stream_end("{\"error\":{\"code\":\"resource_exhausted\",\"message\":\"message size 4294967295 is "
                    "larger than configured max 16777216\"}}");
  ASSERT_STR_EQ(svc.log, "open;msg(first,1,120);cancel(resource_exhausted);");
  fake_done();
}

TEST(envelope_flags) {
  const uint8_t bad[] = {0x02, 0x03, 0x04, 0x08, 0x40, 0x80, 0x81, 0xff};
  for (size_t i = 0; i < sizeof bad; i++) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "gzip", NULL);
    bb in = {0};
    bb_env(&in, bad[i], "", 0);
    feed_bb(&in, 0);
    bb_free(&in);
    expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: invalid "
                      "envelope flags\"}}");
    ASSERT_STR_EQ(svc.log, "open;cancel(invalid_argument);");
  }
  fake_done();
}

TEST(stream_compression) {
  /* flag 0x01 without Connect-Content-Encoding */
  svc_reset(S_REPLY);
  bb m = chunk("z.txt", "zzzz", 4);
  bb z = gz(m.p, m.len);
  open_call(&m_cstream, "application/connect+proto", NULL);
  bb in = {0};
  bb_env(&in, 1, z.p, z.len);
  feed_bb(&in, 0);
  bb_free(&in);
  expect_stream_end("{\"error\":{\"code\":\"internal\",\"message\":\"protocol error: received compressed "
                    "message without encoding\"}}");
  ASSERT_STR_EQ(svc.log, "open;cancel(internal);");
  /* "identity" is no compression either */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "identity", NULL);
  bb_env(&in, 1, z.p, z.len);
  feed_bb(&in, 0);
  bb_free(&in);
  expect_stream_end("{\"error\":{\"code\":\"internal\",\"message\":\"protocol error: received compressed "
                    "message without encoding\"}}");

  /* with gzip: compressed and plain envelopes mixed, any split */
  bb_env(&in, 1, z.p, z.len);
  bb_env(&in, 0, m.p, m.len);
  bb_env(&in, 1, z.p, z.len);
  for (size_t step = 1; step <= in.len; step += (step < 8 ? 1 : 13)) {
    svc_reset(S_REPLY);
    open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "gzip", NULL);
    feed_bb(&in, step);
    feed_end();
    ASSERT_STR_EQ(svc.log, "open;msg(z.txt,4,488);msg(z.txt,4,488);msg(z.txt,4,488);end;");
    expect_post_ok(3);
  }
  bb_free(&in);

  /* bad gzip data in a compressed envelope */
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "gzip", NULL);
  bb_env(&in, 1, m.p, m.len);
  feed_bb(&in, 0);
  bb_free(&in);
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"invalid gzip data\"}}");
  ASSERT_STR_EQ(svc.log, "open;cancel(invalid_argument);");
  bb_free(&z);
  bb_free(&m);

  /* a small envelope that inflates past the cap */
  uint8_t *zeros = calloc(1, 17 * MIB);
  z = gz(zeros, 17 * MIB);
  free(zeros);
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+proto", "connect-content-encoding", "gzip", NULL);
  bb_env(&in, 1, z.p, z.len);
  feed_bb(&in, 0);
  bb_free(&in);
  bb_free(&z);
  expect_stream_end("{\"error\":{\"code\":\"resource_exhausted\",\"message\":\"message is larger than "
                    "configured max 16777216 bytes\"}}");
  fake_done();
}

TEST(stream_json_decode_error) {
  svc_reset(S_REPLY);
  open_call(&m_cstream, "application/connect+json", NULL);
  bb in = {0};
  bb_env_str(&in, 0, "{\"filepath\":\"j\",\"content\":\"aGVsbG8=\"}");
  bb_env_str(&in, 0, "{\"filepath\":");
  feed_bb(&in, 0);
  bb_free(&in);
  ASSERT_STR_EQ(svc.log, "open;msg(j,5,532);cancel(invalid_argument);");
  env e[4];
  ASSERT_EQ(envs(e, 4), 1);
  ASSERT_EQ(e[0].flags, 2);
  const char *pre = "{\"error\":{\"code\":\"invalid_argument\",\"message\":\"unmarshal into pb.FileChunk: ";
  ASSERT(e[0].len > strlen(pre));
  ASSERT_MEM_EQ(e[0].p, pre, strlen(pre));
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+json\n");
  fake_done();
}

/* ------------------------------------------------------------ Connect streaming: output */

TEST(stream_output_proto_and_json) {
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/o", 0));
  /* proto: rpc_send twice, rpc_finish OK */
  svc_reset(S_REPLY2);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&req, 0);
  feed_end();
  bb want = {0};
  bb_env_msg(&want, 0, chunk("one", "hi", 2));
  bb_env_msg(&want, 0, chunk("two", "hi", 2));
  bb_env_str(&want, 2, "{}");
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  ASSERT_EQ(F.clen, -1);
  bb_free(&want);

  /* zero-copy send: same bytes as rpc_send */
  svc_reset(S_PACKED);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(svc.packed_rc, 0);
  bb_env_msg(&want, 0, chunk("/o", "hi", 2));
  bb_env_str(&want, 2, "{}");
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);

  /* prefix + referenced tail: one envelope over both, the same bytes, the
   * tail's owner released exactly once */
  svc_reset(S_PACKED_REF);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(svc.packed_rc, 0);
  ASSERT_EQ(tail_ref.released, 1);
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);

  /* a tail is raw bytes: JSON calls cannot take one (refused, released once) */
  bb jreq = {0};
  bb_env_str(&jreq, 0, "{\"path\":\"/o\"}");
  svc_reset(S_PACKED_REF);
  open_call(&m_sstream, "application/connect+json", NULL);
  feed_bb(&jreq, 0);
  feed_end();
  ASSERT_EQ(svc.packed_rc, -1);
  ASSERT_EQ(tail_ref.released, 1);
  bb_free(&jreq);
  bb_free(&req);

  /* JSON */
  bb_env_str(&req, 0, "{\"path\":\"/o\"}");
  svc_reset(S_REPLY2);
  open_call(&m_sstream, "application/connect+json", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+json\n");
  bb_env_str(&want, 0, "{\"filepath\":\"one\",\"content\":\"aGk=\"}");
  bb_env_str(&want, 0, "{\"filepath\":\"two\",\"content\":\"aGk=\"}");
  bb_env_str(&want, 2, "{}");
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);

  /* no message, OK: only the end-of-stream envelope */
  svc_reset(S_EMPTY);
  open_call(&m_sstream, "application/connect+json", NULL);
  feed_bb(&req, 0);
  feed_end();
  bb_env_str(&want, 2, "{}");
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);

  /* a message, then an error: the error is in the end envelope, status 200 */
  svc_reset(S_REPLY_ERROR);
  svc.ecode = RPC_DATA_LOSS;
  svc.emsg = "lost \"it\"\n";
  open_call(&m_sstream, "application/connect+json", NULL);
  feed_bb(&req, 0);
  feed_end();
  env e[4];
  ASSERT_EQ(envs(e, 4), 2);
  ASSERT_EQ(e[0].flags, 0);
  expect_stream_end("{\"error\":{\"code\":\"data_loss\",\"message\":\"lost \\\"it\\\"\\n\"}}");

  svc_reset(S_ERROR);
  svc.ecode = RPC_UNAVAILABLE;
  svc.emsg = NULL;
  open_call(&m_sstream, "application/connect+json", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(envs(e, 4), 1);
  expect_stream_end("{\"error\":{\"code\":\"unavailable\"}}");
  bb_free(&req);
  fake_done();
}

/* rpc_defer_end: an error the layer raised is answered only when the
 * service says its cleanup is done; a peer gone meanwhile gets nothing and
 * the call is freed once (ASan checks). */
/* A client stream whose body ends inside an envelope, the service holding
 * the end (rpc_defer_end) in on_cancel: hold 1 keeps it in held_call,
 * hold 2 releases it at once. */
static void open_broken_held_stream(int hold) {
  svc_reset(S_REPLY);
  svc.hold_end = hold;
  held_call = NULL;
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed("\x00\x00\x00\x00\x0a" "abc", 8, 100);
  feed_end();
}

TEST(deferred_end) {
  open_broken_held_stream(1);
  ASSERT_STR_EQ(svc.log, "open;cancel(invalid_argument);");
  ASSERT(held_call != NULL);
  ASSERT_EQ(F.nend, 0); /* held */
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_EQ(F.nend, 0);
  rpc_end_deferred(held_call);
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 8 bytes left over\"}}");

  /* the peer goes away while the answer is held */
  open_broken_held_stream(1);
  ASSERT(held_call != NULL);
  F.x.ended = 1;
  F.x.h->on_abort(&F.x);
  ASSERT_EQ(F.nend, 0);
  rpc_end_deferred(held_call); /* frees; nothing to answer */
  ASSERT_EQ(F.nend, 0);
  fake_done();

  /* held and released inside on_cancel: the layer's answer as usual */
  open_broken_held_stream(2);
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: incomplete "
                    "envelope: 8 bytes left over\"}}");

  /* outside on_cancel rpc_defer_end does nothing */
  svc_reset(S_HOLD);
  open_call(&m_sstream, "application/connect+json", NULL);
  feed("\x00\x00\x00\x00\x02{}", 7, 100);
  feed_end();
  ASSERT(svc.call != NULL);
  rpc_defer_end(svc.call);
  rpc_finish(svc.call, RPC_OK, NULL);
  expect_stream_end("{}");
  fake_done();
}

/* ------------------------------------------------------------ backpressure */

TEST(pause_input) {
  size_t bd[4];
  bb in = three_chunks(bd);
  /* the service pauses in its first on_message */
  svc_reset(S_PAUSE_FIRST);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed_bb(&in, 0);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);");
  ASSERT_EQ(F.paused, 1);
  feed_end(); /* body end while paused: held back too */
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);");
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);");
  rpc_pause_input(svc.call, 0);
  ASSERT_EQ(F.paused, 0);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);"); /* deferred to the loop */
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  expect_post_ok(3);

  /* paused from the start; bytes arriving meanwhile are kept */
  svc_reset(S_PAUSE_OPEN);
  open_call(&m_cstream, "application/connect+proto", NULL);
  ASSERT_EQ(F.paused, 1);
  feed(in.p, bd[2], 1);
  ASSERT_STR_EQ(svc.log, "open;");
  rpc_pause_input(svc.call, 1); /* no-op: already paused */
  ASSERT_EQ(F.npause, 1);
  rpc_pause_input(svc.call, 0);
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);msg(,0,0);");
  feed(in.p + bd[2], in.len - bd[2], 7);
  feed_end();
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  expect_post_ok(3);

  /* pause and resume again before the loop runs: each message once */
  svc_reset(S_HOLD_END);
  open_call(&m_cstream, "application/connect+proto", NULL);
  rpc_pause_input(svc.call, 1);
  feed_bb(&in, 0);
  rpc_pause_input(svc.call, 0);
  rpc_pause_input(svc.call, 1);
  rpc_pause_input(svc.call, 0);
  feed_end();
  uv_run(loop, UV_RUN_NOWAIT);
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_STR_EQ(svc.log, three_chunks_log());
  rpc_finish(svc.call, RPC_OK, NULL);
  expect_stream_end("{}");
  bb_free(&in);
  fake_done();
}

static void drain_cb(rpc_call *c) { svc.drained++; }

TEST(drain_callback) {
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/d", 0));
  svc_reset(S_HOLD);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&req, 0);
  feed_end();
  bb_free(&req);
  rpc_call *c = svc.call;
  ASSERT(c != NULL);
  /* queue high: no callback until the transport drains */
  F.outq = RPC_OUTQ_HIGH;
  ASSERT_EQ(rpc_outq_bytes(c), RPC_OUTQ_HIGH);
  rpc_on_drain(c, drain_cb);
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_EQ(svc.drained, 0);
  F.x.h->on_drain(&F.x); /* still above HIGH/2 */
  ASSERT_EQ(svc.drained, 0);
  F.outq = RPC_OUTQ_HIGH / 2;
  F.x.h->on_drain(&F.x);
  ASSERT_EQ(svc.drained, 1);
  F.x.h->on_drain(&F.x); /* one-shot */
  ASSERT_EQ(svc.drained, 1);
  /* queue already low: runs from the loop, not inside rpc_on_drain */
  F.outq = 0;
  rpc_on_drain(c, drain_cb);
  ASSERT_EQ(svc.drained, 1);
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_EQ(svc.drained, 2);
  /* cancelled with NULL */
  rpc_on_drain(c, drain_cb);
  rpc_on_drain(c, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
  ASSERT_EQ(svc.drained, 2);
  send_chunk(c, "x");
  svc_done(c, RPC_OK, NULL);
  env e[4];
  ASSERT_EQ(envs(e, 4), 2);
  expect_stream_end("{}");
  fake_done();
}

/* ------------------------------------------------------------ deadlines */

/* Run the loop for about ms milliseconds. */
static void on_guard(uv_timer_t *t) { uv_close((uv_handle_t *)t, NULL); }
static void run_for(uint64_t ms) {
  uv_timer_t guard;
  uv_timer_init(loop, &guard);
  uv_timer_start(&guard, on_guard, ms, 0);
  uv_run(loop, UV_RUN_DEFAULT);
}

TEST(deadline) {
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/slow", 0));
  /* the service holds the call; the deadline cancels it */
  svc_reset(S_HOLD);
  open_call(&m_sstream, "application/connect+proto", "connect-timeout-ms", "1", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/slow,0);");
  ASSERT_EQ(svc.timeout, 1);
  uv_run(loop, UV_RUN_DEFAULT); /* until the timer fired and the call is gone */
  ASSERT_STR_EQ(svc.log, "req(/slow,0);cancel(deadline_exceeded);");
  ASSERT(svc.call == NULL);
  expect_stream_end("{\"error\":{\"code\":\"deadline_exceeded\",\"message\":\"the operation timed out\"}}");

  /* before the request body arrived: the service never starts */
  svc_reset(S_HOLD);
  open_call(&m_sstream, "application/connect+proto", "connect-timeout-ms", "1", NULL);
  feed(req.p, 3, 3);
  uv_run(loop, UV_RUN_DEFAULT);
  expect_stream_end("{\"error\":{\"code\":\"deadline_exceeded\",\"message\":\"the operation timed out\"}}");
  feed(req.p + 3, req.len - 3, 100); /* dropped: the exchange ended */
  feed_end();
  ASSERT_STR_EQ(svc.log, "");

  /* unary: 504; client stream in the middle of the upload */
  svc_reset(S_HOLD);
  open_call(&m_unary, "application/proto", "connect-timeout-ms", "1", NULL);
  feed_end();
  uv_run(loop, UV_RUN_DEFAULT);
  expect_unary(504, "{\"code\":\"deadline_exceeded\",\"message\":\"the operation timed out\"}");
  ASSERT_STR_EQ(svc.log, "req(,0);cancel(deadline_exceeded);");
  svc_reset(S_HOLD_END);
  open_call(&m_cstream, "application/connect+proto", "connect-timeout-ms", "2", NULL);
  feed("\x00\x00\x00\x00\x00", 5, 5);
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_STR_EQ(svc.log, "open;msg(,0,0);cancel(deadline_exceeded);");
  expect_stream_end("{\"error\":{\"code\":\"deadline_exceeded\",\"message\":\"the operation timed out\"}}");

  /* finished in time: the timer is stopped, nothing more happens */
  svc_reset(S_REPLY);
  open_call(&m_sstream, "application/connect+proto", "connect-timeout-ms", "5", NULL);
  feed_bb(&req, 0);
  feed_end();
  run_for(20);
  ASSERT_STR_EQ(svc.log, "req(/slow,0);");
  expect_stream_end("{}");

  /* RPC_F_OWN_DEADLINE: the layer leaves the call alone */
  svc_reset(S_HOLD);
  open_call(&m_sstream_own, "application/connect+proto", "connect-timeout-ms", "1", NULL);
  feed_bb(&req, 0);
  feed_end();
  run_for(20);
  ASSERT_STR_EQ(svc.log, "req(/slow,0);");
  ASSERT_EQ(svc.timeout, 1);
  ASSERT(svc.call != NULL);
  svc_done(svc.call, RPC_DEADLINE_EXCEEDED, "process timed out");
  expect_stream_end("{\"error\":{\"code\":\"deadline_exceeded\",\"message\":\"process timed out\"}}");
  bb_free(&req);
  fake_done();
}

/* ------------------------------------------------------------ transport abort */

TEST(abort_while_service_holds) {
  /* client stream in the middle of the upload */
  svc_reset(S_HOLD_END);
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed("\x00\x00\x00\x00\x00", 5, 5);
  peer_abort();
  ASSERT_STR_EQ(svc.log, "open;msg(,0,0);cancel(canceled);");
  ASSERT(svc.call == NULL);
  ASSERT_EQ(F.nrespond, 0);
  ASSERT_EQ(F.nend, 0);
  uv_run(loop, UV_RUN_DEFAULT);

  /* server stream after some output, with a drain callback and a resume pending */
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/ab", 0));
  svc_reset(S_HOLD);
  open_call(&m_sstream, "application/connect+proto", "connect-timeout-ms", "100000", NULL);
  feed_bb(&req, 0);
  feed_end();
  send_chunk(svc.call, "partial");
  rpc_on_drain(svc.call, drain_cb);
  peer_abort();
  ASSERT_STR_EQ(svc.log, "req(/ab,0);cancel(canceled);");
  uv_run(loop, UV_RUN_DEFAULT); /* returns: no timer left behind */
  ASSERT_EQ(svc.drained, 0);
  ASSERT_EQ(svc.send_fail, 0);

  /* unary held by the service */
  svc_reset(S_HOLD);
  open_call(&m_unary, "application/json", NULL);
  feed("{}", 2, 2);
  feed_end();
  peer_abort();
  ASSERT_STR_EQ(svc.log, "req(,0);cancel(canceled);");
  ASSERT_EQ(F.nrespond, 0);
  uv_run(loop, UV_RUN_DEFAULT);

  /* paused client stream with a resume pending */
  svc_reset(S_PAUSE_FIRST);
  open_call(&m_cstream, "application/connect+proto", NULL);
  size_t bd[4];
  bb in = three_chunks(bd);
  feed_bb(&in, 0);
  rpc_pause_input(svc.call, 0);
  peer_abort();
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_STR_EQ(svc.log, "open;msg(a.txt,5,532);cancel(canceled);");
  bb_free(&in);
  bb_free(&req);
  fake_done();
}

TEST(abort_before_service) {
  /* server stream: a complete request message held, body not ended */
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/held", 0));
  svc_reset(S_REPLY);
  open_call(&m_sstream, "application/connect+proto", NULL);
  feed_bb(&req, 0);
  peer_abort();
  uv_run(loop, UV_RUN_DEFAULT);
  /* unary: part of the body buffered */
  open_call(&m_unary, "application/proto", NULL);
  feed(req.p, req.len, 2);
  peer_abort();
  uv_run(loop, UV_RUN_DEFAULT);
  /* streaming: part of an envelope buffered */
  open_call(&m_cstream, "application/connect+proto", NULL);
  feed("\x00\x00\x00\x01\x00zz", 7, 7);
  peer_abort();
  ASSERT_STR_EQ(svc.log, "open;cancel(canceled);");
  ASSERT_EQ(F.nrespond, 0);
  bb_free(&req);
  fake_done();
}

/* ------------------------------------------------------------ gRPC, gRPC-Web */

TEST(grpc) {
  svc_reset(S_REPLY2);
  open_grpc(&m_sstream, "application/grpc", 0, NULL);
  ASSERT_EQ(F.status, 415);
  ASSERT_STR_EQ((char *)F.body.p, "gRPC requires HTTP/2\n");

  /* trailers-only error: status in the response headers, no body */
  fake_new("POST", m_unary.path, "content-type", "application/grpc", NULL);
  F.x.http2 = 1;
  connect_serve(&F.x, &m_unary);
  ASSERT_EQ(F.status, 200);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc\ngrpc-status: 16\ngrpc-message: agent token is "
                        "required\n");
  ASSERT_EQ(F.body.len, 0);
  ASSERT_EQ(F.nend, 1);
  ASSERT_STR_EQ(F.trailers, "");

  /* Connect-Protocol-Version does not matter to gRPC */
  open_grpc(&m_unary, "application/grpc+proto", 1, "connect-protocol-version", "7", "grpc-timeout", "1x",
            NULL);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc\ngrpc-status: 3\ngrpc-message: protocol error: "
                        "invalid timeout 1x\n");

  /* success: messages, then grpc-status 0 in the trailers */
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/g", 0));
  open_grpc(&m_sstream, "application/grpc", 1, NULL);
  feed_bb(&req, 1);
  feed_end();
  ASSERT_STR_EQ(svc.proto, "grpc+proto");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc\ngrpc-accept-encoding: gzip\n");
  bb want = {0};
  bb_env_msg(&want, 0, chunk("one", "hi", 2));
  bb_env_msg(&want, 0, chunk("two", "hi", 2));
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);
  ASSERT_STR_EQ(F.trailers, "grpc-status: 0\n");

  /* a unary method over gRPC: one enveloped request, one enveloped answer */
  svc_reset(S_REPLY);
  open_grpc(&m_unary, "application/grpc", 1, NULL);
  feed_bb(&req, 0);
  feed_end();
  bb_env_msg(&want, 0, chunk("/g", "hi", 2));
  ASSERT_EQ(F.body.len, want.len);
  ASSERT_MEM_EQ(F.body.p, want.p, want.len);
  bb_free(&want);
  ASSERT_STR_EQ(F.trailers, "grpc-status: 0\n");

  /* error after a message: trailers, grpc-message percent-encoded */
  svc_reset(S_REPLY_ERROR);
  svc.ecode = RPC_NOT_FOUND;
  svc.emsg = "50% caf\xc3\xa9\n";
  open_grpc(&m_sstream, "application/grpc", 1, NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.trailers, "grpc-status: 5\ngrpc-message: 50%25 caf%C3%A9%0A\n");

  /* error before any message: trailers-only */
  svc_reset(S_ERROR);
  svc.ecode = RPC_PERMISSION_DENIED;
  svc.emsg = "no";
  open_grpc(&m_sstream, "application/grpc", 1, NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc\ngrpc-status: 7\ngrpc-message: no\n");
  ASSERT_EQ(F.body.len, 0);
  ASSERT_STR_EQ(F.trailers, "");

  /* grpc-encoding gzip */
  svc_reset(S_REPLY);
  bb m = lfr("/gz", 4);
  bb z = gz(m.p, m.len);
  bb_free(&m);
  bb zin = {0};
  bb_env(&zin, 1, z.p, z.len);
  bb_free(&z);
  open_grpc(&m_sstream, "application/grpc", 1, "grpc-encoding", "gzip", NULL);
  feed_bb(&zin, 3);
  feed_end();
  bb_free(&zin);
  ASSERT_STR_EQ(svc.log, "req(/gz,4);");
  ASSERT_STR_EQ(F.trailers, "grpc-status: 0\n");

  /* grpc-timeout units */
  struct {
    const char *v;
    int64_t ms;
  } to[] = {{"5m", 5}, {"2S", 2000}, {"3M", 180000}, {"1H", 3600000}, {"1500u", 2}, {"1n", 1},
            {"99999999m", 99999999}};
  for (size_t i = 0; i < sizeof to / sizeof *to; i++) {
    svc_reset(S_REPLY);
    open_grpc(&m_sstream, "application/grpc", 1, "grpc-timeout", to[i].v, NULL);
    feed_bb(&req, 0);
    feed_end();
    ASSERT_EQ(svc.timeout, to[i].ms);
  }
  const char *badto[] = {"5", "m", "5s", "123456789m", "-5m", "5 m"};
  for (size_t i = 0; i < sizeof badto / sizeof *badto; i++) {
    open_grpc(&m_sstream, "application/grpc", 1, "grpc-timeout", badto[i], NULL);
    char want_h[200];
    snprintf(want_h, sizeof want_h,
             "content-type: application/grpc\ngrpc-status: 3\ngrpc-message: protocol error: invalid "
             "timeout %s\n",
             badto[i]);
    ASSERT_STR_EQ(F.hdrs, want_h);
  }
  bb_free(&req);
  fake_done();
}

/* The gRPC-Web trailer frame at the end of the body. */
static void expect_grpc_web_trailer(const char *text) {
  env e[8];
  size_t n = envs(e, 8);
  ASSERT(n >= 1);
  ASSERT_EQ(e[n - 1].flags, 0x80);
  ASSERT_EQ(e[n - 1].len, strlen(text));
  ASSERT_MEM_EQ(e[n - 1].p, text, strlen(text));
  ASSERT_EQ(F.status, 200);
  ASSERT_EQ(F.nend, 1);
  ASSERT_STR_EQ(F.trailers, "");
}

TEST(grpc_web) {
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/w", 0));
  svc_reset(S_REPLY);
  open_grpc(&m_sstream, "application/grpc-web+proto", 0, NULL);
  feed_bb(&req, 2);
  feed_end();
  ASSERT_STR_EQ(svc.proto, "grpc-web+proto");
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc-web+proto\ngrpc-accept-encoding: gzip\n");
  env e[4];
  ASSERT_EQ(envs(e, 4), 2);
  bb m = chunk("/w", "hi", 2);
  ASSERT_EQ(e[0].flags, 0);
  ASSERT_EQ(e[0].len, m.len);
  ASSERT_MEM_EQ(e[0].p, m.p, m.len);
  bb_free(&m);
  expect_grpc_web_trailer("grpc-status: 0\r\n");

  svc_reset(S_ERROR);
  svc.ecode = RPC_NOT_FOUND;
  svc.emsg = "no such file: \"/w\"";
  open_grpc(&m_sstream, "application/grpc-web", 0, NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc-web+proto\ngrpc-accept-encoding: gzip\n");
  ASSERT_EQ(envs(e, 4), 1);
  expect_grpc_web_trailer("grpc-status: 5\r\ngrpc-message: no such file: \"/w\"\r\n");

  /* auth failure (no token), JSON flavour */
  fake_new("POST", m_unary.path, "content-type", "application/grpc-web+json", NULL);
  connect_serve(&F.x, &m_unary);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc-web+json\ngrpc-accept-encoding: gzip\n");
  ASSERT_EQ(envs(e, 4), 1);
  expect_grpc_web_trailer("grpc-status: 16\r\ngrpc-message: agent token is required\r\n");

  /* deadline over gRPC-Web */
  svc_reset(S_HOLD);
  open_grpc(&m_sstream, "application/grpc-web+proto", 0, "grpc-timeout", "1m", NULL);
  feed_bb(&req, 0);
  feed_end();
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_STR_EQ(svc.log, "req(/w,0);cancel(deadline_exceeded);");
  expect_grpc_web_trailer("grpc-status: 4\r\ngrpc-message: the operation timed out\r\n");
  bb_free(&req);
  fake_done();
}

/* ------------------------------------------------------------ response compression */

/* The service of these tests: on request, the messages of gz_plan in
 * order (content sizes; a negative size is a rpc_send_bytes_tail of that
 * many bytes, never compressed), then (gz_room) a room check, then OK. */
static long gz_plan[8];
static size_t gz_nplan;
static int gz_room, gz_room_rc;
static uint8_t gz_fill[200000];
static size_t gz_outq_seen;

static void gz_on_room(rpc_call *c) {
  logf_("room;");
  svc_done(c, RPC_OK, NULL);
}

static void gz_on_request(rpc_call *c, const ProtobufCMessage *req) {
  svc.call = c;
  for (size_t i = 0; i < gz_nplan; i++) {
    if (gz_plan[i] >= 0) {
      Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
      ch.filepath = "g";
      ch.content.data = gz_fill;
      ch.content.len = (size_t)gz_plan[i];
      if (rpc_send(c, &ch.base) != 0) svc.send_fail++;
    } else { /* header "g" + content by reference */
      size_t n = (size_t)-gz_plan[i];
      bb m = chunk("g", gz_fill, n);
      size_t hl = m.len - n, off = 8;
      uint8_t *buf = malloc(off + hl);
      memcpy(buf + off, m.p, hl);
      tail_ref.released = 0;
      if (rpc_send_bytes_tail(c, buf, buf + off, hl, gz_fill, n, &tail_ref.ref) != 0) svc.send_fail++;
      bb_free(&m);
    }
  }
  gz_outq_seen = rpc_outq_bytes(c);
  if (gz_room) {
    gz_room_rc = rpc_out_room(c, 10, gz_on_room);
    if (!gz_room_rc) return;
  }
  svc_done(c, RPC_OK, NULL);
}

static const rpc_method m_gz_unary = {"/pb.FileService/ListFiles", RPC_UNARY,
                                      &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                      0, gz_on_request, NULL, NULL, svc_on_cancel};
static const rpc_method m_gz_stream = {"/pb.FileService/GetFileStream", RPC_SERVER_STREAM,
                                       &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                       0, gz_on_request, NULL, NULL, svc_on_cancel};

static void gz_set(const long *plan, size_t n) {
  svc_reset(S_HOLD);
  memcpy(gz_plan, plan, n * sizeof *plan);
  gz_nplan = n;
  gz_room = gz_room_rc = 0;
  gz_outq_seen = 0;
  for (size_t i = 0; i < sizeof gz_fill; i++) gz_fill[i] = (uint8_t)("conch-init "[i % 11]);
}

static bb gunzip_bb(const uint8_t *p, size_t n) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) abort();
  bb o = {0};
  o.cap = 4 * MIB;
  o.p = malloc(o.cap);
  z.next_in = (Bytef *)p;
  z.avail_in = (uInt)n;
  z.next_out = o.p;
  z.avail_out = (uInt)o.cap;
  int r = inflate(&z, Z_FINISH);
  o.len = z.total_out;
  inflateEnd(&z);
  if (r != Z_STREAM_END) o.len = (size_t)-1;
  return o;
}

/* Envelope i is a chunk of content size n (compressed when flags say). */
static void expect_chunk(const env *e, size_t n, int compressed) {
  ASSERT_EQ(e->flags, compressed ? 1 : 0);
  bb m = chunk("g", gz_fill, n);
  if (compressed) {
    bb d = gunzip_bb(e->p, e->len);
    ASSERT_EQ(d.len, m.len);
    ASSERT_MEM_EQ(d.p, m.p, m.len);
    ASSERT(e->len < m.len / 4);
    bb_free(&d);
  } else {
    ASSERT_EQ(e->len, m.len);
    ASSERT_MEM_EQ(e->p, m.p, m.len);
  }
  bb_free(&m);
}

TEST(response_gzip_stream_order) {
  /* small, loop-deflated, pool-deflated, small, pool, small: in order,
   * the end after the last, flag 0x01 exactly from 1 KiB on */
  static const long plan[] = {10, 5000, 150000, 20, 60000, 3};
  gz_set(plan, 6);
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/g", 0));
  open_call(&m_gz_stream, "application/connect+proto", "connect-accept-encoding", "br, gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT(gz_outq_seen >= 150000); /* queued behind the pool deflate: counted */
  ASSERT_EQ(F.nend, 0);           /* the end waits for the deflates */
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+proto\nconnect-content-encoding: gzip\n");
  env e[16];
  ASSERT_EQ(envs(e, 16), 7);
  for (size_t i = 0; i < 6; i++) expect_chunk(&e[i], (size_t)plan[i], plan[i] >= 1024);
  expect_stream_end("{}");
  ASSERT_EQ(svc.send_fail, 0);

  /* not accepted: the same messages as they are, no header */
  gz_set(plan, 6);
  open_call(&m_gz_stream, "application/connect+proto", "connect-accept-encoding", "identity", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(F.nend, 1); /* nothing waits */
  ASSERT_STR_EQ(F.hdrs, "content-type: application/connect+proto\n");
  ASSERT_EQ(envs(e, 16), 7);
  for (size_t i = 0; i < 6; i++) expect_chunk(&e[i], (size_t)plan[i], 0);
  bb_free(&req);
  fake_done();
}

TEST(response_gzip_packed_ref_queued) {
  /* a by-reference message behind a pool deflate: queued in order, never
   * compressed, its tail released once; rpc_out_room waits for the queue */
  static const long plan[] = {100000, -3000, 2000};
  gz_set(plan, 3);
  gz_room = 1;
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/g", 0));
  open_call(&m_gz_stream, "application/connect+proto", "connect-accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(gz_room_rc, 0);
  ASSERT_EQ(tail_ref.released, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_STR_EQ(svc.log, "room;");
  ASSERT_EQ(tail_ref.released, 1);
  env e[8];
  ASSERT_EQ(envs(e, 8), 4);
  expect_chunk(&e[0], 100000, 1);
  expect_chunk(&e[1], 3000, 0);
  expect_chunk(&e[2], 2000, 1);
  expect_stream_end("{}");
  bb_free(&req);
  fake_done();
}

TEST(response_gzip_abort_while_deflating) {
  /* the peer goes while the pool deflates: nothing more is written, the
   * call and every queued buffer are freed once the job returns (ASan) */
  static const long plan[] = {10, 150000, -3000, 20};
  gz_set(plan, 4);
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/g", 0));
  open_call(&m_gz_stream, "application/connect+proto", "connect-accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  size_t before = F.body.len;
  peer_abort();
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_EQ(F.body.len, before);
  ASSERT_EQ(F.nend, 0);
  ASSERT_EQ(tail_ref.released, 1);
  env e[4];
  ASSERT_EQ(envs(e, 4), 1);
  expect_chunk(&e[0], 10, 0);
  bb_free(&req);
  fake_done();
}

TEST(response_gzip_unary) {
  bb req = lfr("/g", 0);
  /* big: deflated in the pool, Content-Encoding and the compressed length */
  static const long big1[] = {150000};
  gz_set(big1, 1);
  open_call(&m_gz_unary, "application/proto", "accept-encoding", "deflate, gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(F.nrespond, 0);
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_EQ(F.status, 200);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/proto\ncontent-encoding: gzip\n");
  ASSERT_EQ(F.clen, (int64_t)F.body.len);
  bb m = chunk("g", gz_fill, 150000);
  bb d = gunzip_bb(F.body.p, F.body.len);
  ASSERT_EQ(d.len, m.len);
  ASSERT_MEM_EQ(d.p, m.p, m.len);
  bb_free(&d);
  bb_free(&m);
  /* between 1 and 32 KiB: deflated at once */
  static const long mid[] = {3000};
  gz_set(mid, 1);
  open_call(&m_gz_unary, "application/proto", "accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_EQ(F.nend, 1);
  ASSERT_STR_EQ(F.hdrs, "content-type: application/proto\ncontent-encoding: gzip\n");
  /* under 1 KiB, or not accepted: as it is */
  static const long small[] = {100};
  gz_set(small, 1);
  open_call(&m_gz_unary, "application/proto", "accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/proto\n");
  gz_set(big1, 1);
  open_call(&m_gz_unary, "application/proto", "accept-encoding", "gzip;q=0", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/proto\n");
  ASSERT_EQ(F.clen, (int64_t)F.body.len);
  /* the peer gone while the answer deflates */
  gz_set(big1, 1);
  open_call(&m_gz_unary, "application/proto", "accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  peer_abort();
  uv_run(loop, UV_RUN_DEFAULT);
  ASSERT_EQ(F.nrespond, 0);
  /* errors are never compressed */
  svc_reset(S_ERROR);
  svc.ecode = RPC_NOT_FOUND;
  svc.emsg = "path not found: /g";
  open_call(&m_unary, "application/json", "accept-encoding", "gzip", NULL);
  feed("{\"path\":\"/g\"}", 13, 100);
  feed_end();
  expect_unary(404, "{\"code\":\"not_found\",\"message\":\"path not found: /g\"}");
  bb_free(&req);
  fake_done();
}

TEST(response_gzip_grpc) {
  static const long plan[] = {5000, 100};
  bb req = {0};
  bb_env_msg(&req, 0, lfr("/g", 0));
  gz_set(plan, 2);
  open_grpc(&m_gz_stream, "application/grpc", 1, "grpc-accept-encoding", "identity,deflate,gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs, "content-type: application/grpc\ngrpc-accept-encoding: gzip\ngrpc-encoding: gzip\n");
  env e[4];
  ASSERT_EQ(envs(e, 4), 2);
  expect_chunk(&e[0], 5000, 1);
  expect_chunk(&e[1], 100, 0);
  ASSERT_STR_EQ(F.trailers, "grpc-status: 0\n");
  /* gRPC-Web: the trailer frame is never compressed */
  gz_set(plan, 2);
  open_grpc(&m_gz_stream, "application/grpc-web+proto", 0, "grpc-accept-encoding", "gzip", NULL);
  feed_bb(&req, 0);
  feed_end();
  ASSERT_STR_EQ(F.hdrs,
                "content-type: application/grpc-web+proto\ngrpc-accept-encoding: gzip\ngrpc-encoding: gzip\n");
  ASSERT_EQ(envs(e, 4), 3);
  expect_chunk(&e[0], 5000, 1);
  expect_grpc_web_trailer("grpc-status: 0\r\n");
  bb_free(&req);
  fake_done();
}

/* Found by this suite, fixed since:
 *
 * 1. Error JSON carries the message bytes verbatim: a message that is not
 *    valid UTF-8 (a file name from disk, an echoed header value, or a
 *    %.200s / rpc_finishf cut inside a multi-byte character) yields a body
 *    that is not valid JSON (RFC 8259 §8.1).  connect-go / encoding/json
 *    emit \ufffd for such bytes (so does proto/text.h). */
TEST(bug_error_json_utf8) {
  svc_reset(S_ERROR);
  svc.ecode = RPC_NOT_FOUND;
  svc.emsg = "no such file: /tmp/\xff";
  open_call(&m_unary, "application/proto", NULL);
  feed_end();
  expect_unary(404, "{\"code\":\"not_found\",\"message\":\"no such file: /tmp/\\ufffd\"}");
  /* an echoed header value, streaming */
  fake_new("POST", m_sstream.path, "content-type", "application/connect+proto",
           "connect-protocol-version", "\xe9", "conch-init-token", TOKEN, NULL);
  connect_serve(&F.x, &m_sstream);
  expect_stream_end("{\"error\":{\"code\":\"invalid_argument\",\"message\":\"Connect-Protocol-Version "
                    "must be \\\"1\\\": got \\\"\\ufffd\\\"\"}}");
  fake_done();
}

/* 2. A gzip body made of several members (RFC 1952 §2.2; Go's gzip.Reader
 *    reads them all) is cut after the first member without an error: here
 *    the depth field is silently lost. */
TEST(bug_gzip_multi_member) {
  svc_reset(S_REPLY);
  bb m = lfr("/multi", 5); /* 0a 06 "/multi" | 10 05 */
  ASSERT_EQ(m.len, 10);
  bb z1 = gz(m.p, 8), z2 = gz(m.p + 8, 2), body = {0};
  bb_put(&body, z1.p, z1.len);
  bb_put(&body, z2.p, z2.len);
  open_call(&m_unary, "application/proto", "content-encoding", "gzip", NULL);
  feed_bb(&body, 0);
  feed_end();
  ASSERT_STR_EQ(svc.log, "req(/multi,5);");
  bb_free(&m);
  bb_free(&z1);
  bb_free(&z2);
  bb_free(&body);
  fake_done();
}

/* 3. rpc_send of a message over RPC_MAX_MESSAGE returns -1 without calling
 *    back into the service (rpc.h); the service then ends the call itself
 *    (proc/service.c List and SendSignal once left the client waiting). */
TEST(bug_rpc_send_oversize_no_cancel) {
  svc_reset(S_SEND_HUGE);
  open_call(&m_unary, "application/proto", NULL);
  feed_end();
  ASSERT_EQ(svc.send_fail, 1);
  expect_unary(429, "{\"code\":\"resource_exhausted\",\"message\":\"message is larger than configured "
                    "max 16777216 bytes\"}");
  fake_done();
}

/* rpc_encode: both codecs leave RPC_HEADROOM free in front of the
 * message (rpc_send_bytes writes the framing there); a NULL data fails the
 * send and still releases the owner (ASan: no leak). */
TEST(encode_headroom) {
  char longp[400];
  memset(longp, 'b', sizeof longp - 1);
  longp[sizeof longp - 1] = 0;
  Pb__GetFileRequest g = PB__GET_FILE_REQUEST__INIT;
  g.filepath = longp;
  for (int json = 0; json <= 1; json++) {
    size_t n = 0;
    uint8_t *r = rpc_encode(json, &g.base, &n);
    ASSERT(r != NULL);
    ASSERT(n >= sizeof longp - 1);
    ASSERT(memchr(r, 'b', RPC_HEADROOM) == NULL);
    ASSERT(memchr(r + RPC_HEADROOM, 'b', n) != NULL);
    if (json) ASSERT(r[RPC_HEADROOM] == '{');
    else ASSERT(r[RPC_HEADROOM] == 0x0a);
    free(r);
  }
}

/* A client stream whose service sends a message the pool deflates, then
 * holds: the layer's error then comes while the deflate is out. */
static void gz_cstream_open(rpc_call *c, const ProtobufCMessage *req) {
  (void)req;
  svc.call = c;
  logf_("open;");
  Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
  ch.filepath = "g";
  ch.content.data = gz_fill;
  ch.content.len = 150000;
  if (rpc_send(c, &ch.base) != 0) svc.send_fail++;
}
static const rpc_method m_gz_cstream = {"/pb.FileService/PostFileStream", RPC_CLIENT_STREAM,
                                        &pb__file_chunk__descriptor, &pb__file_chunk__descriptor,
                                        0, gz_cstream_open, svc_on_message, svc_on_input_end,
                                        svc_on_cancel};

TEST(error_waits_behind_deflate) {
  /* CANCELLING → FLUSHING: bad input cancels the service while its
   * message deflates; the error goes after the message, once */
  static const char end[] = "{\"error\":{\"code\":\"invalid_argument\",\"message\":\"protocol error: "
                            "invalid envelope flags\"}}";
  for (int hold = 0; hold <= 1; hold++) {
    svc_reset(S_HOLD);
    svc.hold_end = hold;
    held_call = NULL;
    open_call(&m_gz_cstream, "application/connect+proto", "connect-accept-encoding", "gzip", NULL);
    feed("\x04\x00\x00\x00\x00", 5, 100);
    ASSERT_STR_EQ(svc.log, "open;cancel(invalid_argument);");
    if (hold) { /* HELD → FLUSHING: the service's cleanup ends before the deflate */
      ASSERT(held_call != NULL);
      rpc_end_deferred(held_call);
    }
    ASSERT_EQ(F.nend, 0); /* the end waits for the deflate */
    uv_run(loop, UV_RUN_DEFAULT);
    env e[4];
    ASSERT_EQ(envs(e, 4), 2);
    expect_chunk(&e[0], 150000, 1);
    expect_stream_end(end);
    ASSERT_EQ(svc.send_fail, 0);
    fake_done();
  }
}

/* ------------------------------------------------------------ a replaced token */

/* Several calls at once, each on an exchange of its own beside F; the
 * service holds every call and logs its cancels (api.md §4: a token is
 * checked for the whole life of what it opened). */
enum { TK_SS, TK_CS, TK_RD, TK_UN, TK_DONE, TK_NEW, TK_N };
static struct {
  fake g[TK_N];
  rpc_call *c[TK_N];
  int next; /* the index the next on_request belongs to */
  rpc_call *held;
  char log[256];
} tk;

static void tk_on_request(rpc_call *c, const ProtobufCMessage *req) {
  (void)req;
  rpc_set_user(c, (void *)(intptr_t)tk.next);
  tk.c[tk.next] = c;
}
static void tk_on_cancel(rpc_call *c, rpc_code why) {
  int i = (int)(intptr_t)rpc_user(c);
  size_t l = strlen(tk.log);
  snprintf(tk.log + l, sizeof tk.log - l, "cancel(%d,%s);", i, rpc_code_name(why));
  tk.c[i] = NULL;
  if (i == TK_CS) { /* as an upload does: the answer waits for its cleanup */
    rpc_defer_end(c);
    tk.held = c;
  }
}
static const rpc_method m_tk_unary = {"/pb.FileService/ListFiles", RPC_UNARY,
                                      &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                      0, tk_on_request, NULL, NULL, tk_on_cancel};
static const rpc_method m_tk_ss = {"/pb.FileService/GetFileStream", RPC_SERVER_STREAM,
                                   &pb__list_files_request__descriptor, &pb__file_chunk__descriptor,
                                   0, tk_on_request, NULL, NULL, tk_on_cancel};
static const rpc_method m_tk_cs = {"/pb.FileService/PostFileStream", RPC_CLIENT_STREAM,
                                   &pb__file_chunk__descriptor, &pb__post_files_response__descriptor,
                                   0, tk_on_request, NULL, NULL, tk_on_cancel};

/* Open call i with token tok; a server stream or unary call gets its one
 * request (the body's end too unless `reading`). */
static void tk_open(int i, const rpc_method *m, const char *tok, int reading) {
  fake *g = &tk.g[i];
  memset(g, 0, sizeof *g);
  g->used = 1;
  g->x.ops = &fk_ops;
  g->x.method = strdup("POST");
  g->x.path = strdup(m->path);
  g->x.content_length = -1;
  const char *ct = m->kind == RPC_UNARY ? "application/proto" : "application/connect+proto";
  hx_add_header(&g->x, "content-type", 12, ct, strlen(ct));
  hx_add_header(&g->x, "connect-protocol-version", 24, "1", 1);
  hx_add_header(&g->x, "conch-init-token", 16, tok, strlen(tok));
  tk.next = i;
  connect_serve(&g->x, m);
  if (m->kind == RPC_CLIENT_STREAM) return;
  bb msg = lfr("/tk", 1), in = {0};
  if (m->kind == RPC_UNARY) bb_put(&in, msg.p, msg.len);
  else bb_env(&in, 0, msg.p, msg.len);
  g->x.h->on_body(&g->x, in.p, in.len);
  if (!reading) g->x.h->on_body_end(&g->x);
  bb_free(&msg);
  bb_free(&in);
}

/* The Connect end-of-stream JSON of call i ("" when not ended). */
static const char *tk_end(int i) {
  static char out[256];
  fake *g = &tk.g[i];
  out[0] = 0;
  if (!g->nend) return out;
  size_t off = 0, last = 0, len = 0;
  while (g->body.len - off >= 5) {
    const uint8_t *h = g->body.p + off;
    size_t n = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
    last = off + 5;
    len = n;
    off += 5 + n;
  }
  ASSERT(len < sizeof out);
  memcpy(out, g->body.p + last, len);
  out[len] = 0;
  return out;
}

static void tk_done(int i) {
  fake *g = &tk.g[i];
  if (!g->x.ended && g->x.h && g->x.h->on_abort) {
    g->x.ended = 1;
    g->x.h->on_abort(&g->x);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  hx_free_request(&g->x);
  bb_free(&g->body);
}

#define TK_REPLACED "{\"error\":{\"code\":\"unauthenticated\",\"message\":\"agent token was replaced\"}}"

/* A replaced token ends exactly the streaming calls opened with an older
 * one — served (their on_cancel runs: RPC_UNAUTHENTICATED), held by the
 * service's cleanup (answered after it), or still reading their request —
 * and none of the others: a unary call, a call already over, a stream
 * opened with the new token.  The same token set again ends nothing. */
TEST(token_replaced_ends_old_streams) {
  memset(&tk, 0, sizeof tk);
  daemon_set_token(TOKEN, strlen(TOKEN));
  tk_open(TK_SS, &m_tk_ss, TOKEN, 0);
  tk_open(TK_CS, &m_tk_cs, TOKEN, 0);
  tk_open(TK_RD, &m_tk_ss, TOKEN, 1);
  tk_open(TK_UN, &m_tk_unary, TOKEN, 0);
  tk_open(TK_DONE, &m_tk_ss, TOKEN, 0);
  ASSERT(tk.c[TK_SS] && tk.c[TK_CS] && tk.c[TK_UN] && tk.c[TK_DONE] && !tk.c[TK_RD]);
  rpc_finish(tk.c[TK_DONE], RPC_OK, NULL);
  ASSERT_STR_EQ(tk_end(TK_DONE), "{}");
  uv_run(loop, UV_RUN_NOWAIT); /* the ended call is freed */

  ASSERT_EQ(daemon_set_token(TOKEN, strlen(TOKEN)), 0); /* the same token: nothing ends */
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  ASSERT_EQ(tk.g[TK_SS].nend + tk.g[TK_CS].nend + tk.g[TK_RD].nend + tk.g[TK_UN].nend, 0);

  ASSERT_EQ(daemon_set_token("n3w-token", 9), 1);
  tk_open(TK_NEW, &m_tk_ss, "n3w-token", 0);
  ASSERT(tk.c[TK_NEW] != NULL);
  ASSERT_EQ(tokhold_revoke_stale(), 3); /* SS, CS, RD: in the order they authenticated */
  ASSERT_STR_EQ(tk.log, "cancel(0,unauthenticated);cancel(1,unauthenticated);");
  ASSERT_STR_EQ(tk_end(TK_SS), TK_REPLACED);
  ASSERT_EQ(tk.g[TK_SS].status, 200);
  ASSERT_STR_EQ(tk_end(TK_RD), TK_REPLACED);
  ASSERT_EQ(tk.g[TK_CS].nend, 0); /* held: answered after its cleanup */
  ASSERT(tk.held != NULL);
  rpc_end_deferred(tk.held);
  ASSERT_STR_EQ(tk_end(TK_CS), TK_REPLACED);
  /* the unary call and the new token's stream go on, and finish */
  ASSERT_EQ(tk.g[TK_UN].nend + tk.g[TK_NEW].nend, 0);
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  rpc_finish(tk.c[TK_UN], RPC_OK, NULL);
  ASSERT_EQ(tk.g[TK_UN].status, 200);
  ASSERT_EQ(tk.g[TK_UN].nend, 1);
  rpc_finish(tk.c[TK_NEW], RPC_OK, NULL);
  ASSERT_STR_EQ(tk_end(TK_NEW), "{}");
  ASSERT_STR_EQ(tk.log, "cancel(0,unauthenticated);cancel(1,unauthenticated);");
  for (int i = 0; i < TK_N; i++) tk_done(i);
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  daemon_set_token(TOKEN, strlen(TOKEN));
  ASSERT_EQ(tokhold_revoke_stale(), 0); /* every call dropped its hold when freed */
}

/* ------------------------------------------------------------ lifecycle */

/* After every test above: each legal transition of callstate.c's table was
 * taken by a real call at least once, and no illegal one was tried. */
TEST(every_legal_transition_driven) {
  int missing = 0;
  for (int st = 0; st < CALL_NSTATES; st++)
    for (int ev = 0; ev < CALL_NEVENTS; ev++)
      if (call_state_next((call_state)st, (call_event)ev) != CALL_NSTATES && !call_state_taken[st][ev]) {
        fprintf(stderr, "  never taken: %s from %s\n", call_event_name((call_event)ev),
                call_state_name((call_state)st));
        missing++;
      }
  ASSERT_EQ(missing, 0);
  ASSERT_EQ(call_state_illegal, 0);
}

int main(void) {
  loop = uv_default_loop();
  conch.loop = loop;
  daemon_set_token(TOKEN, strlen(TOKEN));
  RUN(code_table);
  RUN(encode_headroom);
  RUN(method_and_content_type);
  RUN(protocol_version);
  RUN(auth);
  RUN(check_order);
  RUN(connect_timeout_header);
  RUN(unary_proto_ok);
  RUN(unary_json_ok);
  RUN(unary_errors);
  RUN(unary_decode_errors);
  RUN(unary_size_limit);
  RUN(unary_gzip);
  RUN(envelopes_whole_and_batched);
  RUN(envelopes_byte_by_byte);
  RUN(envelopes_split_everywhere);
  RUN(envelopes_read_into);
  RUN(envelopes_big_field);
  RUN(stream_big_message_takes_the_buffer);
  RUN(unary_read_into);
  RUN(server_stream_request);
  RUN(truncated_envelope);
  RUN(deferred_end);
  RUN(oversized_envelope);
  RUN(envelope_flags);
  RUN(stream_compression);
  RUN(stream_json_decode_error);
  RUN(stream_output_proto_and_json);
  RUN(pause_input);
  RUN(drain_callback);
  RUN(deadline);
  RUN(abort_while_service_holds);
  RUN(abort_before_service);
  RUN(grpc);
  RUN(grpc_web);
  RUN(bug_error_json_utf8);
  RUN(bug_gzip_multi_member);
  RUN(bug_rpc_send_oversize_no_cancel);
  RUN(response_gzip_stream_order);
  RUN(response_gzip_packed_ref_queued);
  RUN(response_gzip_abort_while_deflating);
  RUN(response_gzip_unary);
  RUN(response_gzip_grpc);
  RUN(error_waits_behind_deflate);
  RUN(token_replaced_ends_old_streams);
  fake_done();
  RUN(every_legal_transition_driven);
  uv_loop_close(loop);
  return test_summary();
}
