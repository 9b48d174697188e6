/* test_conn — a conn (server/conn.c) over a loopback socket in a libuv loop,
 * with a fake protocol table: protocol choice by the HTTP/2 preface, the
 * sniffed bytes replayed, ordered batched writes and their owners, the
 * timer, paused reading, close, the connection limit, the bulk lowat. */
#include "tests/unit/test.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include "core/bufref.h"
#include "server/conn.h"
#include "core/daemon.h"
#include "server/hx.h"
#include "server/tokhold.h"

/* ---------------------------------------------------------------- fake protocols */

typedef struct fake {
  int which; /* 1 http1, 2 h2 */
  char in[8192];
  size_t in_len;
  int reads, written, timeouts, closes, revoked;
  int mode; /* what on_read does, see below */
  hsink *s;
} fake;

enum { F_ECHO, F_MANY, F_TIMER, F_PAUSE, F_LATER, F_INTO, F_REVOKE };

/* F_INTO: the protocol offers its own memory to read into (read_into). */
static uint8_t into_buf[1 << 17];
static size_t into_len, into_offer, into_reads, rbuf_bytes;

static fake F;
static int inits_h1, inits_h2;
static int released;
static uv_timer_t resume_timer;

static void count_release(bufref *r) {
  (void)r;
  released++;
}
static bufref later_ref = {count_release};

static void resume_cb(uv_timer_t *t) {
  (void)t;
  sink_read_pause(F.s, 0);
}

static void f_on_read(hsink *s, const uint8_t *d, size_t n) {
  fake *f = s->p;
  f->reads++;
  if (f->mode == F_INTO && f->in_len) { /* after the sniffed first bytes */
    if (d == into_buf + into_len) into_reads++;
    else {
      memcpy(into_buf + into_len, d, n);
      rbuf_bytes += n;
    }
    into_len += n;
    return;
  }
  if (f->in_len + n <= sizeof f->in) {
    memcpy(f->in + f->in_len, d, n);
    f->in_len += n;
  }
  switch (f->mode) {
    case F_ECHO: {
      char *b = malloc(n + 3);
      memcpy(b, "ok:", 3);
      memcpy(b + 3, d, n);
      uv_buf_t buf = uv_buf_init(b, (unsigned)(n + 3));
      void *own = b;
      sink_write(s, &buf, 1, &own, 1);
      break;
    }
    case F_MANY: /* 200 writes in one turn: one batch or more, in order */
      for (int i = 0; i < 200; i++) {
        char pre[16], *b = malloc(4);
        int pl = snprintf(pre, sizeof pre, "%03d", i);
        memcpy(b, "abc\n", 4);
        uv_buf_t buf = uv_buf_init(b, 4);
        void *own = b;
        sink_write_pre(s, pre, (size_t)pl, &buf, 1, &own, 1);
      }
      break;
    case F_TIMER: sink_timer(s, 20); break;
    case F_PAUSE:
      sink_read_pause(s, 1);
      uv_timer_start(&resume_timer, resume_cb, 400, 0);
      f->mode = F_ECHO;
      break;
    case F_LATER: {
      sink_write_copy(s, "x", 1);
      sink_free_later(s, bufref_owner(&later_ref)); /* after that write */
      break;
    }
  }
}
static void f_on_written(hsink *s) { ((fake *)s->p)->written++; }
static void f_on_timeout(hsink *s) {
  ((fake *)s->p)->timeouts++;
  sink_close(s);
}
static void f_on_close(hsink *s) {
  ((fake *)s->p)->closes++;
  s->p = NULL;
}
static const hproto fake_proto = {f_on_read, f_on_written, f_on_timeout, f_on_close};
static uint8_t *f_read_into(hsink *s, size_t *len) {
  (void)s;
  if (!into_offer || into_len + into_offer > sizeof into_buf) return NULL;
  *len = into_offer;
  return into_buf + into_len;
}
static const hproto fake_proto_into = {f_on_read, f_on_written, f_on_timeout, f_on_close,
                                       f_read_into};

static void f_on_revoked(hsink *s) { ((fake *)s->p)->revoked++; }
static const hproto fake_proto_revoke = {f_on_read, f_on_written, f_on_timeout, f_on_close, NULL,
                                         f_on_revoked};

static int f_h1_init(hsink *s) {
  inits_h1++;
  F.which = 1;
  F.s = s;
  s->proto = F.mode == F_INTO ? &fake_proto_into : F.mode == F_REVOKE ? &fake_proto_revoke : &fake_proto;
  s->p = &F;
  return 0;
}
static int f_h2_init(hsink *s, struct hx *up, uint8_t *body, size_t len) {
  (void)body;
  (void)len;
  if (up) return -1;
  inits_h2++;
  F.which = 2;
  F.s = s;
  s->proto = &fake_proto;
  s->p = &F;
  return 0;
}
static const hserve fake_serve = {NULL, f_h1_init, f_h2_init, NULL};

