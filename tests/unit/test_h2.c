/* test_h2 — the HTTP/2 core (server/h2.c) driven by libnghttp2's client
 * over a memory sink (h2client.h), and by hand-built frames. */
#include "tests/unit/test.h"
#include "tests/unit/h2client.h"

#include "core/daemon.h"
#include "server/h2_int.h"
#include "server/http1.h"
#include "core/lifecycle.h"

static const hserve serve = {tr_dispatch, http1_conn_init, h2_conn_init, h2_settings_valid};

static h2t t; /* big: not on the stack */

static void start(const nghttp2_settings_entry *iv, size_t niv, int auto_window) {
  tr_reset();
  h2t_start(&t, &serve, iv, niv, auto_window);
  t.m.s.authed = 1;
}

TEST(get_404) {
  start(NULL, 0, 1);
  int32_t id = h2t_request(&t, "GET", "/x", NULL, NULL, 0);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT(st->closed);
  ASSERT_EQ(st->close_err, 0);
  ASSERT_EQ(st->status, 404);
  ASSERT_EQ(st->body_len, 4);
  ASSERT_MEM_EQ(st->body, "nope", 4);
  ASSERT_EQ(tr_n, 1);
  ASSERT_STR_EQ(tr_x[0].method, "GET");
  ASSERT(!t.m.closed);
  h2t_free(&t);
}

TEST(echo_and_query) {
  start(NULL, 0, 1);
  static const uint8_t body[] = "hello over h2";
  int32_t id = h2t_request(&t, "POST", "/echo?q=1", NULL, body, sizeof body - 1);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT_EQ(st->status, 200);
  ASSERT_EQ(st->body_len, sizeof body - 1);
  ASSERT_MEM_EQ(st->body, body, sizeof body - 1);
  ASSERT_STR_EQ(tr_x[0].path, "/echo");
  h2t_free(&t);
}

TEST(concurrent_streams) {
  start(NULL, 0, 1);
  int32_t ids[50];
  for (int i = 0; i < 50; i++) ids[i] = h2t_request(&t, "POST", i % 2 ? "/echo" : "/big?3000", NULL,
                                                     (const uint8_t *)"abc", 3);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 50);
  for (int i = 0; i < 50; i++) {
    h2t_stream *st = h2t_st(&t, ids[i]);
    ASSERT_EQ(st->status, 200);
    ASSERT_EQ(st->body_len, i % 2 ? 3 : 3000);
  }
  h2t_free(&t);
}

/* The answer stops at the client's window and goes on with its
 * WINDOW_UPDATEs. */
TEST(flow_control_response) {
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 100}};
  start(iv, 1, 0);
  int32_t id = h2t_request(&t, "GET", "/big?1000", NULL, NULL, 0);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT_EQ(st->status, 200);
  ASSERT_EQ(st->body_len, 100);
  ASSERT(!st->closed);
  nghttp2_session_consume(t.cl, id, 100);
  h2t_pump(&t);
  ASSERT_EQ(st->body_len, 200);
  nghttp2_submit_window_update(t.cl, NGHTTP2_FLAG_NONE, id, 1000);
  h2t_pump(&t);
  ASSERT_EQ(st->body_len, 1000);
  ASSERT(st->closed);
  h2t_free(&t);
}

/* A paused request body holds the stream window: the client can send no
 * more than it until the handler takes the bytes. */
TEST(flow_control_request_paused) {
  start(NULL, 0, 1);
  size_t n = H2_STREAM_WINDOW + 300000;
  uint8_t *body = malloc(n);
  memset(body, 'q', n);
  int32_t id = h2t_request(&t, "POST", "/pause", NULL, body, n);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 1);
  ASSERT_EQ(tr_x[0].body_len, 0);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT_EQ(st->send_off, H2_STREAM_WINDOW);
  ASSERT_EQ(nghttp2_session_get_stream_remote_window_size(t.cl, id), 0);
  tr_unpause(&tr_x[0]);
  h2t_pump(&t);
  ASSERT_EQ(st->send_off, n);
  ASSERT(tr_x[0].body_ended);
  ASSERT_EQ(tr_x[0].body_len, TR_BODY_MAX); /* what the double keeps */
  ASSERT_EQ(st->status, 200);
  ASSERT(st->closed);
  free(body);
  h2t_free(&t);
}

