/* h2 — HTTP/2 on one connection: the session (nghttp2's callbacks, the
 * frames out, the connection's timer and lifecycle); its streams are
 * h2stream.c's.  See h2.h and h2_int.h. */
#include "server/h2.h"

#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/log.h"
#include "proto/text.h"
#include "server/h2_int.h"

/* The connection timer: 10 s (header time) before the first request, while
 * the upgraded client's preface is awaited, and while a header block is
 * open — measured from when that began, not re-armed; else 60 s idle once
 * no exchange is running, restarted whenever one ends (a stream whose
 * response ended but whose client never finished its request does not keep
 * the connection alive); none while an exchange runs.  Worked out once per
 * read or flush (h2_timer_apply), not per stream: a request whose header
 * block arrives whole never arms the header timer. */
void h2_timer_touch(h2c *sc) { sc->tactivity = 1; }

/* An exchange is running on st: dispatched, not ended.  (A stream whose
 * header block is open counts in undispatched.) */
static int h2_running(const h2s *st) { return h2s_dispatched(st) && !st->x.ended; }

static void h2_timer_apply(h2c *sc) {
  if (sc->state == H2C_DEAD || sc->c->closing) return;
  h2_tmode want;
  if (h2c_preface(sc) || sc->undispatched || sc->state == H2C_NEW) {
    want = H2T_HEADER;
  } else {
    want = H2T_IDLE;
    h2s *st;
    list_each(st, &sc->streams, link)
      if (h2_running(st)) {
        want = H2T_NONE;
        break;
      }
  }
  int restart = want == H2T_IDLE && sc->tactivity;
  sc->tactivity = 0;
  if (want == sc->tmode && !restart) return;
  sc->tmode = want;
  sink_timer(sc->c, want == H2T_HEADER ? conch.http_header_ms
                    : want == H2T_IDLE ? conch.http_idle_ms
                                       : 0);
}
/* ---------------------------------------------------------------- nghttp2 callbacks */