/* ---------------------------------------------------------------- loop and client */

static uv_tcp_t listener;
static int port;

static void on_conn(uv_stream_t *s, int status) {
  ASSERT_EQ(status, 0);
  conn_accept(s, &fake_serve);
}

static void setup(int mode) {
  memset(&F, 0, sizeof F);
  F.mode = mode;
  inits_h1 = inits_h2 = released = 0;
}

static int client(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

/* Run the loop until cond() or ms passed; then what the client got. */
static char got[65536];
static size_t got_len;
static int got_eof;

static void run_until(int fd, int (*cond)(void), int ms) {
  uint64_t end = uv_now(conch.loop) + (uint64_t)ms;
  while (uv_now(conch.loop) < end) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    for (;;) {
      ssize_t r = recv(fd, got + got_len, sizeof got - got_len, MSG_DONTWAIT);
      if (r > 0) got_len += (size_t)r;
      else {
        if (r == 0) got_eof = 1;
        break;
      }
    }
    if (cond && cond()) return;
    usleep(1000);
    uv_update_time(conch.loop);
  }
}

static void client_reset(void) {
  got_len = 0;
  got_eof = 0;
}

static int c_eof(void) { return got_eof; }
static int c_closed(void) { return F.closes > 0; }
static int c_got_echo(void) { return got_len >= 3 + F.in_len && F.in_len > 0; }

static void finish(int fd) {
  close(fd);
  run_until(fd, c_closed, 2000);
  ASSERT_EQ(F.closes, 1);
  run_until(fd, NULL, 20); /* the handles' close callbacks */
}

/* ---------------------------------------------------------------- tests */

TEST(http1_chosen_bytes_replayed) {
  setup(F_ECHO);
  client_reset();
  int fd = client();
  static const char req[] = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  ASSERT_EQ(send(fd, req, sizeof req - 1, 0), (ssize_t)sizeof req - 1);
  run_until(fd, c_got_echo, 2000);
  ASSERT_EQ(inits_h1, 1);
  ASSERT_EQ(inits_h2, 0);
  ASSERT_EQ(F.in_len, sizeof req - 1);
  ASSERT_MEM_EQ(F.in, req, sizeof req - 1);
  ASSERT(got_len >= 3);
  ASSERT_MEM_EQ(got, "ok:", 3);
  ASSERT(F.written >= 1);
  ASSERT_EQ(F.s->outq, 0);
  finish(fd);
}

TEST(h2_chosen_by_split_preface) {
  setup(F_ECHO);
  client_reset();
  int fd = client();
  static const char pre[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nxyz";
  ASSERT_EQ(send(fd, pre, 10, 0), 10);
  run_until(fd, NULL, 50);
  ASSERT_EQ(inits_h1 + inits_h2, 0); /* still sniffing */
  ASSERT_EQ(send(fd, pre + 10, sizeof pre - 11, 0), (ssize_t)sizeof pre - 11);
  run_until(fd, c_got_echo, 2000);
  ASSERT_EQ(inits_h2, 1);
  ASSERT_EQ(F.in_len, sizeof pre - 1);
  ASSERT_MEM_EQ(F.in, pre, sizeof pre - 1);
  finish(fd);
}

/* A preface that goes wrong after a few bytes: HTTP/1.1, all bytes kept. */
TEST(almost_preface_is_http1) {
  setup(F_ECHO);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "PRI * HTTP/1.1\r\n", 16, 0), 16);
  run_until(fd, c_got_echo, 2000);
  ASSERT_EQ(inits_h1, 1);
  ASSERT_EQ(F.in_len, 16);
  ASSERT_MEM_EQ(F.in, "PRI * HTTP/1.1\r\n", 16);
  finish(fd);
}

static int c_many(void) { return got_len >= 200 * 7; }

TEST(writes_ordered_and_released) {
  setup(F_MANY);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "go", 2, 0), 2);
  run_until(fd, c_many, 3000);
  ASSERT_EQ(got_len, 200 * 7);
  for (int i = 0; i < 200; i++) {
    char want[16];
    snprintf(want, sizeof want, "%03dabc", i);
    ASSERT_MEM_EQ(got + 7 * i, want, 6);
  }
  ASSERT_EQ(F.s->outq, 0); /* every byte accounted, every owner freed (ASan) */
  finish(fd);
}

static int c_released(void) { return released > 0; }

TEST(free_later_after_writes) {
  setup(F_LATER);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "a", 1, 0), 1);
  run_until(fd, c_released, 2000);
  ASSERT_EQ(released, 1);
  ASSERT_EQ(got_len, 1);
  finish(fd);
}

