/* connect_in — a call's request input (see connect.h, connect_int.h):
 * the body assembled in c->in (read there in place when the transport
 * can), envelopes parsed as they arrive, a big bytes field read into a
 * block of its own, big messages decoded in the thread pool, messages
 * delivered in order, the service started once its request is in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/connect_int.h"
#include "core/daemon.h"
#include "server/rpcdecode.h"
#include "proto/envelope.h"


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
    connect__fail(c, code, err);
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

static void deliver_message(rpc_call *c, ProtobufCMessage *m);

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
    if (!call_over(c)) connect__fail(c, RPC_CANCELED, "canceled");
    connect__maybe_free(c);
    return;
  }
  if (!j->m) {
    connect__fail(c, j->code, j->err);
  } else if (j->unary) {
    c->req_nul = j->nul;
    connect__start_service(c, j->m, NULL);
  } else {
    c->req_nul = j->nul;
    deliver_message(c, j->m);
    connect__pump(c); /* the end of input may be waiting */
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
    connect__fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
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
    connect__fail(c, RPC_INTERNAL, "cannot queue work");
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
    connect__fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
    return;
  }
  c->req = m;
}

/* req (if any) is freed with allocator a once the service has taken it. */
void connect__start_service(rpc_call *c, ProtobufCMessage *req, ProtobufCAllocator *a) {
  connect__step(c, CALL_EV_START);
  c->had_nul = c->req_nul;
  c->req = req; /* for rpc_take_request during the callback */
  if (a == NULL) call_req_step(&c->req_own, REQ_TAKABLE); /* not one decoded on the stack */
  c->m->on_request(c, req);
  if (c->req_own != REQ_TAKEN && req) protobuf_c_message_free_unpacked(req, a);
  c->req = NULL;
  call_req_step(&c->req_own, REQ_KEPT);
}

ProtobufCMessage *rpc_take_request(rpc_call *c) {
  if (c->msg_cur) {
    ProtobufCMessage *m = c->msg_cur;
    c->msg_cur = NULL;
    return m;
  }
  if (c->req_own != REQ_TAKABLE || !c->req) return NULL;
  call_req_step(&c->req_own, REQ_TAKEN);
  return c->req;
}

/* ---- a big bytes field read into its own block ----
 *
 * A binary message with a bytes field of CALL_BIG_MIN bytes or more (a file
 * chunk's content) would be assembled in `in` and then copied by
 * protobuf-c's unpack.  Instead, once the field's key and length are here
 * (within the message's first CALL_BIG_WITHIN bytes), its bytes go to a
 * block of their own — read there in place (connect__on_body_into) or copied there
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
  /* as connect__on_body's growth: within the budgets, else assembled in `in` (which
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
void connect__pump(rpc_call *c) {
  if (users_waiting(&c->uw)) return; /* the user is being resolved: nothing is delivered yet */
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
        connect__fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
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
      connect__fail(c, RPC_RESOURCE_EXHAUSTED, e);
      return;
    }
    if (es == ENV_NEED) break;
    if (es == ENV_BAD_FLAGS) {
      connect__fail(c, RPC_INVALID_ARGUMENT, "protocol error: invalid envelope flags");
      return;
    }
    if (c->req) { /* server streaming: exactly one request message */
      connect__fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected only one message, but got multiple");
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
    call_input_step(&c->input, IN_DELIVERED);
    size_t left = c->in_len + (c->big.data ? big_cut(c) + c->big.got : 0);
    if (left) {
      char e[160];
      snprintf(e, sizeof e, "protocol error: incomplete envelope: %zu bytes left over", left);
      connect__fail(c, RPC_INVALID_ARGUMENT, e);
      return;
    }
    if (streams_in(c->m)) {
      if (c->m->on_input_end) c->m->on_input_end(c);
    } else {
      ProtobufCMessage *req = c->req;
      c->req = NULL;
      if (!req) {
        connect__fail(c, RPC_INVALID_ARGUMENT, "protocol error: expected one request message, got none");
        return;
      }
      connect__start_service(c, req, NULL);
    }
  }
}

void connect__on_body(hx *x, const uint8_t *d, size_t n) {
  rpc_call *c = x->hdata;
  if (call_over(c)) return;
  if (c->big.got < c->big.len) { /* the big field's bytes come first */
    size_t k = c->big.len - c->big.got < n ? c->big.len - c->big.got : n;
    if (d != c->big.data + c->big.got) memcpy(c->big.data + c->big.got, d, k); /* else read there */
    c->big.got += k;
    d += k;
    n -= k;
    if (!n) {
      if (c->big.got == c->big.len) connect__pump(c);
      return;
    }
  }
  size_t limit = (size_t)RPC_MAX_MESSAGE + (c->w == W_CONNECT_UNARY ? 0 : 5);
  if (c->w == W_CONNECT_UNARY && c->in_len + n > limit) {
    connect__fail(c, RPC_RESOURCE_EXHAUSTED, "message is larger than configured max 16777216 bytes");
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
      connect__fail(c, RPC_RESOURCE_EXHAUSTED, "server is busy: too much request data buffered");
      return;
    }
    uint8_t *q = realloc(c->in, cap);
    if (!q) {
      connect__fail(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    conch.rx_buffered += cap - c->in_cap;
    conch.held += cap - c->in_cap;
    c->in = q;
    c->in_cap = cap;
  }
  if (d != c->in + c->in_len) memcpy(c->in + c->in_len, d, n); /* else read there: connect__on_body_into */
  c->in_len += n;
  if (c->w != W_CONNECT_UNARY) connect__pump(c);
}

/* hx_handler.body_into: the next body bytes may be read straight into
 * c->in, within the room it already has (no growth, so the budget is
 * unchanged and d above is still c->in + c->in_len) and never past the
 * envelope being assembled — which, after connect__pump, starts at c->in[0]
 * — so that the pump's memmove of what follows a message stays small.
 * A unary body takes the room its Content-Length sized. */
uint8_t *connect__on_body_into(hx *x, size_t *len) {
  rpc_call *c = x->hdata;
  if (call_over(c) || c->in_paused || c->decode || users_waiting(&c->uw) || !c->in) return NULL;
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


void connect__on_body_end(hx *x) {
  rpc_call *c = x->hdata;
  if (call_over(c)) return;
  call_input_step(&c->input, IN_ENDED);
  if (c->w != W_CONNECT_UNARY) {
    connect__pump(c);
    return;
  }
  if (!users_waiting(&c->uw)) connect__unary_body_end(c); /* else once the user is resolved */
}

/* A Connect unary body is all in: decode it, start the service. */
void connect__unary_body_end(rpc_call *c) {
  if (pool_decode(c, c->in, c->in_len, c->gzip_in)) return; /* c->in goes with it */
  /* the one request is freed when the service returns: it is decoded on
   * the stack (a small one needs no malloc) */
  _Alignas(16) uint8_t scratch[1024];
  pbmem mem;
  ProtobufCMessage *m = call_decode(c, c->in, c->in_len, c->gzip_in, scratch, sizeof scratch, &mem, 0, 0);
  call_drop_input(c);
  if (m) connect__start_service(c, m, &mem.a);
}