static int h2_on_begin_headers(nghttp2_session *ng, const nghttp2_frame *f, void *ud) {
  h2c *sc = ud;
  if (f->hd.type != NGHTTP2_HEADERS || f->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  if (h2c_refusing(sc)) { /* closing (h2_on_revoked): not processed, the client may retry elsewhere */
    nghttp2_submit_rst_stream(ng, NGHTTP2_FLAG_NONE, f->hd.stream_id, NGHTTP2_REFUSED_STREAM);
    return 0;
  }
  if (!sc->c->authed && sc->nstreams >= H2_UNAUTH_STREAMS) {
    sink_unauth_over(sc->c, "too many streams");
    return NGHTTP2_ERR_CALLBACK_FAILURE; /* h2_on_read closes */
  }
  h2s *st = h2_stream_new(sc, f->hd.stream_id);
  if (!st) return NGHTTP2_ERR_CALLBACK_FAILURE;
  nghttp2_session_set_stream_user_data(ng, f->hd.stream_id, st);
  sc->hstream_id = f->hd.stream_id;
  sc->hstream = st;
  return 0;
}

static int h2_on_header(nghttp2_session *ng, const nghttp2_frame *f, nghttp2_rcbuf *nrc,
                        nghttp2_rcbuf *vrc, uint8_t flags, void *ud) {
  (void)flags;
  h2c *sc = ud;
  if (f->hd.type != NGHTTP2_HEADERS) return 0;
  if (sc->hstream_id != f->hd.stream_id) {
    sc->hstream_id = f->hd.stream_id;
    sc->hstream = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  }
  h2s *st = sc->hstream;
  if (!st || h2s_reset(st)) return 0;
  nghttp2_vec nv = nghttp2_rcbuf_get_buf(nrc), vv = nghttp2_rcbuf_get_buf(vrc);
  const uint8_t *name = nv.base, *value = vv.base;
  size_t nlen = nv.len, vlen = vv.len;
  if (st->state != H2S_HEADERS) { /* trailers: checked, otherwise ignored */
    if (h2check_trailer_field(name, nlen, value, vlen) != 0) h2_malformed(st);
    return 0;
  }
  h2check_kind kind;
  if (h2check_classify(name, nlen, value, vlen, &kind) != 0 || h2check_apply(&st->chk, &kind) != 0) {
    h2_malformed(st);
    return 0;
  }
  st->hbytes += nlen + vlen + 32;
  if (st->hbytes > H2_MAX_HEADER_LIST) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  if (nlen && name[0] == ':') {
    char **dst = NULL;
    if (nlen == 7 && memcmp(name, ":method", 7) == 0) dst = &st->x.method;
    else if (nlen == 5 && memcmp(name, ":path", 5) == 0) dst = &st->x.path;
    if (dst && !*dst) {
      const uint8_t *q = dst == &st->x.path ? memchr(value, '?', vlen) : NULL;
      size_t l = q ? (size_t)(q - value) : vlen;
      *dst = hx_strdup(&st->x, (const char *)value, l);
      if (q) st->x.query = hx_strdup(&st->x, (const char *)q + 1, vlen - l - 1);
      if (!*dst || (q && !st->x.query)) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
    }
    return 0;
  }
  if (hx_add_header(&st->x, (const char *)name, nlen, (const char *)value, vlen) != 0)
    return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;
  return 0;
}

static int h2_on_frame_recv(nghttp2_session *ng, const nghttp2_frame *f, void *ud) {
  h2c *sc = ud;
  if (h2c_preface(sc) && f->hd.type == NGHTTP2_SETTINGS) { /* the client's preface */
    h2c_set_state(sc, sc->state == H2C_PREFACE ? H2C_OPEN : H2C_REVOKED);
    h2_timer_touch(sc);
    sink_defer(sc->c, h2_deferred);
  }
  if (f->hd.type != NGHTTP2_HEADERS && f->hd.type != NGHTTP2_DATA) return 0;
  h2s *st = nghttp2_session_get_stream_user_data(ng, f->hd.stream_id);
  if (!st || h2s_reset(st)) return 0;
  int end = (f->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0;
  if (f->hd.type == NGHTTP2_HEADERS) {
    /* a header block needs its pseudo-headers; trailers must end the stream */
    int trailers = st->state != H2S_HEADERS;
    if (trailers ? !end : h2check_end_headers(&st->chk) != 0) {
      h2_malformed(st);
      return 0;
    }
    if (!trailers) h2_headers_done(st);
  }
  if (end && (st->state == H2S_QUEUED || st->state == H2S_OPEN)) {
    if (h2check_end_stream(&st->chk) != 0) h2_malformed(st); /* DATA short of content-length */
    else h2_stream_body_end(st);
  }
  return 0;
}

static int h2_on_data_chunk(nghttp2_session *ng, uint8_t flags, int32_t id, const uint8_t *d,
                            size_t n, void *ud) {
  (void)flags;
  (void)ud;
  h2s *st = nghttp2_session_get_stream_user_data(ng, id);
  if (st && !h2s_reset(st) && h2check_data(&st->chk, n) != 0) h2_malformed(st); /* past content-length */
  if (!st || h2s_reset(st)) {
    nghttp2_session_consume(ng, id, n);
    return 0;
  }
  h2_stream_body(st, d, n, 1);
  return 0;
}

static int h2_on_stream_close(nghttp2_session *ng, int32_t id, uint32_t err, void *ud) {
  (void)err;
  h2c *sc = ud;
  h2s *st = nghttp2_session_get_stream_user_data(ng, id);
  if (!st || sc->state == H2C_DEAD) return 0;
  nghttp2_session_set_stream_user_data(ng, id, NULL);
  h2_stream_close(st);
  return 0;
}
int h2_out_flush(h2c *sc) {
  if (!sc->olen) return 0;
  uv_buf_t b = uv_buf_init((char *)sc->ob, (unsigned)sc->olen);
  void *owned = sc->ob;
  sc->ohint = sc->olen;
  sc->ob = NULL;
  sc->olen = sc->ocap = 0;
  return sink_write(sc->c, &b, 1, &owned, 1);
}

int h2_out_put(h2c *sc, const uint8_t *p, size_t n) {
  if (sc->olen + n > sc->ocap) {
    /* the first block as big as the last write (answers to a burst of
     * calls go out together, and regrowing it cost two reallocs a write),
     * a small one small-bin sized */
    size_t cap = sc->ocap ? sc->ocap * 2 : 496;
    while (!sc->ocap && cap < sc->ohint && cap * 2 <= H2_OUT_HINT_MAX) cap *= 2;
    while (cap < sc->olen + n) cap *= 2;
    uint8_t *q = realloc(sc->ob, cap);
    if (!q) return -1;
    sc->ob = q;
    sc->ocap = cap;
  }
  memcpy(sc->ob + sc->olen, p, n);
  sc->olen += n;
  return 0;
}

/* ---------------------------------------------------------------- sending */

/* A revoked connection's last stream is gone: GOAWAY (NO_ERROR), after
 * which nghttp2 wants neither to read nor to write, and h2_flush_out
 * closes once the bytes left.  1 when it was submitted now. */
static int h2_goaway_when_done(h2c *sc) {
  if (sc->state != H2C_REVOKED || !list_empty(&sc->streams)) return 0;
  h2c_set_state(sc, H2C_GOAWAY);
  nghttp2_submit_goaway(sc->ng, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(sc->ng),
                        NGHTTP2_NO_ERROR, NULL, 0);
  return 1;
}

static void h2_flush_out(h2c *sc) {
  hsink *c = sc->c;
  if (sc->state == H2C_DEAD || c->closing || h2c_preface(sc)) return;
  h2_goaway_when_done(sc);
  while (c->outq + sc->olen < H2_CONN_OUTQ_MAX) {
    const uint8_t *p;
    ssize_t n = nghttp2_session_mem_send(sc->ng, &p);
    if (n < 0) {
      LOG_DEBUG("h2 send error conn=%llu err=%s", (unsigned long long)c->id,
                nghttp2_strerror((int)n));
      sink_close(c);
      return;
    }
    if (n == 0) break;
    if (h2_out_put(sc, p, (size_t)n) != 0) {
      sink_close(c);
      return;
    }
    if (sc->olen >= H2_WRITE_CHUNK && h2_out_flush(sc) != 0) {
      sink_close(c);
      return;
    }
  }
  if (h2_out_flush(sc) != 0) {
    sink_close(c);
    return;
  }
  int pause = c->outq >= H2_READ_OUTQ_MAX;
  if (pause != sc->read_paused) {
    sc->read_paused = pause;
    sink_read_pause(c, pause);
  }
  if (!list_empty(&sc->room_fifo)) h2_room_wake(sc);
  /* drain notifications, outside nghttp2's callbacks */
  h2s *st, *n;
  list_each_safe(st, n, &sc->streams, link) {
    if (st->want_drain) {
      st->want_drain = 0;
      if (!st->x.ended && st->x.h && st->x.h->on_drain) st->x.h->on_drain(&st->x);
      if (c->closing) return;
    }
  }
  if (h2_goaway_when_done(sc)) { /* the last stream closed while sending */
    sink_defer(c, h2_deferred);
    return;
  }
  if (!nghttp2_session_want_read(sc->ng) && !nghttp2_session_want_write(sc->ng) && c->outq == 0)
    sink_close(c);
}

/* Send what there is, then set the connection timer for the new state. */
static void h2_flush(h2c *sc) {
  hsink *c = sc->c; /* outlives sc: freed only once its handles closed */
  h2_flush_out(sc);
  if (!c->closing) h2_timer_apply(sc);
}

/* Deferred work: held bodies of un-paused streams, then sending. */
void h2_deferred(hsink *c) {
  h2c *sc = c->p;
  if (!sc) return;
  if (!list_empty(&sc->admit_fifo)) h2_admit(sc);
  if (c->closing) return;
  h2s *st, *n;
  list_each_safe(st, n, &sc->streams, link) {
    if (!h2s_dispatched(st)) continue; /* its header block is open, or it waits for admission */
    if (!st->body_paused && st->pend_len) {
      uint8_t *p = st->pend;
      size_t len = st->pend_len, unc = st->pend_unconsumed;
      st->pend = NULL;
      st->pend_len = st->pend_cap = st->pend_unconsumed = 0;
      if (!st->x.ended && st->x.h && st->x.h->on_body) hx_body(&st->x, p, len);
      free(p);
      if (c->closing) return;
      if (unc) nghttp2_session_consume(sc->ng, st->id, unc);
      if (st->body_paused) continue; /* paused again: later chunks wait */
    }
    if (st->state == H2S_IN_ENDED && !st->body_paused && !st->pend_len)
      h2_stream_body_end(st);
    if (c->closing) return;
  }
  h2_flush(sc);
}

/* ---------------------------------------------------------------- conn proto */

static void h2_on_read(hsink *c, const uint8_t *d, size_t n) {
  h2c *sc = c->p;
  ssize_t r = nghttp2_session_mem_recv(sc->ng, d, n);
  if (c->closing) return;
  if (r < 0) {
    LOG_DEBUG("h2 recv error conn=%llu err=%s", (unsigned long long)c->id, nghttp2_strerror((int)r));
    h2_flush(sc); /* GOAWAY, if nghttp2 queued one */
    sink_close(c);
    return;
  }
  h2_flush(sc);
}

static void h2_on_written(hsink *c) {
  h2c *sc = c->p;
  if (sc) h2_flush(sc);
}

static void h2_on_timeout(hsink *c) {
  h2c *sc = c->p;
  sc->tmode = H2T_NONE; /* fired: nothing armed now */
  if (h2c_preface(sc)) {
    LOG_DEBUG("h2 timeout conn=%llu: no client preface after the upgrade",
              (unsigned long long)c->id);
    sink_close(c);
    return;
  }
  if (!sc->undispatched) {
    h2s *st;
    list_each(st, &sc->streams, link) {
      if (h2_running(st)) return;
      if (!nghttp2_session_get_stream_local_close(sc->ng, st->id)) {
        sc->tmode = H2T_IDLE;
        sink_timer(c, conch.http_idle_ms); /* its response is still going out: no write timeout */
        return;
      }
    }
    if (c->outq) {
      sc->tmode = H2T_IDLE;
      sink_timer(c, conch.http_idle_ms);
      return;
    }
  }
  LOG_DEBUG("h2 timeout conn=%llu open_header_blocks=%zu", (unsigned long long)c->id,
            sc->undispatched);
  nghttp2_session_terminate_session(sc->ng, NGHTTP2_NO_ERROR);
  h2_flush(sc);
  sink_close(c);
}

static void h2_on_close(hsink *c) {
  h2c *sc = c->p;
  if (!sc) return;
  h2c_set_state(sc, H2C_DEAD);
  h2s *st;
  while ((st = list_first_entry(&sc->streams, h2s, link))) h2_stream_close(st);
  nghttp2_session_del(sc->ng);
  free(sc->ob);
  free(sc);
  c->p = NULL;
}

/* hproto.on_revoked: the token the connection's requests authenticated
 * with was replaced (tokhold.h).  New streams are refused (RST_STREAM
 * REFUSED_STREAM: not processed, a client retries them elsewhere); the
 * streams open finish — their streaming calls have been ended with the
 * error already (connect.c), a unary call completes — and once none is
 * left, GOAWAY (NO_ERROR) and close (h2_goaway_when_done).  GOAWAY comes
 * last rather than first: a client may take frames after a GOAWAY as an
 * error (python-h2 4 does), and nothing needs it earlier. */
static void h2_on_revoked(hsink *c) {
  h2c *sc = c->p;
  if (!sc || c->closing || (sc->state != H2C_NEW && sc->state != H2C_OPEN && sc->state != H2C_PREFACE))
    return;
  h2c_set_state(sc, sc->state == H2C_PREFACE ? H2C_PREFACE_REVOKED : H2C_REVOKED);
  sink_defer(c, h2_deferred); /* from the loop, after the calls' ends */
}

const hproto h2_conn_proto = {h2_on_read, h2_on_written, h2_on_timeout, h2_on_close, NULL, h2_on_revoked};

/* HTTP2-Settings: base64url (proto/text.h's strict decoder); -1 when
 * absent, not base64 or possibly more than cap bytes (for 512: 84 settings,
 * where RFC 9113 defines 7). */
static long h2_b64url_decode(const char *in, uint8_t *out, size_t cap) {
  size_t n = in ? strlen(in) : 0;
  if (!in || TEXT_B64_DECODED_MAX(n) > cap) return -1;
  return text_b64_decode(in, n, out);
}

/* Whole entries, each value within RFC 9113 §6.5.2's range: nghttp2 takes
 * an out-of-range value in HTTP2-Settings as a connection error, after the
 * 101 would have gone out (the client then heard nothing more). */
int h2_settings_valid(const char *v) {
  uint8_t buf[512];
  long n = h2_b64url_decode(v, buf, sizeof buf);
  if (n < 0 || n % 6 != 0) return 0;
  for (long i = 0; i < n; i += 6) {
    unsigned id = (unsigned)buf[i] << 8 | buf[i + 1];
    uint32_t val = (uint32_t)buf[i + 2] << 24 | (uint32_t)buf[i + 3] << 16 |
                   (uint32_t)buf[i + 4] << 8 | buf[i + 5];
    switch (id) {
      case NGHTTP2_SETTINGS_ENABLE_PUSH:
      case NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL:
        if (val > 1) return 0;
        break;
      case NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE:
        if (val > (uint32_t)NGHTTP2_MAX_WINDOW_SIZE) return 0;
        break;
      case NGHTTP2_SETTINGS_MAX_FRAME_SIZE:
        if (val < 16384 || val > 16777215) return 0; /* 2^14 .. 2^24-1 */
        break;
      default: break;
    }
  }
  return 1;
}

int h2_conn_init(hsink *c, hx *up, uint8_t *body, size_t blen) {
  h2c *sc = calloc(1, sizeof *sc);
  c->proto = &h2_conn_proto;
  nghttp2_session_callbacks *cb = NULL;
  nghttp2_option *opt = NULL;
  if (!sc || nghttp2_session_callbacks_new(&cb) != 0 || nghttp2_option_new(&opt) != 0) goto fail;
  sc->c = c;
  nghttp2_session_callbacks_set_on_begin_headers_callback(cb, h2_on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback2(cb, h2_on_header);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, h2_on_frame_recv);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data_chunk);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_stream_close);
  nghttp2_session_callbacks_set_send_data_callback(cb, h2_send_data);
  nghttp2_option_set_no_auto_window_update(opt, 1);
  nghttp2_option_set_no_http_messaging(opt, 1); /* server/h2check.c does the request rules */
  nghttp2_option_set_max_deflate_dynamic_table_size(opt, 4096);
  if (nghttp2_session_server_new2(&sc->ng, cb, sc, opt) != 0) goto fail;
  nghttp2_session_callbacks_del(cb);
  nghttp2_option_del(opt);
  cb = NULL;
  opt = NULL;
  nghttp2_settings_entry iv[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, H2_MAX_STREAMS},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, H2_STREAM_WINDOW},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, H2_MAX_HEADER_LIST},
  };
  nghttp2_submit_settings(sc->ng, NGHTTP2_FLAG_NONE, iv, sizeof iv / sizeof iv[0]);
  nghttp2_session_set_local_window_size(sc->ng, NGHTTP2_FLAG_NONE, 0, H2_CONN_WINDOW);
  c->p = sc;
  sc->tmode = H2T_HEADER; /* the client's first request within the header time */
  sink_timer(c, conch.http_header_ms);
  if (up) {
    const char *set = hx_get(up, "http2-settings");
    uint8_t sbuf[512];
    long sl = set ? h2_b64url_decode(set, sbuf, sizeof sbuf) : -1;
    /* a session that gave up on the settings wants nothing more: fail
     * here, while the 101 can still be dropped unsent */
    if (sl < 0 ||
        nghttp2_session_upgrade2(sc->ng, sbuf, (size_t)sl, strcmp(up->method, "HEAD") == 0, NULL) != 0 ||
        !nghttp2_session_want_read(sc->ng)) {
      hx_free_request(up);
      free(up);
      free(body);
      return -1; /* sc freed by conn_close → h2_on_close */
    }
    h2s *st = h2_stream_new(sc, 1);
    if (!st) return -1;
    nghttp2_session_set_stream_user_data(sc->ng, 1, st);
    /* copy the request over (its strings may live inside up) */
    int cr = hx_copy_request(&st->x, up);
    st->x.content_length = up->content_length;
    hx_free_request(up);
    free(up);
    if (cr != 0) {
      free(body);
      return -1;
    }
    h2c_set_state(sc, H2C_PREFACE);
    h2_headers_done(st); /* the first stream: admitted at once */
    if (blen && !c->closing) h2_stream_body(st, body, blen, 0);
    free(body);
    if (!c->closing) h2_stream_body_end(st);
    if (!c->closing) h2_timer_apply(sc);
  }
  if (!c->closing) sink_defer(c, h2_deferred);
  return 0;
fail:
  if (cb) nghttp2_session_callbacks_del(cb);
  if (opt) nghttp2_option_del(opt);
  free(sc);
  if (up) {
    hx_free_request(up);
    free(up);
  }
  free(body);
  return -1;
}

