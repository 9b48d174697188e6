/* test_http1 — the HTTP/1.1 core (server/http1.c) driven through a memory
 * sink (memsink.h): request bytes in, response bytes out, no socket. */
#include "tests/unit/test.h"
#include "tests/unit/memsink.h"

#include "core/daemon.h"
#include "server/h2.h"
#include "server/http1.h"
#include "core/lifecycle.h"

static int h2_inits;
static int count_h2_init(hsink *s, hx *up, uint8_t *body, size_t len) {
  h2_inits++;
  return h2_conn_init(s, up, body, len);
}

static const hserve serve = {tr_dispatch, http1_conn_init, count_h2_init, h2_settings_valid};

static void start(memsink *m) {
  tr_reset();
  h2_inits = 0;
  memsink_init(m, &serve);
  m->auto_flush = 1;
  ASSERT_EQ(serve.http1_init(&m->s), 0);
}

TEST(get_404) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.1\r\nHost: a\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "HTTP/1.1 404 Not Found\r\n") == (const char *)m.out);
  ASSERT(strstr(memsink_str(&m), "Content-Length: 4\r\n"));
  ASSERT(strstr(memsink_str(&m), "\r\n\r\nnope"));
  ASSERT_EQ(tr_n, 1);
  ASSERT_STR_EQ(tr_x[0].method, "GET");
  ASSERT_STR_EQ(tr_x[0].path, "/x");
  ASSERT(!m.closed);
  ASSERT_EQ(m.timer_ms, conch.http_idle_ms); /* keep-alive: the idle timer */
  memsink_free(&m);
}

TEST(post_content_length_echo) {
  memsink m;
  start(&m);
  m.read_chunk = 7; /* split everywhere */
  memsink_feeds(&m, "POST /echo?q=1 HTTP/1.1\r\nContent-Length: 11\r\nX-A: b\r\n\r\nhello world");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "HTTP/1.1 200 OK\r\n"));
  ASSERT(strstr(memsink_str(&m), "content-type: application/octet-stream\r\n"));
  ASSERT(strstr(memsink_str(&m), "Content-Length: 11\r\n\r\nhello world"));
  ASSERT_EQ(tr_x[0].body_len, 11);
  ASSERT(tr_x[0].body_ended);
  memsink_free(&m);
}

TEST(chunked_both_ways) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /stream HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                    "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  const char *o = memsink_str(&m);
  ASSERT(strstr(o, "Transfer-Encoding: chunked\r\n"));
  ASSERT(strstr(o, "\r\n\r\n5\r\nstart\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"));
  ASSERT_EQ(tr_x[0].body_len, 5);
  memsink_free(&m);
}

TEST(pipelined_in_order) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\none"
                    "POST /echo HTTP/1.1\r\nContent-Length: 3\r\n\r\ntwo"
                    "GET /nothing HTTP/1.1\r\n\r\n"
                    "POST /echo HTTP/1.1\r\nContent-Length: 5\r\n\r\nthree");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 4);
  const char *o = memsink_str(&m);
  const char *a = strstr(o, "\r\n\r\none"), *b = strstr(o, "\r\n\r\ntwo"), *c = strstr(o, "nope"),
             *d = strstr(o, "\r\n\r\nthree");
  ASSERT(a && b && c && d && a < b && b < c && c < d);
  ASSERT_EQ(memsink_count(&m, "HTTP/1.1 "), 4);
  memsink_free(&m);
}

/* One request is answered at a time: the second waits for the first. */
TEST(pipelined_waits_for_answer) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /hold HTTP/1.1\r\n\r\nGET /x HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 1);
  ASSERT_EQ(m.out_len, 0);
  ASSERT(m.read_paused); /* the next request is held, not read on */
  ASSERT_EQ(hx_simple(tr_x[0].x, 200, "text/plain", "held", NULL, 0), 0);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 2);
  const char *o = memsink_str(&m);
  ASSERT(strstr(o, "held") && strstr(o, "nope") && strstr(o, "held") < strstr(o, "nope"));
  memsink_free(&m);
}

/* A client that does not read its answers stops being read: no request is
 * parsed while more than 64 KiB wait, and parsing goes on once they left. */