TEST(client_reset_aborts) {
  start(NULL, 0, 1);
  int32_t id = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 1);
  ASSERT(!tr_x[0].aborted);
  nghttp2_submit_rst_stream(t.cl, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
  h2t_pump(&t);
  ASSERT(tr_x[0].aborted);
  /* the connection goes on */
  int32_t id2 = h2t_request(&t, "GET", "/x", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(h2t_st(&t, id2)->status, 404);
  h2t_free(&t);
}

TEST(trailers_answer) {
  start(NULL, 0, 1);
  int32_t id = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  hx *x = tr_x[0].x;
  ASSERT_EQ(hx_respond(x, 200, NULL, 0, -1), 0);
  ASSERT_EQ(hx_write_copy(x, "abc", 3), 0);
  hx_header tr = {"grpc-status", "0", 0};
  ASSERT_EQ(hx_end(x, &tr, 1), 0);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT_EQ(st->status, 200);
  ASSERT_EQ(st->body_len, 3);
  ASSERT_EQ(st->trailers, 1);
  ASSERT(st->closed);
  h2t_free(&t);
}

/* A request without :path is malformed: RST_STREAM PROTOCOL_ERROR, never
 * dispatched, and the connection stays. */
TEST(malformed_request_reset) {
  start(NULL, 0, 1);
  nghttp2_nv nv[] = {
      {(uint8_t *)":method", (uint8_t *)"GET", 7, 3, 0},
      {(uint8_t *)":scheme", (uint8_t *)"http", 7, 4, 0},
      {(uint8_t *)":authority", (uint8_t *)"a", 10, 1, 0},
  };
  int32_t id = nghttp2_submit_request(t.cl, NULL, nv, 3, NULL, NULL);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT(st->rst_recv);
  ASSERT_EQ(st->close_err, NGHTTP2_PROTOCOL_ERROR);
  ASSERT_EQ(tr_n, 0);
  ASSERT(!t.m.closed);
  h2t_free(&t);
}

TEST(header_list_too_large) {
  start(NULL, 0, 1);
  static char big[40000];
  memset(big, 'v', sizeof big - 1);
  const char *extra[] = {"x-a", big, "x-b", big, NULL};
  int32_t id = h2t_request(&t, "GET", "/x", extra, NULL, 0);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT(st->closed);
  ASSERT_NE(st->close_err, 0);
  ASSERT_EQ(tr_n, 0);
  h2t_free(&t);
}

/* Bytes that are not HTTP/2 after the preface: GOAWAY, then closed. */
TEST(bad_frames_close) {
  tr_reset();
  memsink m;
  memsink_init(&m, &serve);
  m.auto_flush = 1;
  ASSERT_EQ(h2_conn_init(&m.s, NULL, NULL, 0), 0);
  memsink_feed(&m, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  /* a DATA frame on stream 0 (a connection error) */
  memsink_feed(&m, "\0\0\1\0\0\0\0\0\0x", 10);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  /* the server's SETTINGS, then a GOAWAY (type 7) */
  int goaway = 0;
  for (size_t at = 0; at + 9 <= m.out_len;) {
    size_t len = (size_t)m.out[at] << 16 | (size_t)m.out[at + 1] << 8 | m.out[at + 2];
    if (m.out[at + 3] == 7) goaway = 1;
    at += 9 + len;
  }
  ASSERT(goaway);
  memsink_free(&m);
}

TEST(timers) {
  start(NULL, 0, 1);
  ASSERT_EQ(t.m.timer_ms, conch.http_header_ms); /* the first request within the header time */
  int32_t id = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(t.m.timer_ms, 0); /* an exchange runs */
  hx_simple(tr_x[0].x, 200, NULL, "", NULL, 0);
  h2t_pump(&t);
  ASSERT(h2t_st(&t, id)->closed);
  ASSERT_EQ(t.m.timer_ms, conch.http_idle_ms);
  memsink_fire_timer(&t.m);
  ASSERT(t.m.closed);
  h2t_pump(&t);
  ASSERT(t.goaway);
  ASSERT_EQ(t.goaway_err, NGHTTP2_NO_ERROR);
  h2t_free(&t);
}

/* A client that does not read: no frames are read while 1 MiB or more
 * waits for the socket; reading goes on once it left. */
TEST(output_bound_stops_input) {
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 8 << 20}};
  start(iv, 1, 1);
  nghttp2_submit_window_update(t.cl, NGHTTP2_FLAG_NONE, 0, 64 << 20);
  h2t_pump(&t);
  t.m.auto_flush = 0;
  for (int i = 0; i < 8; i++) h2t_request(&t, "GET", "/big?500000", NULL, NULL, 0);
  const uint8_t *p;
  ssize_t n;
  while ((n = nghttp2_session_mem_send(t.cl, &p)) > 0) memsink_feed(&t.m, p, (size_t)n);
  t.m.read_chunk = 30; /* a few frames a read */
  ASSERT_EQ(memsink_run(&t.m), 0);
  ASSERT(t.m.read_paused);
  ASSERT(t.m.s.outq >= (1u << 20)); /* H2_READ_OUTQ_MAX */
  ASSERT(tr_n < 8);
  t.m.auto_flush = 1;
  t.m.read_chunk = 0;
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 8);
  for (int i = 0; i < 8; i++) ASSERT_EQ(t.st[i].body_len, 500000);
  h2t_free(&t);
}

