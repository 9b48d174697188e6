/* fuzz_connect — a client stream's messages whichever way the bytes come
 * (server/connect.c, its big-field split above all).  The input describes
 * up to four FileChunk envelopes: fuzzed bytes before and after a content
 * field of 64 KiB or more (so that call_split takes it), the content's
 * length and fill, and a raw tail.  The body goes once to connect.c in one
 * piece — every envelope complete, nothing split — and once in pieces
 * whose sizes come from the input, read into connect.c's offers
 * (on_body_into) when a byte of the input says so, as http1.c does.
 * Property: the service sees the same messages (path, length, checksum of
 * the content) and the client gets the same answer, byte for byte; and
 * the input budget is back where it was once the call is gone. */
#include <string.h>
#include <uv.h>

#include "server/connect.h"
#include "core/daemon.h"
#include "proto/agent.pb-c.h"
#include "proto/wire.h"
#include "fuzz.h"

#define TOKEN "fuzz-token"

typedef struct run {
  hx x; /* first: the ops cast back */
  char log[4096];
  size_t loglen;
  uint8_t out[8192];
  size_t outlen;
  int ended;
} run;

static uv_loop_t *loop;
static run *cur;

static void logs(const char *s) {
  size_t n = strlen(s), k = n < sizeof cur->log - cur->loglen ? n : sizeof cur->log - cur->loglen;
  memcpy(cur->log + cur->loglen, s, k);
  cur->loglen += k;
}
static void out(const void *d, size_t n) {
  size_t k = n < sizeof cur->out - cur->outlen ? n : sizeof cur->out - cur->outlen;
  memcpy(cur->out + cur->outlen, d, k);
  cur->outlen += k;
}

static int fk_respond(hx *x, int status, const hx_header *h, size_t n, int64_t cl) {
  (void)x, (void)cl;
  char s[16];
  snprintf(s, sizeof s, "%d;", status);
  out(s, strlen(s));
  for (size_t i = 0; i < n; i++) {
    out(h[i].name, strlen(h[i].name));
    out(h[i].value, strlen(h[i].value));
  }
  return 0;
}
static int fk_write(hx *x, const hx_part *parts, unsigned n) {
  (void)x;
  for (unsigned i = 0; i < n; i++) {
    out(parts[i].data, parts[i].len);
    bufref_owner_free(parts[i].owner);
  }
  return 0;
}
static int fk_end(hx *x, const hx_header *t, size_t n) {
  ((run *)x)->ended = 1;
  for (size_t i = 0; i < n; i++) out(t[i].value, strlen(t[i].value));
  return 0;
}
static void fk_pause(hx *x, int p) { (void)x, (void)p; }
static size_t fk_outq(const hx *x) {
  (void)x;
  return 0;
}
static const hx_ops fk_ops = {fk_respond, fk_write, fk_end, fk_pause, fk_outq};

static void svc_on_request(rpc_call *c, const ProtobufCMessage *req) { (void)c, (void)req; }
static void svc_on_message(rpc_call *c, const ProtobufCMessage *msg) {
  (void)c;
  const Pb__FileChunk *ch = (const Pb__FileChunk *)msg;
  unsigned long sum = 0;
  for (size_t i = 0; i < ch->content.len; i++) sum = sum * 31 + ch->content.data[i];
  char b[96];
  snprintf(b, sizeof b, "msg(%zu,%lu,", ch->content.len, sum);
  logs(b);
  logs(ch->filepath ? ch->filepath : "-");
  logs(");");
}
static void svc_on_input_end(rpc_call *c) {
  logs("end;");
  rpc_finish(c, RPC_OK, NULL);
}
static void svc_on_cancel(rpc_call *c, rpc_code why) {
  (void)c;
  char b[32];
  snprintf(b, sizeof b, "cancel(%d);", (int)why);
  logs(b);
}
static const rpc_method m_cstream = {"/pb.FileService/PostFileStream", RPC_CLIENT_STREAM,
                                     &pb__file_chunk__descriptor, &pb__post_files_response__descriptor,
                                     0, svc_on_request, svc_on_message, svc_on_input_end, svc_on_cancel};