TEST(output_bound_stops_input) {
  memsink m;
  start(&m);
  m.auto_flush = 0;
  for (int i = 0; i < 4; i++) memsink_feeds(&m, "GET /big?100000 HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 1);
  ASSERT(m.read_paused);
  ASSERT(m.s.outq > 100000);
  memsink_flush(&m);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 2);
  m.auto_flush = 1;
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 4);
  ASSERT_EQ(memsink_count(&m, "HTTP/1.1 200 OK"), 4);
  memsink_free(&m);
}

/* Small answers under the bound do not stop it. */
TEST(small_answers_flow_unflushed) {
  memsink m;
  start(&m);
  m.auto_flush = 0;
  for (int i = 0; i < 20; i++) memsink_feeds(&m, "GET /x HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 20);
  memsink_free(&m);
}

TEST(header_block_too_large) {
  memsink m;
  start(&m);
  size_t n = HTTP1_MAX_HEADER_BYTES + 100;
  char *big = malloc(n + 1);
  memset(big, 'a', n);
  big[n] = 0;
  memsink_feeds(&m, "GET /x HTTP/1.1\r\nX-Big: ");
  memsink_feeds(&m, big);
  memsink_feeds(&m, "\r\n\r\n");
  free(big);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "HTTP/1.1 431 Request Header Fields Too Large\r\n"));
  ASSERT(strstr(memsink_str(&m), "Connection: close\r\n"));
  ASSERT(m.closed);
  ASSERT_EQ(tr_n, 0);
  memsink_free(&m);
}

TEST(too_many_headers) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.1\r\n");
  for (int i = 0; i < HX_MAX_HEADERS + 1; i++) {
    char h[32];
    snprintf(h, sizeof h, "H%d: v\r\n", i);
    memsink_feeds(&m, h);
  }
  memsink_feeds(&m, "\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "HTTP/1.1 431 "));
  ASSERT(m.closed);
  memsink_free(&m);
}

static void bad(const char *req, const char *want) {
  memsink m;
  start(&m);
  memsink_feeds(&m, req);
  ASSERT_EQ(memsink_run(&m), 0);
  if (!strstr(memsink_str(&m), want)) TEST_FAIL_("%s: got %s", want, memsink_str(&m));
  ASSERT(m.closed);
  ASSERT_EQ(tr_n, 0);
  memsink_free(&m);
}

TEST(bad_framing) {
  bad("GET /x HTTP/1.1\nHost: a\r\n\r\n", "400 Bad Request: line not ended by CRLF\r\n");
  bad("GET /x HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", "obsolete line folding");
  bad("GET /x HTTP/1.1\r\nHost: a\n\r\n", "line not ended by CRLF");
  bad("GET /x HTTP/1.1\r\nBad Name: a\r\n\r\n", "400 ");
  bad("GET /x HTTP/1.1\r\nA@b: a\r\n\r\n", "400 invalid character in header");
  bad("NOPE\r\n\r\n", "400 ");
  bad("GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", "400 ");
}

TEST(bad_chunk_after_dispatch) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /hold HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 1);
  ASSERT(tr_x[0].aborted); /* the handler hears of it */
  ASSERT(strstr(memsink_str(&m), "400 "));
  ASSERT(m.closed);
  memsink_free(&m);
}

TEST(expect_continue) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /echo HTTP/1.1\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "HTTP/1.1 100 Continue\r\n\r\n") == (const char *)m.out);
  memsink_feeds(&m, "ok");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "Content-Length: 2\r\n\r\nok"));
  memsink_free(&m);
}

TEST(head_has_no_body) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "HEAD /big?50 HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "Content-Length: 50\r\n"));
  ASSERT_EQ(memsink_count(&m, "b"), 0);
  memsink_free(&m);
}

TEST(connection_close) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.1\r\nConnection: close\r\n\r\nGET /y HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "Connection: close\r\n"));
  ASSERT(m.closed);
  ASSERT_EQ(tr_n, 1);
  memsink_free(&m);
}

TEST(http10_closes) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.0\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  memsink_free(&m);
}

TEST(close_aborts_running_exchange) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /hold HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 1);
  ASSERT(!tr_x[0].aborted);
  memsink_close(&m.s); /* the peer went away */
  ASSERT(tr_x[0].aborted);
  memsink_free(&m);
}