/* Before the token: at most H2_UNAUTH_STREAMS open streams, then closed. */
TEST(unauthenticated_streams) {
  start(NULL, 0, 1);
  t.m.s.authed = 0;
  for (int i = 0; i < H2_UNAUTH_STREAMS + 1; i++) h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT(t.m.closed);
  ASSERT(tr_n > 0 && tr_n <= H2_UNAUTH_STREAMS); /* the rest waited for admission */
  for (int i = 0; i < tr_n; i++) ASSERT(tr_x[i].aborted);
  h2t_free(&t);
}

/* Admission: while 16 answers are being made (H2_COMPUTING_MAX in h2.c)
 * complete requests wait, in order, and their bodies are held; an answer
 * made lets the next one in. */
TEST(admission_fifo) {
  start(NULL, 0, 1);
  int32_t ids[20];
  for (int i = 0; i < 16; i++) ids[i] = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 16);
  for (int i = 16; i < 20; i++) ids[i] = h2t_request(&t, "POST", "/echo", NULL, (const uint8_t *)"body", 4);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 16);
  for (int i = 16; i < 20; i++) ASSERT_EQ(h2t_st(&t, ids[i])->status, 0); /* waiting */
  /* one slot: the first waiting one goes in, answers at once, and so
   * lets in the next, in order */
  hx_simple(tr_x[0].x, 200, NULL, "a", NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 20);
  for (int i = 16; i < 20; i++) ASSERT_STR_EQ(tr_x[i].path, "/echo");
  h2t_stream *st = h2t_st(&t, ids[16]);
  ASSERT_EQ(st->body_len, 4); /* the body held while it waited reached the handler */
  ASSERT_MEM_EQ(st->body, "body", 4);
  for (int i = 17; i < 20; i++) ASSERT_EQ(h2t_st(&t, ids[i])->status, 200);
  h2t_free(&t);
}

/* A request found malformed while it waits for admission (DATA past its
 * content-length) is reset and leaves the FIFO: never dispatched, and the
 * ones behind it go on in order. */
TEST(malformed_while_queued) {
  start(NULL, 0, 1);
  for (int i = 0; i < 16; i++) h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 16);
  const char *cl[] = {"content-length", "4", NULL};
  int32_t bad = h2t_request(&t, "POST", "/echo", cl, (const uint8_t *)"too long", 8);
  int32_t good = h2t_request(&t, "POST", "/echo", NULL, (const uint8_t *)"ok", 2);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 16);
  h2t_stream *st = h2t_st(&t, bad);
  ASSERT(st->rst_recv);
  ASSERT_EQ(st->close_err, NGHTTP2_PROTOCOL_ERROR);
  hx_simple(tr_x[0].x, 200, NULL, "a", NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 17); /* the good one, not the reset one */
  ASSERT_STR_EQ(tr_x[16].path, "/echo");
  ASSERT_EQ(h2t_st(&t, good)->status, 200);
  ASSERT_EQ(h2t_st(&t, good)->body_len, 2);
  ASSERT(!t.m.closed);
  h2t_free(&t);
}

/* hx_waiting: held answers that wait on the outside (SendInput) stop
 * counting, so requests behind them are dispatched at once — whether the
 * handler says so at its request's end (/wait) or later; a waiting stream
 * is not counted again when it answers. */