TEST(timer_then_close) {
  setup(F_TIMER);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "a", 1, 0), 1);
  run_until(fd, c_eof, 2000);
  ASSERT_EQ(F.timeouts, 1);
  ASSERT_EQ(F.closes, 1); /* on_close once */
  ASSERT(got_eof);
  close(fd);
  run_until(fd, NULL, 20);
}

static int c_one_read(void) { return F.reads >= 1; }
static int c_two_reads(void) { return F.reads >= 2; }

TEST(read_pause) {
  setup(F_PAUSE);
  client_reset();
  uv_timer_init(conch.loop, &resume_timer);
  int fd = client();
  ASSERT_EQ(send(fd, "first", 5, 0), 5);
  run_until(fd, c_one_read, 2000);
  ASSERT_EQ(F.reads, 1);
  ASSERT_EQ(send(fd, "second", 6, 0), 6);
  run_until(fd, NULL, 60);
  ASSERT_EQ(F.reads, 1); /* paused */
  run_until(fd, c_two_reads, 2000);
  ASSERT_EQ(F.reads, 2);
  ASSERT_MEM_EQ(F.in, "firstsecond", 11);
  finish(fd);
  uv_close((uv_handle_t *)&resume_timer, NULL);
  run_until(fd, NULL, 5);
}

/* conn_alloc reads into the protocol's memory when it offers 16 KiB or
 * more (CONN_INTO_MIN), never past the offer; smaller offers are not
 * taken.  The bytes arrive whole and in order either way. */
static size_t into_want;
static int c_into_all(void) { return into_len >= into_want; }

TEST(read_into_offer) {
  setup(F_INTO);
  into_len = into_reads = rbuf_bytes = 0;
  into_offer = 0;
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "GET", 3, 0), 3); /* picks HTTP/1.1 through rbuf */
  run_until(fd, c_one_read, 2000);
  ASSERT_EQ(F.in_len, 3);
  static uint8_t data[100000];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 31 + 7);
  into_offer = 8 * 1024; /* too small: the conn's own buffer */
  into_want = 30000;
  ASSERT_EQ(send(fd, data, 30000, 0), 30000);
  run_until(fd, c_into_all, 2000);
  ASSERT_EQ(into_len, 30000);
  ASSERT_EQ(into_reads, 0);
  ASSERT_EQ(rbuf_bytes, 30000);
  into_offer = 20 * 1024; /* taken, at most 20 KiB a read */
  into_want = sizeof data;
  ASSERT_EQ(send(fd, data + 30000, sizeof data - 30000, 0), (ssize_t)(sizeof data - 30000));
  run_until(fd, c_into_all, 2000);
  ASSERT_EQ(into_len, sizeof data);
  ASSERT(into_reads >= (sizeof data - 30000) / (20 * 1024));
  ASSERT_EQ(rbuf_bytes, 30000);
  ASSERT_MEM_EQ(into_buf, data, sizeof data);
  finish(fd);
}

TEST(eof_closes) {
  setup(F_ECHO);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "x", 1, 0), 1);
  run_until(fd, c_got_echo, 2000);
  shutdown(fd, SHUT_WR);
  run_until(fd, c_closed, 2000);
  ASSERT_EQ(F.closes, 1);
  close(fd);
  run_until(fd, NULL, 20);
}

/* Nothing in the header time: closed before any protocol was chosen. */
TEST(silent_client_closed) {
  setup(F_ECHO);
  client_reset();
  unsigned saved = conch.http_header_ms;
  conch.http_header_ms = 30;
  int fd = client();
  run_until(fd, c_eof, 2000);
  conch.http_header_ms = saved;
  ASSERT(got_eof);
  ASSERT_EQ(inits_h1 + inits_h2, 0);
  close(fd);
  run_until(fd, NULL, 20);
}

TEST(connection_limit) {
  setup(F_ECHO);
  client_reset();
  unsigned saved = conch.max_conns;
  conch.max_conns = 0;
  int fd = client();
  run_until(fd, c_eof, 2000);
  conch.max_conns = saved;
  ASSERT(got_eof);
  ASSERT_EQ(inits_h1 + inits_h2, 0);
  ASSERT(conch.conns_refused >= 1);
  close(fd);
  run_until(fd, NULL, 20);
}

/* The server's end of the client's socket cfd (its peer is cfd's name). */
static int server_fd(int cfd) {
  struct sockaddr_in me, peer;
  socklen_t l = sizeof me;
  ASSERT_EQ(getsockname(cfd, (struct sockaddr *)&me, &l), 0);
  for (int fd = 3; fd < 1024; fd++) {
    l = sizeof peer;
    if (fd != cfd && getpeername(fd, (struct sockaddr *)&peer, &l) == 0 && peer.sin_port == me.sin_port)
      return fd;
  }
  return -1;
}