TEST(timers) {
  memsink m;
  start(&m);
  /* a request begun but not finished: the header timer, then closed */
  memsink_feeds(&m, "GET /x HTTP/1.1\r\nHost:");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(m.timer_ms, conch.http_header_ms);
  memsink_fire_timer(&m);
  ASSERT(m.closed);
  memsink_free(&m);

  /* an exchange running: the timer does not cut it */
  start(&m);
  memsink_feeds(&m, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(m.timer_ms, 0);
  m.timer_ms = 1;
  memsink_fire_timer(&m);
  ASSERT(!m.closed);
  hx_simple(tr_x[0].x, 200, NULL, "", NULL, 0);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(m.timer_ms, conch.http_idle_ms);
  /* idle: closed */
  memsink_fire_timer(&m);
  ASSERT(m.closed);
  memsink_free(&m);

  /* an answer still going out: no write timeout */
  start(&m);
  m.auto_flush = 0;
  memsink_feeds(&m, "GET /big?1000 HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  memsink_fire_timer(&m);
  ASSERT(!m.closed);
  ASSERT_EQ(m.timer_ms, conch.http_idle_ms);
  memsink_free(&m);
}

TEST(pause_body) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /pause HTTP/1.1\r\nContent-Length: 6\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  memsink_feeds(&m, "abcdef");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.read_paused);
  ASSERT_EQ(tr_x[0].body_len, 0);
  tr_unpause(&tr_x[0]);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_x[0].body_len, 6);
  ASSERT(strstr(memsink_str(&m), "\r\n\r\nabcdef"));
  memsink_free(&m);
}

/* An answer that ends before the request body is in: the rest of the body
 * is read and dropped, and the next request is served. */
TEST(early_answer_drops_body) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /x HTTP/1.1\r\nContent-Length: 5\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(memsink_count(&m, "404"), 1);
  memsink_feeds(&m, "12345GET /y HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 2);
  ASSERT_STR_EQ(tr_x[1].path, "/y");
  memsink_free(&m);
}

/* hproto.read_into as conn.c uses it: inside a Content-Length body the
 * read may go into the handler's buffer, never past the body's end (nor
 * before the head is complete, in a chunked body, while paused, or for a
 * handler without body_into); those bytes reach on_body at that address. */
