/* http1 — HTTP/1.1 on one connection; see http1.h. */
#include "server/http1.h"

#include <http_parser.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/daemon.h"
#include "server/http1head.h"
#include "server/hx.h"
#include "core/log.h"
#include "core/lifecycle.h"
#include "server/rpc.h"

/* How the response's body goes out. */
typedef enum h1_framing {
  H1_OUT_LENGTH,  /* Content-Length: back to back */
  H1_OUT_CHUNKED, /* chunked encoding */
  H1_OUT_NONE,    /* HEAD: the head says what a GET would get; no body bytes */
} h1_framing;

typedef struct h1 {
  hsink *c;
  http_parser parser;
  hx *x;               /* the exchange being parsed or answered, or NULL */
  size_t header_bytes; /* request line + headers so far */
  char *url;
  size_t url_len;
  char *hname, *hval;
  size_t hname_len, hval_len;
  h1_state state;   /* changed only by h1_set_state */
  int in_value;     /* the parser is inside a header value */
  int keep_alive;
  int close_after;  /* close once the response is written */
  int close_asked;  /* ...and the request body is in: the handler asked (no RST over the answer) */
  h1_framing out;   /* the response's framing */
  int body_paused;
  int continue_wanted; /* Expect: 100-continue, not answered yet (h1_continue) */
  int drain_armed;  /* outq went above HX_OUTQ_LOW */
  uint8_t *ubody;   /* body buffered for an h2c upgrade */
  size_t ubody_len, ubody_cap;
  uint8_t *pend;    /* bytes received but not parsed while paused: */
  size_t pend_off, pend_len; /* pend[off, off+len) */
  char head[1024];  /* response head waiting to go with the first body bytes */
  size_t head_len;
  int in_execute;   /* inside http_parser_execute */
  int room_wait;    /* hx_room said no: on_drain once the output left */
  size_t room_n;
  h1_scan_state scan; /* h1_scan over the raw request head */
} h1;

/* The next pipelined request is parsed only while less than this is
 * queued for the socket: a client that sends requests and never reads the
 * answers makes us stop reading it, not buffer its answers. */
#define H1_PARSE_OUTQ (64u * 1024)
/* hx_room: a producer may add n bytes while the queue is empty, or stays
 * within this with them (a 1 MiB file chunk: only once the previous one
 * has reached the kernel). */
#define H1_ROOM (1u * 1024 * 1024)

static const http_parser_settings h1_settings;
static const hx_ops h1_ops;
static void h1_dispatch(h1 *s);
static void h1_next(hsink *c);

/* ---------------------------------------------------------------- lifecycle */

#define B(st) (1u << (st))

/* h1_from[to]: the states `to` may follow. */
static const unsigned h1_from[H1_NSTATES] = {
  [H1_IDLE] = B(H1_HELD) | B(H1_DONE),
  [H1_HELD] = B(H1_IDLE),
  [H1_HEAD] = B(H1_IDLE), /* a read that arrives while HELD waits in pend (h1_on_read) */
  [H1_UPGRADE] = B(H1_HEAD),
  [H1_BODY] = B(H1_HEAD),
  [H1_DONE] = B(H1_BODY),
  [H1_CLOSING] = B(H1_IDLE) | B(H1_HELD) | B(H1_HEAD) | B(H1_UPGRADE) | B(H1_BODY) | B(H1_DONE),
};

static const char *const h1_names[H1_NSTATES] = {"IDLE", "HELD", "HEAD", "UPGRADE",
                                                 "BODY", "DONE", "CLOSING"};

int http1_state_legal(h1_state from, h1_state to) {
  return (unsigned)from < H1_NSTATES && (unsigned)to < H1_NSTATES && (h1_from[to] >> from & 1u);
}

const char *http1_state_name(h1_state st) { return (unsigned)st < H1_NSTATES ? h1_names[st] : "?"; }

/* The one place the state changes: -1 (and the state left as it was)
 * when `to` may not follow it (lifecycle.h). */