static int lowat(int fd) {
  int v = -1;
  socklen_t l = sizeof v;
  ASSERT_EQ(getsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, &l), 0);
  return v;
}

/* Bulk exchanges are counted: the socket's unsent bytes are held short
 * from the first until the last is gone; an unmatched end is ignored. */
TEST(bulk_sets_lowat_while_counted) {
  setup(F_ECHO);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "a", 1, 0), 1);
  run_until(fd, c_got_echo, 2000);
  int sfd = server_fd(fd);
  ASSERT(sfd >= 0);
  ASSERT_EQ(lowat(sfd), 0);
  F.s->ops->bulk(F.s, 1);
  ASSERT_EQ(lowat(sfd), 64 * 1024);
  F.s->ops->bulk(F.s, 1);
  F.s->ops->bulk(F.s, 0);
  ASSERT_EQ(lowat(sfd), 64 * 1024);
  F.s->ops->bulk(F.s, 0);
  ASSERT_EQ(lowat(sfd), 0);
  F.s->ops->bulk(F.s, 0);
  F.s->ops->bulk(F.s, 1);
  ASSERT_EQ(lowat(sfd), 64 * 1024);
  finish(fd);
}

/* A request on the connection passed the token check (what connect.c's
 * hx_authed does): the conn records the token generation. */
static void authed(hsink *s) {
  hx x;
  memset(&x, 0, sizeof x);
  x.sink = s;
  hx_authed(&x);
}

/* A replaced token (tokhold.h): a connection authenticated with an older
 * one is handed to its protocol's on_revoked, or closed at once when the
 * protocol has none; one authenticated again since, or not at all, is
 * left alone; a closed one is out of the list. */
TEST(token_replaced_revokes_connection) {
  daemon_set_token("t1", 2);
  setup(F_ECHO);
  client_reset();
  int fd = client();
  ASSERT_EQ(send(fd, "a", 1, 0), 1);
  run_until(fd, c_got_echo, 2000);
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  ASSERT_EQ(daemon_set_token("t2", 2), 1); /* not authenticated: not held */
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  authed(F.s);
  ASSERT(F.s->authed);
  ASSERT_EQ(daemon_set_token("t2", 2), 0);
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  ASSERT_EQ(daemon_set_token("t3", 2), 1);
  ASSERT_EQ(tokhold_revoke_stale(), 1);
  run_until(fd, c_eof, 2000); /* no on_revoked: closed */
  ASSERT_EQ(F.closes, 1);
  ASSERT(got_eof);
  close(fd);
  run_until(fd, NULL, 20);

  setup(F_REVOKE);
  client_reset();
  fd = client();
  ASSERT_EQ(send(fd, "a", 1, 0), 1);
  run_until(fd, c_one_read, 2000);
  authed(F.s);
  ASSERT_EQ(daemon_set_token("t4", 2), 1);
  authed(F.s); /* authenticated again, with the new token */
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  ASSERT_EQ(F.revoked, 0);
  ASSERT_EQ(daemon_set_token("t5", 2), 1);
  ASSERT_EQ(tokhold_revoke_stale(), 1);
  ASSERT_EQ(F.revoked, 1); /* the protocol's to close */
  ASSERT_EQ(F.closes, 0);
  authed(F.s);
  finish(fd); /* closed: out of the list */
  ASSERT_EQ(daemon_set_token("t6", 2), 1);
  ASSERT_EQ(tokhold_revoke_stale(), 0);
  ASSERT_EQ(F.revoked, 1);
}

int main(void) {
  conch.loop = uv_default_loop();
  struct sockaddr_in a;
  uv_ip4_addr("127.0.0.1", 0, &a);
  uv_tcp_init(conch.loop, &listener);
  if (uv_tcp_bind(&listener, (struct sockaddr *)&a, 0) || uv_listen((uv_stream_t *)&listener, 16, on_conn)) {
    fprintf(stderr, "listen failed\n");
    return 1;
  }
  struct sockaddr_storage ss;
  int sl = sizeof ss;
  uv_tcp_getsockname(&listener, (struct sockaddr *)&ss, &sl);
  port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  RUN(http1_chosen_bytes_replayed);
  RUN(h2_chosen_by_split_preface);
  RUN(almost_preface_is_http1);
  RUN(writes_ordered_and_released);
  RUN(free_later_after_writes);
  RUN(timer_then_close);
  RUN(read_pause);
  RUN(read_into_offer);
  RUN(eof_closes);
  RUN(silent_client_closed);
  RUN(connection_limit);
  RUN(bulk_sets_lowat_while_counted);
  RUN(token_replaced_revokes_connection);
  uv_close((uv_handle_t *)&listener, NULL);
  if (conch.trim_timer) uv_close((uv_handle_t *)conch.trim_timer, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
  free(conch.trim_timer);
  return test_summary();
}