TEST(read_into_content_length) {
  memsink m;
  start(&m);
  size_t len = 1;
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL); /* no request yet */
  memsink_feeds(&m, "POST /into HTTP/1.1\r\nContent-Length: 20\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL); /* the head is not complete */
  memsink_feeds(&m, "\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  uint8_t *p = m.s.proto->read_into(&m.s, &len);
  ASSERT(p == tr_x[0].into);
  ASSERT_EQ(len, 20); /* the body's 20 bytes, of TR_INTO's room */
  memcpy(p, "0123456789", 10);
  m.s.proto->on_read(&m.s, p, 10);
  ASSERT_EQ(tr_x[0].into_bytes, 10);
  p = m.s.proto->read_into(&m.s, &len);
  ASSERT(p == tr_x[0].into + 10);
  ASSERT_EQ(len, 10);
  memsink_feeds(&m, "abcdefghij"); /* through the sink's buffer: copied */
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_x[0].into_bytes, 10);
  ASSERT(tr_x[0].body_ended);
  ASSERT(strstr(memsink_str(&m), "Content-Length: 20\r\n\r\n0123456789abcdefghij"));
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL); /* the body is in */

  /* a body longer than the buffer: the offer is the buffer's room */
  memsink_feeds(&m, "POST /into HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  p = m.s.proto->read_into(&m.s, &len);
  ASSERT(p == tr_x[1].into);
  ASSERT_EQ(len, TR_INTO);

  /* no offer: a handler without body_into, a chunked body, a paused one */
  memsink_free(&m);
  start(&m);
  memsink_feeds(&m, "POST /echo HTTP/1.1\r\nContent-Length: 20\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL);
  memsink_free(&m);
  start(&m);
  memsink_feeds(&m, "POST /into HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL);
  memsink_feeds(&m, "\r\n0\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "Content-Length: 3\r\n\r\nabc"));
  ASSERT_EQ(tr_x[0].into_bytes, 0);
  memsink_free(&m);
  start(&m);
  memsink_feeds(&m, "POST /into HTTP/1.1\r\nContent-Length: 20\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  hx_pause_body(tr_x[0].x, 1);
  ASSERT(m.s.proto->read_into(&m.s, &len) == NULL);
  hx_pause_body(tr_x[0].x, 0);
  ASSERT(m.s.proto->read_into(&m.s, &len) != NULL);

  /* more than the double keeps, copied (the fuzz drivers' case) */
  memsink_free(&m);
  start(&m);
  memsink_feeds(&m, "POST /into HTTP/1.1\r\nContent-Length: 100\r\n\r\n");
  for (int i = 0; i < 10; i++) memsink_feeds(&m, "0123456789");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_x[0].body_len, 100);
  ASSERT(tr_x[0].body_ended);
  memsink_free(&m);
}

/* HTTP2-Settings "AAMAAABkAAQAoAAAAAIAAAAA": 3 entries. */
TEST(upgrade_h2c) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "POST /echo HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n"
                    "Content-Length: 3\r\n\r\nabc");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(h2_inits, 1);
  /* the 101 and nothing after it until the client's preface */
  ASSERT_STR_EQ(memsink_str(&m),
                "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n");
  ASSERT_EQ(tr_n, 1);
  ASSERT(tr_x[0].body_ended);
  ASSERT_EQ(tr_x[0].body_len, 3);
  size_t at = m.out_len;
  memsink_feed(&m, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\4\0\0\0\0\0", 33);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.out_len > at + 9);
  ASSERT_EQ(m.out[at + 3], 4); /* the server's SETTINGS first */
  ASSERT(!m.closed);
  memsink_free(&m);
}

TEST(upgrade_bad_settings) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /echo HTTP/1.1\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                    "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABk!\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "400 Bad Request: invalid HTTP2-Settings"));
  ASSERT_EQ(h2_inits, 0);
  ASSERT(m.closed);
  memsink_free(&m);
}

/* A bulk exchange (hx_bulk) ends with the exchange: answered on a
 * keep-alive connection, or cut by the connection's close. */
TEST(bulk_ends_with_the_exchange) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  hx_bulk(tr_x[0].x);
  ASSERT_EQ(m.bulk_on, 1);
  ASSERT_EQ(hx_simple(tr_x[0].x, 200, "text/plain", "one", NULL, 0), 0);
  memsink_feeds(&m, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT_EQ(tr_n, 2);
  ASSERT_EQ(m.bulk_off, 1); /* the first, before the next request */
  hx_bulk(tr_x[1].x);
  ASSERT_EQ(m.bulk_on, 2);
  memsink_close(&m.s);
  ASSERT(tr_x[1].aborted);
  ASSERT_EQ(m.bulk_off, 2);
  memsink_free(&m);
  ASSERT_EQ(m.bulk_off, 2);
}

/* hproto.on_revoked (the token its requests authenticated with was
 * replaced): idle → closed at once; a request head half read → closed, never
 * dispatched; an exchange running → it finishes (a head not sent yet says
 * Connection: close), its request body is read to the end, then closed. */
TEST(revoked) {
  memsink m;
  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(!m.closed);
  http1_conn_proto.on_revoked(&m.s);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  memsink_free(&m);

  start(&m);
  memsink_feeds(&m, "GET /x HTTP/1.1\r\nHost:");
  ASSERT_EQ(memsink_run(&m), 0);
  http1_conn_proto.on_revoked(&m.s);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  ASSERT_EQ(tr_n, 0);
  memsink_free(&m);

  /* not answered yet, the body still coming */
  start(&m);
  memsink_feeds(&m, "POST /hold HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc");
  ASSERT_EQ(memsink_run(&m), 0);
  http1_conn_proto.on_revoked(&m.s);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(!m.closed);
  hx_simple(tr_x[0].x, 200, NULL, "ok", NULL, 0);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "Connection: close\r\n"));
  ASSERT(!m.closed); /* the rest of the body first: no reset over the answer */
  memsink_feeds(&m, "defghijGET /y HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  ASSERT_EQ(tr_n, 1);
  memsink_free(&m);

  /* a streaming answer under way (its head went out keep-alive) */
  start(&m);
  memsink_feeds(&m, "POST /stream HTTP/1.1\r\nContent-Length: 4\r\n\r\nab");
  ASSERT_EQ(memsink_run(&m), 0);
  http1_conn_proto.on_revoked(&m.s);
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(!m.closed);
  memsink_feeds(&m, "cd");
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(strstr(memsink_str(&m), "5\r\nstart\r\n2\r\nab\r\n2\r\ncd\r\n0\r\n\r\n"));
  ASSERT(m.closed);
  memsink_free(&m);

  /* answered, the next request not begun: closed at once */
  start(&m);
  memsink_feeds(&m, "GET /hold HTTP/1.1\r\n\r\n");
  ASSERT_EQ(memsink_run(&m), 0);
  hx_simple(tr_x[0].x, 200, NULL, "ok", NULL, 0);
  http1_conn_proto.on_revoked(&m.s); /* before h1_next ran */
  ASSERT_EQ(memsink_run(&m), 0);
  ASSERT(m.closed);
  memsink_free(&m);
}