static int h1_set_state(h1 *s, h1_state to) {
  unsigned legal = (unsigned)to < H1_NSTATES ? h1_from[to] : 0;
  if (lifecycle_check("http1 connection", legal, (int)s->state, (int)to, h1_names, H1_NSTATES) != 0)
    return -1;
  s->state = to;
  return 0;
}

int http1_state_try(h1_state from, h1_state to) {
  h1 s = {.state = from};
  return h1_set_state(&s, to) == 0 && s.state == to ? 0 : -1;
}

/* The handler has the request. */
static int h1_dispatched(const h1 *s) { return s->state == H1_BODY || s->state == H1_DONE; }

/* Parsing waits: the request is in, or nothing more is read. */
static int h1_parse_stopped(const h1 *s) { return s->state == H1_DONE || s->state == H1_CLOSING; }

/* ---------------------------------------------------------------- helpers */

static void h1_free_x(h1 *s) {
  if (!s->x) return;
  hx_free_request(s->x);
  free(s->x);
  s->x = NULL;
}

static void h1_reset_request(h1 *s) {
  free(s->url);
  free(s->hname);
  free(s->hval);
  free(s->ubody);
  s->url = s->hname = s->hval = NULL;
  s->ubody = NULL;
  s->url_len = s->hname_len = s->hval_len = s->ubody_len = s->ubody_cap = 0;
  s->header_bytes = 0;
  s->in_value = 0;
  s->out = H1_OUT_LENGTH;
  s->body_paused = s->continue_wanted = s->drain_armed = s->room_wait = 0;
  s->head_len = 0;
  h1_free_x(s);
}