TEST(waiting_answers_do_not_count) {
  start(NULL, 0, 1);
  int32_t ids[48];
  for (int i = 0; i < 8; i++) ids[i] = h2t_request(&t, "GET", "/wait", NULL, NULL, 0);
  for (int i = 8; i < 32; i++) ids[i] = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 24); /* 8 waiting + 16 computing */
  for (int i = 8; i < 16; i++) hx_waiting(tr_x[i].x);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 32); /* 8 more waiting let the last 8 in */
  for (int i = 32; i < 36; i++) ids[i] = h2t_request(&t, "POST", "/echo", NULL, (const uint8_t *)"b", 1);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 32); /* 16 computing (16..31) again: these wait */
  for (int i = 0; i < 16; i++) hx_simple(tr_x[i].x, 200, NULL, "w", NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 32); /* answers of waiting streams freed no slot */
  for (int i = 0; i < 16; i++) ASSERT_EQ(h2t_st(&t, ids[i])->status, 200);
  hx_simple(tr_x[16].x, 200, NULL, "c", NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 36);
  for (int i = 32; i < 36; i++) ASSERT_EQ(h2t_st(&t, ids[i])->status, 200);
  h2t_free(&t);
}

/* A bulk exchange (hx_bulk) ends with its stream: answered, reset by the
 * client, or cut by the connection's close — once each. */
TEST(bulk_ends_with_the_stream) {
  start(NULL, 0, 1);
  int32_t a = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  int32_t b = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  int32_t c = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT_EQ(tr_n, 3);
  for (int i = 0; i < 3; i++) hx_bulk(tr_x[i].x);
  ASSERT_EQ(t.m.bulk_on, 3);
  ASSERT_EQ(hx_simple(tr_x[0].x, 200, "text/plain", "done", NULL, 0), 0);
  h2t_pump(&t);
  ASSERT(h2t_st(&t, a)->closed);
  ASSERT_EQ(t.m.bulk_off, 1);
  nghttp2_submit_rst_stream(t.cl, NGHTTP2_FLAG_NONE, b, NGHTTP2_CANCEL);
  h2t_pump(&t);
  ASSERT(tr_x[1].aborted);
  ASSERT_EQ(t.m.bulk_off, 2);
  (void)c;
  memsink_close(&t.m.s);
  ASSERT(tr_x[2].aborted);
  ASSERT_EQ(t.m.bulk_off, 3);
  ASSERT_EQ(t.m.bulk_on, 3);
  h2t_free(&t);
}

/* hproto.on_revoked (the token its requests authenticated with was
 * replaced): new streams refused (REFUSED_STREAM, never dispatched), the
 * open one finishes, then GOAWAY (NO_ERROR) and close; idle: at once. */
TEST(revoked) {
  start(NULL, 0, 1);
  int32_t id = h2t_request(&t, "GET", "/hold", NULL, NULL, 0);
  h2t_pump(&t);
  h2_conn_proto.on_revoked(&t.m.s);
  h2t_pump(&t);
  ASSERT(!t.goaway);
  ASSERT(!t.m.closed);
  int32_t id2 = h2t_request(&t, "GET", "/x", NULL, NULL, 0);
  h2t_pump(&t);
  ASSERT(h2t_st(&t, id2)->closed);
  ASSERT_EQ(h2t_st(&t, id2)->close_err, NGHTTP2_REFUSED_STREAM);
  ASSERT_EQ(tr_n, 1);
  ASSERT(!t.goaway);
  hx_simple(tr_x[0].x, 200, NULL, "ok", NULL, 0);
  h2t_pump(&t);
  h2t_stream *st = h2t_st(&t, id);
  ASSERT(st->closed);
  ASSERT_EQ(st->close_err, 0);
  ASSERT_EQ(st->status, 200);
  ASSERT_EQ(st->body_len, 2);
  ASSERT(t.goaway);
  ASSERT_EQ(t.goaway_err, NGHTTP2_NO_ERROR);
  ASSERT(t.m.closed);
  h2t_free(&t);

  start(NULL, 0, 1);
  h2t_request(&t, "GET", "/x", NULL, NULL, 0);
  h2t_pump(&t);
  h2_conn_proto.on_revoked(&t.m.s);
  h2t_pump(&t);
  ASSERT(t.goaway);
  ASSERT(t.m.closed);
  h2t_free(&t);
}