/* The connection's lifecycle (http1.md's table): a step the table does
 * not hold asserts in a debug build, and is refused and counted in a
 * release build (NDEBUG), the state left as it was. */
static int h1_refused(void *arg) {
  const h1_state *ft = arg;
  return http1_state_try(ft[0], ft[1]) == -1 && lifecycle_refused == 1;
}

TEST(illegal_state_step) {
  static const h1_state bad[][2] = {
    {H1_DONE, H1_HEAD},     /* the next request before this exchange ended */
    {H1_BODY, H1_HEAD},     /* a new head inside a body */
    {H1_IDLE, H1_BODY},     /* dispatched with no head read */
    {H1_UPGRADE, H1_BODY},  /* an upgrade is never dispatched here */
    {H1_CLOSING, H1_IDLE},  /* closing is the end */
    {H1_HEAD, H1_DONE},     /* all in without being dispatched */
    {H1_HELD, H1_BODY},
    {H1_HELD, H1_HEAD},     /* a read while held waits in pend until IDLE */
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT(!http1_state_legal(bad[i][0], bad[i][1]));
    ASSERT_EQ(test_in_child(h1_refused, (void *)bad[i]), lifecycle_asserts ? 0 : 1);
  }
  /* one request's way, and the ways to closing */
  static const h1_state path[] = {H1_IDLE, H1_HELD, H1_IDLE, H1_HEAD, H1_BODY, H1_DONE, H1_IDLE,
                                  H1_HEAD, H1_UPGRADE, H1_CLOSING};
  for (size_t i = 1; i < sizeof path / sizeof path[0]; i++) {
    ASSERT(http1_state_legal(path[i - 1], path[i]));
    ASSERT_EQ(http1_state_try(path[i - 1], path[i]), 0);
  }
  for (int st = 0; st < H1_CLOSING; st++) ASSERT(http1_state_legal((h1_state)st, H1_CLOSING));
  ASSERT_STR_EQ(http1_state_name(H1_DONE), "DONE");
  ASSERT_STR_EQ(http1_state_name(H1_NSTATES), "?");
}

int main(void) {
  RUN(get_404);
  RUN(post_content_length_echo);
  RUN(chunked_both_ways);
  RUN(pipelined_in_order);
  RUN(pipelined_waits_for_answer);
  RUN(output_bound_stops_input);
  RUN(small_answers_flow_unflushed);
  RUN(header_block_too_large);
  RUN(too_many_headers);
  RUN(bad_framing);
  RUN(bad_chunk_after_dispatch);
  RUN(expect_continue);
  RUN(head_has_no_body);
  RUN(connection_close);
  RUN(http10_closes);
  RUN(close_aborts_running_exchange);
  RUN(timers);
  RUN(pause_body);
  RUN(early_answer_drops_body);
  RUN(read_into_content_length);
  RUN(upgrade_h2c);
  RUN(upgrade_bad_settings);
  RUN(bulk_ends_with_the_exchange);
  RUN(revoked);
  RUN(illegal_state_step);
  tr_reset();
  return test_summary();
}