/* A response for a request we could not even parse. Then close. */
static void h1_fail(h1 *s, int status, const char *reason) {
  if (!s->x || !s->x->responded) {
    char buf[256];
    int n = snprintf(buf, sizeof buf,
                     "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                     status, reason, strlen(reason) + 1, reason);
    sink_write_copy(s->c, buf, (size_t)n);
  }
  LOG_DEBUG("http1 error conn=%llu status=%d reason=%s", (unsigned long long)s->c->id, status,
            reason);
  if (s->x) {
    hx *x = s->x;
    int live = h1_dispatched(s) && !x->ended && x->h && x->h->on_abort;
    x->ended = 1;
    if (live) x->h->on_abort(x);
  }
  s->close_after = 1;
  h1_set_state(s, H1_CLOSING);
  sink_read_pause(s->c, 1);
  sink_defer(s->c, h1_next); /* closes once the answer is out */
}

static int h1_grow(char **p, size_t *len, const char *at, size_t n) {
  char *q = realloc(*p, *len + n + 1);
  if (!q) return -1;
  memcpy(q + *len, at, n);
  *len += n;
  q[*len] = 0;
  *p = q;
  return 0;
}

static int h1_count(h1 *s, size_t n) {
  s->header_bytes += n;
  if (s->header_bytes > HTTP1_MAX_HEADER_BYTES) {
    h1_fail(s, 431, "Request Header Fields Too Large");
    return -1;
  }
  return 0;
}

static int h1_commit_header(h1 *s) {
  if (!s->hname) return 0;
  if (!s->x) return -1;
  if (!h1_is_token(s->hname, s->hname_len)) {
    h1_fail(s, 400, "Bad Request: invalid header field name");
    return -1;
  }
  int r = hx_add_header(s->x, s->hname, s->hname_len, s->hval ? s->hval : "", s->hval_len);
  free(s->hname);
  free(s->hval);
  s->hname = s->hval = NULL;
  s->hname_len = s->hval_len = 0;
  if (r != 0) h1_fail(s, 431, "Request Header Fields Too Large");
  return r;
}

/* ---------------------------------------------------------------- parser callbacks */

static int h1_on_message_begin(http_parser *p) {
  h1 *s = p->data;
  h1_reset_request(s);
  h1_set_state(s, H1_HEAD);
  s->x = calloc(1, sizeof *s->x);
  if (!s->x) return -1;
  s->x->content_length = -1;
  s->x->sink = s->c;
  sink_timer(s->c, HTTP1_HEADER_TIMEOUT_MS);
  return 0;
}

static int h1_on_url(http_parser *p, const char *at, size_t n) {
  h1 *s = p->data;
  if (h1_count(s, n)) return -1;
  return h1_grow(&s->url, &s->url_len, at, n);
}

static int h1_on_header_field(http_parser *p, const char *at, size_t n) {
  h1 *s = p->data;
  if (h1_count(s, n)) return -1;
  if (s->in_value) {
    if (h1_commit_header(s)) return -1;
    s->in_value = 0;
  }
  return h1_grow(&s->hname, &s->hname_len, at, n);
}

static int h1_on_header_value(http_parser *p, const char *at, size_t n) {
  h1 *s = p->data;
  if (h1_count(s, n)) return -1;
  s->in_value = 1;
  return h1_grow(&s->hval, &s->hval_len, at, n);
}

static void h1_send_continue(h1 *s) {
  static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
  sink_write_copy(s->c, cont, sizeof cont - 1);
}

static int h1_on_headers_complete(http_parser *p) {
  h1 *s = p->data;
  if (h1_commit_header(s)) return -1;
  hx *x = s->x;
  sink_timer(s->c, 0);
  const char *mn = http_method_str((enum http_method)p->method);
  x->method = hx_strdup(x, mn, strlen(mn));
  if (!x->method || h1_parse_target(x, s->url ? s->url : "", s->url_len) != 0) {
    h1_fail(s, 400, "Bad Request");
    return -1;
  }
  if (p->flags & F_CONTENTLENGTH) x->content_length = (int64_t)p->content_length;
  else if (!(p->flags & F_CHUNKED)) x->content_length = 0;
  s->keep_alive = http_should_keep_alive(p);

  /* h2c upgrade (RFC 7540 §3.2): buffer the body, switch at message end */
  const char *up = hx_get(x, "upgrade"), *settings = hx_get(x, "http2-settings");
  if (up && settings && h1_token_in(up, "h2c") && h1_token_in(hx_get(x, "connection"), "upgrade") &&
      (x->content_length < 0 || x->content_length <= (int64_t)RPC_MAX_MESSAGE + 64)) {
    if (!s->c->serve->h2_settings_valid(settings)) {
      h1_fail(s, 400, "Bad Request: invalid HTTP2-Settings");
      return -1;
    }
    h1_set_state(s, H1_UPGRADE);
    sink_timer(s->c, HTTP1_IDLE_TIMEOUT_MS); /* the body must come, too */
    if (h1_token_in(hx_get(x, "expect"), "100-continue")) h1_send_continue(s);
    return 0;
  }
  h1_dispatch(s); /* before any body byte, so the handler sees them all */
  return 0;
}

static int h1_on_body(http_parser *p, const char *at, size_t n) {
  h1 *s = p->data;
  if (s->state == H1_UPGRADE) {
    if (s->ubody_len + n > (size_t)RPC_MAX_MESSAGE + 64) {
      h1_fail(s, 413, "Payload Too Large");
      return -1;
    }
    if (s->ubody_len + n > s->ubody_cap) {
      size_t cap = s->ubody_cap ? s->ubody_cap : 4096;
      while (cap < s->ubody_len + n) cap *= 2;
      if (cap > (size_t)RPC_MAX_MESSAGE + 64) cap = (size_t)RPC_MAX_MESSAGE + 64;
      uint8_t *nb = realloc(s->ubody, cap);
      if (!nb) return -1;
      s->ubody = nb;
      s->ubody_cap = cap;
    }
    memcpy(s->ubody + s->ubody_len, at, n);
    s->ubody_len += n;
    return 0;
  }
  hx *x = s->x;
  if (!x || x->ended || !x->h || !x->h->on_body) return 0; /* discarded */
  hx_body(x, (const uint8_t *)at, n);
  if (s->body_paused) http_parser_pause(p, 1);
  return 0;
}

static int h1_on_message_complete(http_parser *p) {
  h1 *s = p->data;
  /* an upgrade switches at its end (h1_execute) */
  if (s->state == H1_BODY) h1_set_state(s, H1_DONE);
  /* stop here: the next request waits until this response is done */
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings h1_settings = {
    .on_message_begin = h1_on_message_begin,
    .on_url = h1_on_url,
    .on_header_field = h1_on_header_field,
    .on_header_value = h1_on_header_value,
    .on_headers_complete = h1_on_headers_complete,
    .on_body = h1_on_body,
    .on_message_complete = h1_on_message_complete,
};

/* ---------------------------------------------------------------- hx ops */

static void h1_flush_head(h1 *s, uv_buf_t *bufs, unsigned *nb, void **owned, unsigned *no) {
  if (!s->head_len) return;
  char *h = malloc(s->head_len);
  if (!h) return;
  memcpy(h, s->head, s->head_len);
  bufs[(*nb)++] = uv_buf_init(h, (unsigned)s->head_len);
  owned[(*no)++] = h;
  s->head_len = 0;
}

static int h1_respond(hx *x, int status, const hx_header *h, size_t n, int64_t clen) {
  h1 *s = x->tp;
  size_t cap = sizeof s->head, len = 0;
  int w = snprintf(s->head, cap, "HTTP/1.1 %d %s\r\n", status, h1_reason(status));
  len = (size_t)w;
  for (size_t i = 0; i < n && len < cap; i++) {
    if (!strcmp(h[i].name, "connection") && !strcasecmp(h[i].value, "close")) {
      s->keep_alive = 0; /* the handler asks: written below, once */
      s->close_asked = 1;
      continue;
    }
    w = snprintf(s->head + len, cap - len, "%s: %s\r\n", h[i].name, h[i].value);
    len += (size_t)w;
  }
  int bodyless = status == 204 || status == 304; /* RFC 9110: no length field */
  if (len < cap && !bodyless) {
    if (clen >= 0)
      w = snprintf(s->head + len, cap - len, "Content-Length: %lld\r\n", (long long)clen);
    else
      w = snprintf(s->head + len, cap - len, "Transfer-Encoding: chunked\r\n");
    len += (size_t)w;
  }
  s->out = strcmp(x->method, "HEAD") == 0 || bodyless ? H1_OUT_NONE
          : clen < 0                                 ? H1_OUT_CHUNKED
                                                     : H1_OUT_LENGTH;
  /* a response that ends before the request body is in: keep reading and
   * dropping the body, then go on with keep-alive (or close if asked) */
  if (len < cap) {
    w = snprintf(s->head + len, cap - len, "%s\r\n", s->keep_alive ? "" : "Connection: close\r\n");
    len += (size_t)w;
  }
  if (len >= cap) return -1;
  s->head_len = len;
  return 0;
}

/* The pieces go out as one chunk (chunked) or back to back. */
static int h1_write(hx *x, const hx_part *parts, unsigned n) {
  h1 *s = x->tp;
  if (s->out == H1_OUT_NONE) { /* the head says what a GET would get; no body */
    for (unsigned i = 0; i < n; i++) bufref_owner_free(parts[i].owner);
    return 0;
  }
  uv_buf_t bufs[5];
  void *owned[4];
  unsigned nb = 0, no = 0;
  char sz[24];
  int szl = 0;
  size_t len = 0;
  for (unsigned i = 0; i < n; i++) len += parts[i].len;
  h1_flush_head(s, bufs, &nb, owned, &no);
  if (s->out == H1_OUT_CHUNKED) {
    szl = snprintf(sz, sizeof sz, "%zx\r\n", len);
    if (nb) { /* the head goes first: the size line cannot be the prefix */
      char *p = malloc((size_t)szl);
      if (!p) {
        for (unsigned i = 0; i < no; i++) free(owned[i]);
        for (unsigned i = 0; i < n; i++) bufref_owner_free(parts[i].owner);
        return -1;
      }
      memcpy(p, sz, (size_t)szl);
      bufs[nb++] = uv_buf_init(p, (unsigned)szl);
      owned[no++] = p;
      szl = 0;
    }
  }
  for (unsigned i = 0; i < n; i++) {
    bufs[nb++] = uv_buf_init((char *)parts[i].data, (unsigned)parts[i].len);
    owned[no++] = parts[i].owner;
  }
  if (s->out == H1_OUT_CHUNKED) bufs[nb++] = uv_buf_init("\r\n", 2);
  int r = sink_write_pre(s->c, sz, (size_t)szl, bufs, nb, owned, no);
  if (s->c->outq > HX_OUTQ_LOW) s->drain_armed = 1;
  return r;
}

static int h1_end(hx *x, const hx_header *trailers, size_t n) {
  (void)trailers;
  (void)n;
  h1 *s = x->tp;
  uv_buf_t bufs[2];
  void *owned[2];
  unsigned nb = 0, no = 0;
  h1_flush_head(s, bufs, &nb, owned, &no);
  if (s->out == H1_OUT_CHUNKED) bufs[nb++] = uv_buf_init("0\r\n\r\n", 5);
  if (nb) sink_write(s->c, bufs, nb, owned, no);
  if (!s->keep_alive) s->close_after = 1;
  /* the rest of the request body is only thrown away now: bound the wait */
  if (s->state != H1_DONE) sink_timer(s->c, HTTP1_IDLE_TIMEOUT_MS);
  if (s->body_paused) {
    s->body_paused = 0;
    if (s->state != H1_DONE) sink_read_pause(s->c, 0);
  }
  /* continue parsing (the rest of this body, then the next request) later,
   * from the loop, never inside the handler's call */
  sink_defer(s->c, h1_next);
  return 0;
}

/* `100 Continue` (Expect: 100-continue) once the handler takes the body:
 * when it has not paused it, else at its first resume.  A handler that
 * answers first (an error, before it could accept the upload) never makes
 * the client send its body. */
static void h1_continue(h1 *s, hx *x) {
  if (!s->continue_wanted || s->body_paused) return;
  s->continue_wanted = 0;
  if (!s->c->closing && !x->responded) h1_send_continue(s);
}

static void h1_pause_body(hx *x, int paused) {
  h1 *s = x->tp;
  if (s->body_paused == paused) return;
  s->body_paused = paused;
  if (paused) {
    sink_read_pause(s->c, 1);
    if (s->in_execute) http_parser_pause(&s->parser, 1);
  } else {
    h1_continue(s, x);
    sink_defer(s->c, h1_next);
  }
}

static size_t h1_outq(const hx *x) {
  const h1 *s = x->tp;
  return s->c->outq + s->head_len;
}

static int h1_room(hx *x, size_t n) {
  h1 *s = x->tp;
  size_t q = s->c->outq + s->head_len;
  if (q == 0 || q + n <= H1_ROOM) {
    s->room_wait = 0;
    return 1;
  }
  s->room_wait = 1;
  s->room_n = n;
  return 0;
}

/* waiting: NULL — one request at a time, nothing else waits behind it */
/* The file range is sent: the exchange may go on. */
static void h1_file_done(void *arg) {
  h1 *s = arg;
  hx *x = s->x;
  if (x && !x->ended && x->h && x->h->on_drain) x->h->on_drain(x);
}

/* The head goes out first (as a write), then the range by the kernel. */
static int h1_write_file(hx *x, int fd, uint64_t off, uint64_t len) {
  h1 *s = x->tp;
  if (!s->c->ops->sendfile || s->out != H1_OUT_LENGTH) return 1;
  uv_buf_t bufs[1];
  void *owned[1];
  unsigned nb = 0, no = 0;
  h1_flush_head(s, bufs, &nb, owned, &no);
  if (nb && sink_write(s->c, bufs, nb, owned, no) != 0) return -1;
  return s->c->ops->sendfile(s->c, fd, off, len, h1_file_done, s) == 0 ? 0 : -1;
}

static const hx_ops h1_ops = {h1_respond, h1_write, h1_end, h1_pause_body, h1_outq, h1_room, NULL,
                              h1_write_file};

/* ---------------------------------------------------------------- driving */

static void h1_switch_to_h2(h1 *s, const uint8_t *rest, size_t rest_len) {
  hsink *c = s->c;
  static const char sw[] =
      "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n";
  sink_write_copy(c, sw, sizeof sw - 1);
  hx *x = s->x;
  s->x = NULL;
  uint8_t *body = s->ubody;
  size_t blen = s->ubody_len;
  s->ubody = NULL;
  h1_reset_request(s);
  free(s->pend);
  free(s);
  c->p = NULL;
  c->proto = NULL;
  if (c->serve->h2_init(c, x, body, blen) != 0) { /* takes x and body */
    sink_close(c);
    return;
  }
  /* the upgrade may have been parsed from held-back bytes, reading paused */
  sink_read_pause(c, 0);
  if (rest_len) c->proto->on_read(c, rest, rest_len);
}

/* The request head is complete: hand the exchange to the router. */
static void h1_dispatch(h1 *s) {
  hx *x = s->x;
  x->ops = &h1_ops;
  x->tp = s;
  h1_set_state(s, H1_BODY);
  sink_turn_request(s->c);
  s->continue_wanted = h1_token_in(hx_get(x, "expect"), "100-continue");
  s->c->serve->dispatch(x);
  h1_continue(s, x);
}

/* Run the parser over d; keeps what it could not take in s->pend.  When d
 * lies in buf (malloc'd: the held-back bytes) the rest stays where it is
 * and buf is taken (returns 1): copying the rest once per pipelined
 * request was quadratic in the requests per read. */
static int h1_execute(h1 *s, const uint8_t *d, size_t n, uint8_t *buf) {
  hsink *c = s->c;
  while (n > 0) {
    const char *why;
    if (s->scan != SC_DONE && h1_scan(&s->scan, d, n, &why) != 0) {
      if (!s->close_after) h1_fail(s, 400, why);
      return 0;
    }
    s->in_execute = 1;
    size_t done = http_parser_execute(&s->parser, &h1_settings, (const char *)d, n);
    s->in_execute = 0;
    if (c->closing || c->p != s) return 0;
    enum http_errno e = HTTP_PARSER_ERRNO(&s->parser);
    d += done;
    n -= done;
    if (e == HPE_PAUSED) {
      http_parser_pause(&s->parser, 0);
      if (s->state == H1_UPGRADE) { /* paused only by its message's end */
        h1_switch_to_h2(s, d, n);
        return 0;
      }
      if (s->state == H1_DONE) { /* parsing waits until this exchange is over: h1_next */
        hx *x = s->x;
        if (x && !x->ended && x->h && x->h->on_body_end) x->h->on_body_end(x);
        if (c->closing) return 0;
        if (!x || x->ended) sink_defer(c, h1_next);
        break;
      }
      if (s->body_paused) break;
      continue;
    }
    if (e != HPE_OK) {
      if (!s->close_after && !c->closing) {
        if (e == HPE_CB_header_field || e == HPE_CB_header_value || e == HPE_CB_url ||
            e == HPE_HEADER_OVERFLOW)
          h1_fail(s, 431, "Request Header Fields Too Large");
        else
          h1_fail(s, 400, http_errno_description(e));
      }
      return 0;
    }
  }
  if (n > 0) {
    sink_read_pause(c, 1);
    free(s->pend);
    s->pend_len = n;
    if (buf) {
      s->pend = buf;
      s->pend_off = (size_t)(d - buf);
      return 1;
    }
    s->pend_off = 0;
    s->pend = malloc(n);
    if (!s->pend) {
      s->pend_len = 0;
      sink_close(c);
      return 0;
    }
    memcpy(s->pend, d, n);
  }
  return 0;
}

/* Go on: after a response ended, or after the body was un-paused. */
static void h1_next(hsink *c) {
  h1 *s = c->p;
  if (!s) return;
  if (s->state == H1_CLOSING) {
    if (c->outq == 0) sink_close(c); /* else h1_on_written closes */
    return;
  }
  if (s->state == H1_DONE && s->x && s->x->ended) {
    if (s->close_after) {
      sink_read_pause(c, 1);
      if (c->outq == 0) sink_close(c);
      return;
    }
    h1_reset_request(s);
    h1_set_state(s, H1_IDLE);
    s->scan = SC_PRE;
    sink_timer(c, HTTP1_IDLE_TIMEOUT_MS);
  }
  if (h1_parse_stopped(s) || s->body_paused) return;
  /* between requests: parse the next one only once the answers so far
   * have (mostly) left; h1_on_written resumes */
  if (!s->x && c->outq > H1_PARSE_OUTQ) {
    if (s->state == H1_IDLE) h1_set_state(s, H1_HELD);
    sink_read_pause(c, 1);
    return;
  }
  if (s->state == H1_HELD) h1_set_state(s, H1_IDLE);
  uint8_t *p = s->pend;
  size_t off = s->pend_off, n = s->pend_len;
  s->pend = NULL;
  s->pend_off = s->pend_len = 0;
  if (!n || !h1_execute(s, p + off, n, p)) free(p);
  if (c->closing || c->p != s) return;
  if (!s->pend_len && !h1_parse_stopped(s) && !s->body_paused) sink_read_pause(c, 0);
}

static void h1_on_read(hsink *c, const uint8_t *d, size_t n) {
  h1 *s = c->p;
  if (s->pend_len || s->state == H1_HELD || h1_parse_stopped(s) || s->body_paused) {
    /* should not happen (reading is paused); keep it for h1_next */
    uint8_t *np = realloc(s->pend, s->pend_off + s->pend_len + n);
    if (!np) {
      sink_close(c);
      return;
    }
    memcpy(np + s->pend_off + s->pend_len, d, n);
    s->pend = np;
    s->pend_len += n;
    sink_read_pause(c, 1);
    return;
  }
  h1_execute(s, d, n, NULL);
}

static void h1_on_written(hsink *c) {
  h1 *s = c->p;
  /* a body still coming is read and dropped first (h1_next closes at its
   * end, the idle timer bounds it): closing on unread bytes sends an RST
   * that can destroy the answer before the client reads it */
  if (s->close_after && c->outq == 0 && (!s->x || s->x->ended) && !(s->close_asked && s->state != H1_DONE)) {
    sink_close(c);
    return;
  }
  if (s->state == H1_HELD && c->outq <= H1_PARSE_OUTQ) {
    h1_set_state(s, H1_IDLE);
    sink_defer(c, h1_next);
    return;
  }
  hx *x = s->x;
  if (!x || x->ended || !x->h || !x->h->on_drain) return;
  if (s->room_wait && (c->outq + s->head_len == 0 || c->outq + s->head_len + s->room_n <= H1_ROOM)) {
    s->room_wait = 0;
    s->drain_armed = 0;
    x->h->on_drain(x);
    return;
  }
  if (s->drain_armed && c->outq <= HX_OUTQ_LOW) {
    s->drain_armed = 0;
    x->h->on_drain(x);
  }
}

static void h1_on_timeout(hsink *c) {
  h1 *s = c->p;
  if (s->x && h1_dispatched(s) && !s->x->ended) return; /* an exchange is running */
  if (c->outq) { /* a response is still going out: no write timeout */
    sink_timer(c, HTTP1_IDLE_TIMEOUT_MS);
    return;
  }
  LOG_DEBUG("http1 timeout conn=%llu", (unsigned long long)c->id);
  sink_close(c);
}

static void h1_on_close(hsink *c) {
  h1 *s = c->p;
  if (!s) return;
  if (s->x && h1_dispatched(s) && !s->x->ended && s->x->h && s->x->h->on_abort) {
    s->x->ended = 1;
    s->x->h->on_abort(s->x);
  }
  h1_reset_request(s);
  free(s->pend);
  free(s);
  c->p = NULL;
}

/* hproto.read_into: inside a Content-Length body that nothing holds back,
 * the next read may go straight where the exchange's handler assembles it
 * (an upload's message: connect.c), at most the body's remaining bytes —
 * so the parser sees exactly body bytes there, and gives them to on_body
 * at that address in one piece.  Chunked bodies are read as usual: their
 * framing must not land in the handler's buffer. */
static uint8_t *h1_read_into(hsink *c, size_t *len) {
  h1 *s = c->p;
  hx *x = s ? s->x : NULL;
  if (!x || s->scan != SC_DONE || s->state != H1_BODY || s->pend_len || s->body_paused || x->ended || !x->h ||
      !x->h->on_body || !x->h->body_into || (s->parser.flags & F_CHUNKED) ||
      HTTP_PARSER_ERRNO(&s->parser) != HPE_OK)
    return NULL;
  uint64_t left = s->parser.content_length;
  if (left == 0 || left == ULLONG_MAX) return NULL;
  uint8_t *p = x->h->body_into(x, len);
  if (p && *len > left) *len = (size_t)left;
  return p;
}

/* hproto.on_revoked: the token the connection's requests authenticated
 * with was replaced (tokhold.h).  An exchange running finishes — with
 * `Connection: close` if it has not answered yet — and the connection
 * closes after it (its streaming call has been ended with the error
 * already, connect.c); a body still coming is read and dropped first, as
 * when a handler asks to close.  Idle (between requests, or a request
 * head not yet complete: not dispatched, never authenticated) it closes
 * once its output is written. */
static void h1_on_revoked(hsink *c) {
  h1 *s = c->p;
  if (!s || c->closing || s->state == H1_CLOSING) return; /* closing once its answer is out */
  s->keep_alive = 0;
  if (s->x && h1_dispatched(s)) {
    s->close_asked = 1; /* a body still coming is read first (h1_on_written) */
    if (!s->x->ended) return; /* h1_end sets close_after */
    s->close_after = 1; /* ended: h1_next closes */
    sink_defer(c, h1_next);
    return;
  }
  s->close_after = 1;
  h1_set_state(s, H1_CLOSING);
  sink_read_pause(c, 1);
  h1_reset_request(s); /* a request head half read goes: never dispatched */
  if (c->outq == 0) sink_close(c); /* else h1_on_written closes */
}

/* hproto.drain_state (sink.h). */
static int h1_drain_state(const hsink *c) {
  const h1 *s = c->p;
  if (!s || s->state == H1_CLOSING || s->state == H1_UPGRADE || s->close_after) return 2;
  if (s->pend_len) return 1; /* the next request's bytes, read already */
  if (s->state == H1_DONE && s->x && s->x->ended) return 0; /* answered: h1_next resets it */
  if (h1_dispatched(s)) return 2;
  return s->state == H1_HEAD || s->header_bytes || s->url_len ? 1 : 0; /* IDLE, HELD: between requests */
}

/* EOF from the client closes the connection at once, even with a request
 * still being answered: a half-close cannot be told from a vanished client,
 * and a vanished client must stop its foreground process (api.md §6) — as
 * Go's server cancels the request context on EOF. */
const hproto http1_conn_proto = {h1_on_read,  h1_on_written, h1_on_timeout, h1_on_close,
                                 h1_read_into, h1_on_revoked, h1_drain_state};

int http1_conn_init(hsink *c) {
  h1 *s = calloc(1, sizeof *s);
  if (!s) return -1;
  s->c = c;
  c->proto = &http1_conn_proto;
  http_parser_init(&s->parser, HTTP_REQUEST);
  s->parser.data = s;
  c->p = s;
  return 0;
}