/* A stream's and a connection's lifecycle (h2.md's tables): a step the
 * table does not hold asserts in a debug build, and is refused and counted
 * in a release build (NDEBUG), the state left as it was. */
static int h2s_refused(void *arg) {
  const h2s_state *ft = arg;
  h2s *st = calloc(1, sizeof *st);
  st->state = ft[0];
  return h2s_set_state(st, ft[1]) == -1 && st->state == ft[0] && lifecycle_refused == 1;
}

static int h2c_refused(void *arg) {
  const h2c_state *ft = arg;
  h2c sc = {.state = ft[0]};
  return h2c_set_state(&sc, ft[1]) == -1 && sc.state == ft[0] && lifecycle_refused == 1;
}

TEST(illegal_state_step) {
  static const h2s_state sbad[][2] = {
    {H2S_HEADERS, H2S_OPEN},    /* dispatched before admission */
    {H2S_IN_DONE, H2S_OPEN},    /* its end delivered twice */
    {H2S_OPEN, H2S_IN_DONE},    /* the end delivered before END_STREAM */
    {H2S_REFUSED, H2S_OPEN},    /* a reset request is never dispatched */
    {H2S_BROKEN, H2S_IN_ENDED}, /* nothing more is read after a reset */
    {H2S_OPEN, H2S_REFUSED},    /* a dispatched stream breaks, it is not refused */
    {H2S_QUEUED, H2S_BROKEN},
  };
  for (size_t i = 0; i < sizeof sbad / sizeof sbad[0]; i++) {
    ASSERT(!h2s_state_legal(sbad[i][0], sbad[i][1]));
    ASSERT_EQ(test_in_child(h2s_refused, (void *)sbad[i]), lifecycle_asserts ? 0 : 1);
  }
  static const h2c_state cbad[][2] = {
    {H2C_NEW, H2C_GOAWAY},     /* GOAWAY only once revoked */
    {H2C_GOAWAY, H2C_OPEN},    /* revoked stays revoked */
    {H2C_DEAD, H2C_OPEN},      /* dead is the end */
    {H2C_NEW, H2C_PREFACE},    /* the upgrade's stream 1 comes first */
    {H2C_REVOKED, H2C_PREFACE_REVOKED},
  };
  for (size_t i = 0; i < sizeof cbad / sizeof cbad[0]; i++) {
    ASSERT(!h2c_state_legal(cbad[i][0], cbad[i][1]));
    ASSERT_EQ(test_in_child(h2c_refused, (void *)cbad[i]), lifecycle_asserts ? 0 : 1);
  }
  /* the ways a request goes */
  static const h2s_state path[][2] = {
    {H2S_HEADERS, H2S_QUEUED},  {H2S_QUEUED, H2S_OPEN},      {H2S_OPEN, H2S_IN_ENDED},
    {H2S_IN_ENDED, H2S_IN_DONE}, {H2S_QUEUED, H2S_QUEUED_IN}, {H2S_QUEUED_IN, H2S_IN_ENDED},
    {H2S_HEADERS, H2S_REFUSED}, {H2S_QUEUED, H2S_REFUSED},   {H2S_OPEN, H2S_BROKEN},
  };
  for (size_t i = 0; i < sizeof path / sizeof path[0]; i++) ASSERT(h2s_state_legal(path[i][0], path[i][1]));
  ASSERT_STR_EQ(h2s_state_name(H2S_QUEUED_IN), "QUEUED_IN");
  ASSERT_STR_EQ(h2c_state_name(H2C_PREFACE_REVOKED), "PREFACE_REVOKED");
}

int main(void) {
  RUN(get_404);
  RUN(echo_and_query);
  RUN(concurrent_streams);
  RUN(flow_control_response);
  RUN(flow_control_request_paused);
  RUN(client_reset_aborts);
  RUN(trailers_answer);
  RUN(malformed_request_reset);
  RUN(header_list_too_large);
  RUN(bad_frames_close);
  RUN(timers);
  RUN(output_bound_stops_input);
  RUN(unauthenticated_streams);
  RUN(admission_fifo);
  RUN(malformed_while_queued);
  RUN(waiting_answers_do_not_count);
  RUN(bulk_ends_with_the_stream);
  RUN(revoked);
  RUN(illegal_state_step);
  tr_reset();
  return test_summary();
}
