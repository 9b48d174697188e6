/* test_init_proto — the init protocol server on a real loop (boot.md §3):
 * framing (1-byte writes, 16384 vs 16385, zero, garbage, truncated, receive
 * timeout — no response, listener still serving), the state machine with
 * retries in each state, READY token replacement, sticky terminal failures,
 * the 1.5 s readiness wait (SIGUSR1 and the ready file) that does not block
 * the loop, and one-connection-at-a-time ordering.  Clients run in threads
 * with blocking sockets; the loop runs on the main thread. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"
#include "core/senv.h"
#include "init/initproto.h"
#include "test.h"

static char sock_path[108];
static char tmpdir[64];

typedef struct client {
  const uint8_t *data;
  size_t len;
  int byte_by_byte;
  int close_after_ms; /* if data sent, wait this long then close without reading (0: read) */
  int connect_delay_ms;
  char resp[20000];
  size_t resp_len;
  int got_eof;
  double t_done; /* seconds since epoch */
  atomic_int done;
  uv_async_t *async;
} client;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void msleep(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void *client_main(void *arg) {
  client *c = arg;
  if (c->connect_delay_ms) msleep(c->connect_delay_ms);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  struct timeval tv = {6, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) goto out;
  if (c->byte_by_byte) {
    for (size_t i = 0; i < c->len; i++) {
      if (send(fd, c->data + i, 1, MSG_NOSIGNAL) != 1) break;
      msleep(1);
    }
  } else {
    size_t off = 0;
    while (off < c->len) {
      ssize_t w = send(fd, c->data + off, c->len - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += (size_t)w;
    }
  }
  if (c->close_after_ms) {
    msleep(c->close_after_ms);
    goto out;
  }
  for (;;) {
    ssize_t r = recv(fd, c->resp + c->resp_len, sizeof c->resp - c->resp_len, 0);
    if (r == 0) {
      c->got_eof = 1;
      break;
    }
    if (r < 0) break;
    c->resp_len += (size_t)r;
  }
out:
  close(fd);
  c->t_done = now_s();
  atomic_store(&c->done, 1);
  uv_async_send(c->async);
  return NULL;
}

static void async_cb(uv_async_t *a) { (void)a; }

/* Run clients concurrently on threads while the loop runs here. */
static void run_clients(client **cs, size_t n) {
  uv_async_t async;
  uv_async_init(conch.loop, &async, async_cb);
  pthread_t th[8];
  for (size_t i = 0; i < n; i++) {
    cs[i]->async = &async;
    pthread_create(&th[i], NULL, client_main, cs[i]);
  }
  for (;;) {
    size_t d = 0;
    for (size_t i = 0; i < n; i++) d += (size_t)atomic_load(&cs[i]->done);
    if (d == n) break;
    uv_run(conch.loop, UV_RUN_ONCE);
  }
  for (size_t i = 0; i < n; i++) pthread_join(th[i], NULL);
  uv_close((uv_handle_t *)&async, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
}

static uint8_t *frame(const char *json, size_t *len) {
  size_t n = strlen(json);
  uint8_t *f = malloc(n + 4);
  f[0] = (uint8_t)(n >> 24);
  f[1] = (uint8_t)(n >> 16);
  f[2] = (uint8_t)(n >> 8);
  f[3] = (uint8_t)n;
  memcpy(f + 4, json, n);
  *len = n + 4;
  return f;
}

/* The response body (static buffer) or NULL when none came. */
static const char *body_of(client *c) {
  static char body[20000];
  if (c->resp_len < 4) return NULL;
  uint32_t n = (uint32_t)(uint8_t)c->resp[0] << 24 | (uint32_t)(uint8_t)c->resp[1] << 16 |
               (uint32_t)(uint8_t)c->resp[2] << 8 | (uint8_t)c->resp[3];
  if (n != c->resp_len - 4) return "<bad length>";
  memcpy(body, c->resp + 4, n);
  body[n] = 0;
  return body;
}

static const char *exchange_opts(const char *json, int byte_by_byte, double *secs) {
  size_t len;
  uint8_t *f = frame(json, &len);
  static client c;
  memset(&c, 0, sizeof c);
  c.data = f;
  c.len = len;
  c.byte_by_byte = byte_by_byte;
  client *cs[1] = {&c};
  double t0 = now_s();
  run_clients(cs, 1);
  if (secs) *secs = c.t_done - t0;
  free(f);
  return body_of(&c);
}

static const char *exchange(const char *json) { return exchange_opts(json, 0, NULL); }

static int first_calls;
static void on_first(void *arg) {
  (void)arg;
  first_calls++;
}

static void setup(initproto_opts o) {
  initproto_close();
  first_calls = 0;
  if (!o.on_first) o.on_first = on_first;
  initproto_configure(&o);
  ASSERT_EQ(initproto_listen(""), -EINVAL);
  char spec[128];
  snprintf(spec, sizeof spec, "unix:%s", sock_path);
  ASSERT_EQ(initproto_listen(spec), 0);
}

#define READY "{\"version\":1,\"status\":\"ready\",\"retryable\":false}"
#define NOT_READY \
  "{\"version\":1,\"status\":\"not_ready\",\"retryable\":true,\"message\":\"sandbox services are not ready\"}"
#define NET "\"network\":{\"guestIP\":\"10.0.0.2\",\"prefixLength\":24,\"gateway\":\"10.0.0.1\"}"
#define MSG(tok) "{\"version\":1,\"sandboxID\":\"sb\",\"agentToken\":\"" tok "\"," NET "}"

TEST(frame_split_into_single_bytes) {
  setup((initproto_opts){0});
  conch.api_serving = 1;
  const char *r = exchange_opts(MSG("t1"), 1, NULL);
  ASSERT_STR_EQ(r, READY);
  ASSERT_STR_EQ(conch.token, "t1");
  ASSERT_EQ(first_calls, 1);
}

TEST(frame_size_bounds) {
  setup((initproto_opts){0});
  conch.api_serving = 1;
  /* exactly 16384 bytes of JSON (padded with spaces) → answered */
  char *big = malloc(16385);
  size_t n = strlen(MSG("t2"));
  memcpy(big, MSG("t2"), n);
  memset(big + n, ' ', 16384 - n);
  big[16384] = 0;
  ASSERT_STR_EQ(exchange(big), READY);
  /* 16385 → closed without a response */
  big = realloc(big, 16386);
  memcpy(big, MSG("t3"), n);
  memset(big + n, ' ', 16385 - n);
  big[16385] = 0;
  ASSERT(exchange(big) == NULL);
  free(big);
  ASSERT_STR_EQ(conch.token, "t2");
  /* zero length → no response */
  static client c0;
  memset(&c0, 0, sizeof c0);
  uint8_t zero[4] = {0, 0, 0, 0};
  c0.data = zero;
  c0.len = 4;
  client *cs[1] = {&c0};
  run_clients(cs, 1);
  ASSERT_EQ(c0.resp_len, 0);
  ASSERT(c0.got_eof);
  /* still serving */
  ASSERT_STR_EQ(exchange(MSG("t4")), READY);
  ASSERT_STR_EQ(conch.token, "t4");
}

TEST(garbage_and_truncated_frames) {
  setup((initproto_opts){0});
  conch.api_serving = 1;
  ASSERT(exchange("not json at all") == NULL);
  ASSERT(exchange("{\"version\":1}{\"version\":1}") == NULL);
  ASSERT(exchange("{\"version\":1,\"bogus\":true}") == NULL);
  ASSERT_EQ(initproto_get_state(), INITPROTO_AWAITING_NETWORK);
  /* header promises 100 bytes, 10 arrive, then the peer closes */
  static client c;
  memset(&c, 0, sizeof c);
  uint8_t trunc[14] = {0, 0, 0, 100, '{', '"', 'v', 'e', 'r', 's', 'i', 'o', 'n', '"'};
  c.data = trunc;
  c.len = sizeof trunc;
  c.close_after_ms = 50;
  client *cs[1] = {&c};
  run_clients(cs, 1);
  /* a truncated header */
  static client h;
  memset(&h, 0, sizeof h);
  h.data = trunc;
  h.len = 2;
  h.close_after_ms = 50;
  cs[0] = &h;
  run_clients(cs, 1);
  /* the listener still answers, and none of that changed the state */
  ASSERT_EQ(initproto_get_state(), INITPROTO_AWAITING_NETWORK);
  ASSERT_STR_EQ(exchange(MSG("t5")), READY);
}

TEST(receive_timeout_closes_without_response) {
  setup((initproto_opts){0});
  static client c;
  memset(&c, 0, sizeof c);
  uint8_t hdr[3] = {0, 0, 0};
  c.data = hdr;
  c.len = 3; /* never completes the header */
  client *cs[1] = {&c};
  double t0 = now_s();
  run_clients(cs, 1);
  double el = c.t_done - t0;
  ASSERT(c.got_eof);
  ASSERT_EQ(c.resp_len, 0);
  if (el < 1.9 || el > 3.5) TEST_FAIL_("receive timeout after %.2f s, want ~2 s", el);
}

TEST(state_machine_retries_and_token_replacement) {
  setup((initproto_opts){0});
  conch.api_serving = 0;
  double secs;
  /* AWAITING → applied, but not serving yet: not_ready after ~1.5 s */
  const char *r = exchange_opts("{\"version\":1,\"sandboxID\":\" sb-A \",\"agentToken\":\" tokA \","
                                "\"env\":{\"FOO\":\"1\"}," NET "}", 0, &secs);
  ASSERT_STR_EQ(r, NOT_READY);
  if (secs < 1.45 || secs > 2.5) TEST_FAIL_("readiness wait %.2f s, want 1.5 s", secs);
  ASSERT_EQ(initproto_get_state(), INITPROTO_NETWORK_APPLIED);
  ASSERT_STR_EQ(conch.token, "tokA");
  ASSERT_STR_EQ(conch.sandbox_id, "sb-A");
  ASSERT_STR_EQ(senv_get("FOO"), "1");
  ASSERT_EQ(first_calls, 1);
  /* NETWORK_APPLIED retry: nothing applied again; now serving → ready */
  conch.api_serving = 1;
  r = exchange_opts("{\"version\":1,\"sandboxID\":\"sb-B\",\"agentToken\":\"tokB\","
                    "\"env\":{\"FOO\":\"2\"}," NET "}", 0, &secs);
  ASSERT_STR_EQ(r, READY);
  ASSERT(secs < 0.5);
  ASSERT_EQ(initproto_get_state(), INITPROTO_READY);
  ASSERT_STR_EQ(conch.token, "tokA");
  ASSERT_STR_EQ(senv_get("FOO"), "1");
  ASSERT_EQ(first_calls, 1);
  /* READY: token replaced, sandbox id updated, env applied again, at once */
  conch.api_serving = 0; /* READY answers at once regardless */
  r = exchange_opts("{\"version\":1,\"sandboxID\":\"sb-C\",\"agentToken\":\"tokC\","
                    "\"env\":{\"FOO\":\"3\",\"BAR\":\"x\"}," NET "}", 0, &secs);
  ASSERT_STR_EQ(r, READY);
  ASSERT(secs < 0.5);
  ASSERT_STR_EQ(conch.token, "tokC");
  ASSERT_STR_EQ(conch.sandbox_id, "sb-C");
  ASSERT_STR_EQ(initproto_sandbox_id(), "sb-C");
  ASSERT_STR_EQ(senv_get("FOO"), "3");
  ASSERT_STR_EQ(senv_get("BAR"), "x");
  ASSERT_EQ(first_calls, 1);
  conch.api_serving = 1;
}

TEST(terminal_is_sticky) {
  setup((initproto_opts){0});
  conch.api_serving = 1;
  const char *want =
      "{\"version\":1,\"status\":\"not_ready\",\"retryable\":false,\"message\":\"unsupported protocol version 2\"}";
  ASSERT_STR_EQ(exchange("{\"version\":2}"), want);
  ASSERT_EQ(initproto_get_state(), INITPROTO_TERMINAL);
  ASSERT_STR_EQ(exchange(MSG("t6")), want);
  ASSERT_STR_EQ(exchange("{\"version\":1,\"sandboxID\":\"\"}"), want);
  ASSERT(exchange("garbage") == NULL); /* undecodable: still no response */
  ASSERT_STR_EQ(exchange(MSG("t7")), want);
  ASSERT_EQ(first_calls, 0);
  /* terminal from READY too */
  setup((initproto_opts){0});
  ASSERT_STR_EQ(exchange(MSG("t8")), READY);
  const char *w2 = "{\"version\":1,\"status\":\"not_ready\",\"retryable\":false,"
                   "\"message\":\"guestIP and gateway must be different\"}";
  ASSERT_STR_EQ(exchange("{\"version\":1,\"sandboxID\":\"s\",\"agentToken\":\"t9\",\"network\":"
                         "{\"guestIP\":\"10.0.0.1\",\"prefixLength\":24,\"gateway\":\"10.0.0.1\"}}"), w2);
  ASSERT_STR_EQ(exchange(MSG("t10")), w2);
  ASSERT_STR_EQ(conch.token, "t8");
}

/* Loop-side helpers for the readiness tests. */
static int ticks;
static void tick_cb(uv_timer_t *t) {
  (void)t;
  ticks++;
}
static char ready_file[128];
static void create_ready_file(uv_timer_t *t) {
  (void)t;
  int fd = open(ready_file, O_CREAT | O_WRONLY, 0644);
  close(fd);
}
static void send_usr1(uv_timer_t *t) {
  (void)t;
  initproto_services_ready();
}

TEST(readiness_ready_file_and_loop_not_blocked) {
  snprintf(ready_file, sizeof ready_file, "%s/services-ready", tmpdir);
  unlink(ready_file);
  setup((initproto_opts){.services_required = 1, .services_ready_path = ready_file});
  conch.api_serving = 1;
  uv_timer_t tick, mk;
  uv_timer_init(conch.loop, &tick);
  uv_timer_init(conch.loop, &mk);
  ticks = 0;
  uv_timer_start(&tick, tick_cb, 5, 5);
  uv_timer_start(&mk, create_ready_file, 300, 0);
  double secs;
  ASSERT_STR_EQ(exchange_opts(MSG("t11"), 0, &secs), READY);
  if (secs < 0.28 || secs > 0.8) TEST_FAIL_("ready after %.2f s, want ~0.3 s", secs);
  if (ticks < 30) TEST_FAIL_("loop blocked during the wait: %d ticks", ticks);
  uv_close((uv_handle_t *)&tick, NULL);
  uv_close((uv_handle_t *)&mk, NULL);
  unlink(ready_file);
}

TEST(readiness_sigusr1_and_ordering) {
  snprintf(ready_file, sizeof ready_file, "%s/services-ready", tmpdir);
  unlink(ready_file);
  setup((initproto_opts){.services_required = 1, .services_ready_path = ready_file});
  conch.api_serving = 1;
  /* A waits (not ready for 1.5 s); B connects meanwhile and is handled after A */
  size_t la, lb;
  uint8_t *fa = frame(MSG("tA"), &la), *fb = frame(MSG("tB"), &lb);
  static client a, b;
  memset(&a, 0, sizeof a);
  memset(&b, 0, sizeof b);
  a.data = fa;
  a.len = la;
  b.data = fb;
  b.len = lb;
  b.connect_delay_ms = 100;
  client *cs[2] = {&a, &b};
  run_clients(cs, 2);
  ASSERT_STR_EQ(body_of(&a), NOT_READY);
  ASSERT_STR_EQ(body_of(&b), NOT_READY);
  ASSERT(b.t_done - a.t_done > 1.3); /* B waited for A, then waited itself */
  free(fa);
  free(fb);
  /* SIGUSR1 (as delivered by pid1.c) makes it ready */
  uv_timer_t t;
  uv_timer_init(conch.loop, &t);
  uv_timer_start(&t, send_usr1, 200, 0);
  double secs;
  ASSERT_STR_EQ(exchange_opts(MSG("tC"), 0, &secs), READY);
  if (secs < 0.18 || secs > 0.8) TEST_FAIL_("ready after %.2f s, want ~0.2 s", secs);
  uv_close((uv_handle_t *)&t, NULL);
}

TEST(merge_missing_never_ready) {
  setup((initproto_opts){.merge_missing = 1});
  conch.api_serving = 1;
  ASSERT_STR_EQ(exchange(MSG("t12")), NOT_READY);
  ASSERT_EQ(first_calls, 1);
  ASSERT_STR_EQ(exchange(MSG("t13")), NOT_READY);
  ASSERT_EQ(initproto_get_state(), INITPROTO_NETWORK_APPLIED);
}

TEST(listen_specs) {
  initproto_close();
  ASSERT_EQ(initproto_listen("tcp:1"), -EINVAL);
  ASSERT_EQ(initproto_listen("vsock:x"), -EINVAL);
  /* a non-socket file at the path is not replaced */
  char p[128];
  snprintf(p, sizeof p, "%s/plain", tmpdir);
  close(open(p, O_CREAT | O_WRONLY, 0644));
  char spec[160];
  snprintf(spec, sizeof spec, "unix:%s", p);
  ASSERT_EQ(initproto_listen(spec), -EEXIST);
  unlink(p);
  /* a stale socket is replaced */
  snprintf(spec, sizeof spec, "unix:%s", sock_path);
  ASSERT_EQ(initproto_listen(spec), 0);
  initproto_close();
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock_path);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  close(fd);
  ASSERT_EQ(initproto_listen(spec), 0);
  initproto_close();
}

TEST(vsock_listener_binds) {
  if (access("/dev/vsock", F_OK) != 0) {
    printf("SKIP vsock_listener_binds: no /dev/vsock on this machine\n");
    return;
  }
  initproto_close();
  /* an unusual port, to keep clear of a real conch-init on 4065 */
  int rc = initproto_listen("vsock:47065");
  if (rc != 0) TEST_FAIL_("vsock listen: %s", strerror(-rc));
  /* a second bind of the same port fails: the first one is really bound */
  int fd = socket(AF_VSOCK, SOCK_STREAM, 0);
  struct sockaddr_vm { sa_family_t f; unsigned short r; unsigned port, cid; unsigned char z[4]; } sa = {
      AF_VSOCK, 0, 47065, 0xffffffffu, {0}};
  ASSERT(bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0);
  ASSERT_EQ(errno, EADDRINUSE);
  close(fd);
  initproto_close();
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/conch-initproto-XXXXXX");
  if (!mkdtemp(tmpdir)) return 2;
  snprintf(sock_path, sizeof sock_path, "%s/init.sock", tmpdir);
  conch.loop = uv_default_loop();
  RUN(frame_split_into_single_bytes);
  RUN(frame_size_bounds);
  RUN(garbage_and_truncated_frames);
  RUN(receive_timeout_closes_without_response);
  RUN(state_machine_retries_and_token_replacement);
  RUN(terminal_is_sticky);
  RUN(readiness_ready_file_and_loop_not_blocked);
  RUN(readiness_sigusr1_and_ordering);
  RUN(merge_missing_never_ready);
  RUN(listen_specs);
  RUN(vsock_listener_binds);
  initproto_close();
  uv_run(conch.loop, UV_RUN_NOWAIT);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) return 2;
  return test_summary();
}