/* One call with the body in pieces (sizes from cuts; NULL: one piece). */
static void one_call(run *r, const uint8_t *body, size_t n, const uint8_t *cuts, size_t ncuts) {
  memset(r, 0, sizeof *r);
  cur = r;
  r->x.ops = &fk_ops;
  r->x.method = strdup("POST");
  r->x.path = strdup(m_cstream.path);
  r->x.content_length = -1;
  static const struct { const char *n, *v; } h[] = {{"Content-Type", "application/connect+proto"},
                                                    {"Connect-Protocol-Version", "1"},
                                                    {"Conch-Init-Token", TOKEN}};
  for (size_t i = 0; i < 3; i++) FUZZ_CHECK(hx_add_header(&r->x, h[i].n, strlen(h[i].n), h[i].v, strlen(h[i].v)) == 0);
  connect_serve(&r->x, &m_cstream);
  size_t off = 0, k = 0;
  while (off < n && !r->x.ended && r->x.h) {
    size_t step = n - off;
    int into = 0;
    if (cuts) {
      uint8_t c = cuts[k++ % ncuts];
      into = c & 1;
      step = (size_t)(c >> 1) * 613 + 1;
      if (step > n - off) step = n - off;
    }
    size_t room = 0;
    uint8_t *p = into && r->x.h->body_into ? r->x.h->body_into(&r->x, &room) : NULL;
    if (p && room) {
      size_t t = step < room ? step : room;
      memcpy(p, body + off, t);
      hx_body(&r->x, p, t);
      off += t;
    } else {
      hx_body(&r->x, body + off, step);
      off += step;
    }
  }
  if (!r->x.ended && r->x.h) r->x.h->on_body_end(&r->x);
  for (int i = 0; i < 100 && !r->ended; i++) uv_run(loop, UV_RUN_NOWAIT); /* a pool decode */
  if (!r->x.ended && r->x.h && r->x.h->on_abort) { /* the peer goes */
    r->x.ended = 1;
    r->x.h->on_abort(&r->x);
  }
  uv_run(loop, UV_RUN_DEFAULT);
  hx_free_request(&r->x);
}

static void put(uint8_t **b, size_t *n, size_t *cap, const void *d, size_t k) {
  if (*n + k > *cap) {
    size_t c = *cap ? *cap : 1024;
    while (c < *n + k) c *= 2;
    *b = realloc(*b, c);
    FUZZ_CHECK(*b != NULL);
    *cap = c;
  }
  memcpy(*b + *n, d, k);
  *n += k;
}

/* Input: [ncuts][cuts…] then per message: [plen][prefix…][slen][suffix…]
 * [len hi][len lo][fill]; whatever is left is a raw tail. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!loop) {
    loop = uv_default_loop();
    conch.loop = loop;
    daemon_set_token(TOKEN, strlen(TOKEN));
  }
  if (size < 2) return 0;
  size_t ncuts = data[0] % 16 + 1, pos = 1;
  if (size < pos + ncuts) return 0;
  const uint8_t *cuts = data + pos;
  pos += ncuts;
  uint8_t *body = NULL;
  size_t n = 0, cap = 0;
  for (int m = 0; m < 4 && pos < size; m++) {
    size_t plen = data[pos++] % 32;
    if (size - pos < plen + 1) break;
    const uint8_t *pre = data + pos;
    pos += plen;
    size_t slen = data[pos++] % 32;
    if (size - pos < slen + 3) break;
    const uint8_t *suf = data + pos;
    pos += slen;
    size_t clen = 65536 + ((size_t)data[pos] << 8 | data[pos + 1]) * 3;
    uint8_t fill = data[pos + 2];
    pos += 3;
    uint8_t hdr[2 * WIRE_VARINT_MAX];
    size_t hl = wire_varint_put(hdr, wire_key(2, WIRE_T_LEN));
    hl += wire_varint_put(hdr + hl, clen);
    size_t mlen = plen + hl + clen + slen;
    uint8_t env[5] = {0, (uint8_t)(mlen >> 24), (uint8_t)(mlen >> 16), (uint8_t)(mlen >> 8), (uint8_t)mlen};
    put(&body, &n, &cap, env, 5);
    put(&body, &n, &cap, pre, plen);
    put(&body, &n, &cap, hdr, hl);
    size_t at = n;
    uint8_t zero[4096];
    memset(zero, fill, sizeof zero);
    for (size_t left = clen; left;) {
      size_t k = left < sizeof zero ? left : sizeof zero;
      put(&body, &n, &cap, zero, k);
      left -= k;
    }
    body[at] ^= (uint8_t)m; /* messages differ */
    put(&body, &n, &cap, suf, slen);
  }
  if (pos < size) put(&body, &n, &cap, data + pos, size - pos);
  if (!n) return 0;

  size_t base = conch.rx_buffered;
  static run whole, pieces;
  one_call(&whole, body, n, NULL, 0);
  one_call(&pieces, body, n, cuts, ncuts);
  if (whole.loglen != pieces.loglen || memcmp(whole.log, pieces.log, whole.loglen) != 0)
    fprintf(stderr, "whole:  %.*s\npieces: %.*s\n", (int)whole.loglen, whole.log, (int)pieces.loglen, pieces.log);
  FUZZ_CHECK(whole.loglen == pieces.loglen && memcmp(whole.log, pieces.log, whole.loglen) == 0);
  FUZZ_CHECK(whole.outlen == pieces.outlen && memcmp(whole.out, pieces.out, whole.outlen) == 0);
  FUZZ_CHECK(conch.rx_buffered == base);
  free(body);
  return 0;
}
