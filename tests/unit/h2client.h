/* h2client.h — an HTTP/2 session (server/h2.c) over a memory sink, talked
 * to by libnghttp2's client: what the client sends goes into the sink,
 * what the server writes goes into the client (tests/unit/test_h2.c). */
#ifndef CONCH_H2CLIENT_H
#define CONCH_H2CLIENT_H

#include <nghttp2/nghttp2.h>

#include "server/h2.h"
#include "tests/unit/memsink.h"

#define H2T_STREAMS 256 /* client stream ids 1, 3, …: index id / 2 */

typedef struct h2t_stream {
  int status;
  uint8_t body[4096]; /* the head of the body */
  size_t body_len;    /* all of it */
  int closed;
  uint32_t close_err;
  int trailers, rst_recv;
  const uint8_t *send; /* request body to send */
  size_t send_len, send_off;
} h2t_stream;

typedef struct h2t {
  memsink m;
  nghttp2_session *cl;
  size_t taken; /* of m.out, already given to the client */
  h2t_stream st[H2T_STREAMS];
  int goaway;
  uint32_t goaway_err;
  int frames_in;
} h2t;

static inline h2t_stream *h2t_st(h2t *t, int32_t id) {
  return id > 0 && id / 2 < H2T_STREAMS ? &t->st[id / 2] : NULL;
}

static inline int h2t_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name,
                                size_t nl, const uint8_t *value, size_t vl, uint8_t flags,
                                void *ud) {
  (void)s;
  (void)flags;
  h2t_stream *st = h2t_st(ud, f->hd.stream_id);
  if (!st) return 0;
  if (f->headers.cat == NGHTTP2_HCAT_HEADERS) st->trailers++;
  if (nl == 7 && !memcmp(name, ":status", 7)) st->status = atoi((const char *)value);
  (void)vl;
  return 0;
}

static inline int h2t_on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *d,
                              size_t n, void *ud) {
  (void)s;
  (void)flags;
  h2t_stream *st = h2t_st(ud, id);
  if (!st) return 0;
  if (st->body_len < sizeof st->body) {
    size_t k = n < sizeof st->body - st->body_len ? n : sizeof st->body - st->body_len;
    memcpy(st->body + st->body_len, d, k);
  }
  st->body_len += n;
  return 0;
}

static inline int h2t_on_close(nghttp2_session *s, int32_t id, uint32_t err, void *ud) {
  (void)s;
  h2t_stream *st = h2t_st(ud, id);
  if (st) {
    st->closed = 1;
    st->close_err = err;
  }
  return 0;
}

static inline int h2t_on_frame(nghttp2_session *s, const nghttp2_frame *f, void *ud) {
  (void)s;
  h2t *t = ud;
  t->frames_in++;
  if (f->hd.type == NGHTTP2_GOAWAY) {
    t->goaway = 1;
    t->goaway_err = f->goaway.error_code;
  }
  if (f->hd.type == NGHTTP2_RST_STREAM) {
    h2t_stream *st = h2t_st(t, f->hd.stream_id);
    if (st) st->rst_recv = 1;
  }
  return 0;
}

static inline ssize_t h2t_read_body(nghttp2_session *s, int32_t id, uint8_t *buf, size_t len,
                                    uint32_t *flags, nghttp2_data_source *src, void *ud) {
  (void)s;
  (void)id;
  (void)ud;
  h2t_stream *st = src->ptr;
  size_t k = st->send_len - st->send_off;
  if (k > len) k = len;
  memcpy(buf, st->send + st->send_off, k);
  st->send_off += k;
  if (st->send_off == st->send_len) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)k;
}

/* Client and server exchange bytes until neither has more to say. */
static inline void h2t_pump(h2t *t) {
  for (int round = 0; round < 10000; round++) {
    int moved = 0;
    const uint8_t *p;
    ssize_t n;
    while ((n = nghttp2_session_mem_send(t->cl, &p)) > 0) {
      memsink_feed(&t->m, p, (size_t)n);
      moved = 1;
    }
    if (memsink_run(&t->m) != 0) abort();
    if (t->m.out_len > t->taken) {
      ssize_t r = nghttp2_session_mem_recv(t->cl, t->m.out + t->taken, t->m.out_len - t->taken);
      if (r < 0) abort(); /* the server sent what the client cannot read */
      t->taken = t->m.out_len;
      moved = 1;
    }
    if (!moved) return;
  }
  abort();
}

/* A connection with prior knowledge; the client's SETTINGS carry iv. */
static inline void h2t_start(h2t *t, const hserve *serve, const nghttp2_settings_entry *iv,
                             size_t niv, int auto_window) {
  memset(t, 0, sizeof *t);
  memsink_init(&t->m, serve);
  t->m.auto_flush = 1;
  if (serve->h2_init(&t->m.s, NULL, NULL, 0) != 0) abort();
  nghttp2_session_callbacks *cb;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_on_header_callback(cb, h2t_on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2t_on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2t_on_close);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2t_on_frame);
  nghttp2_option *opt;
  nghttp2_option_new(&opt);
  if (!auto_window) nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_session_client_new2(&t->cl, cb, t, opt);
  nghttp2_option_del(opt);
  nghttp2_session_callbacks_del(cb);
  nghttp2_submit_settings(t->cl, NGHTTP2_FLAG_NONE, iv, niv);
  h2t_pump(t);
}

/* A request: method, path, then name/value pairs (NULL-terminated), and a
 * body (NULL: none; the stream ends with the headers). */
static inline int32_t h2t_request(h2t *t, const char *method, const char *path,
                                  const char *const *extra, const uint8_t *body, size_t blen) {
  nghttp2_nv nv[40];
  size_t n = 0;
#define H2T_NV(k, v) \
  nv[n++] = (nghttp2_nv){(uint8_t *)(k), (uint8_t *)(v), strlen(k), strlen(v), NGHTTP2_NV_FLAG_NONE}
  H2T_NV(":method", method);
  H2T_NV(":scheme", "http");
  H2T_NV(":authority", "a");
  H2T_NV(":path", path);
  for (size_t i = 0; extra && extra[i] && n < 38; i += 2) H2T_NV(extra[i], extra[i + 1]);
#undef H2T_NV
  int32_t next = nghttp2_session_get_next_stream_id(t->cl);
  h2t_stream *st = h2t_st(t, next);
  if (!st) abort();
  st->send = body;
  st->send_len = blen;
  nghttp2_data_provider prd = {.source.ptr = st, .read_callback = h2t_read_body};
  int32_t id = nghttp2_submit_request(t->cl, NULL, nv, n, body ? &prd : NULL, NULL);
  if (id != next) abort();
  return id;
}

static inline void h2t_free(h2t *t) {
  nghttp2_session_del(t->cl);
  memsink_free(&t->m);
}

#endif
