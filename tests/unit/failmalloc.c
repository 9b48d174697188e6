/* failmalloc — every allocation of a parse fails once in turn (nghttp2's
 * failmalloc idea): the parse must fail cleanly or succeed, never crash,
 * and leave no allocation behind.  malloc and friends are interposed here
 * (this binary is built without ASan, whose allocator would be in the way);
 * "live" counts blocks allocated and not freed while armed.
 *
 * Parsers: JSON, proto3 JSON, protobuf (with the server's checks), the
 * init message, the module load order, gzip (inflate and deflate). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "init/initmsg.h"
#include "init/modules.h"
#include "proto/agent.pb-c.h"
#include "proto/gzip.h"
#include "proto/json.h"
#include "proto/pbjson.h"
#include "proto/pbmem.h"
#include "proto/pbwire.h"
#include "test.h"

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);

static int armed;
static long calls, fail_at = -1, live;

static int should_fail(void) { return armed && calls++ == fail_at; }

void *malloc(size_t n) {
  if (should_fail()) return NULL;
  void *p = __libc_malloc(n);
  if (p && armed) live++;
  return p;
}
void *calloc(size_t a, size_t b) {
  if (should_fail()) return NULL;
  void *p = __libc_calloc(a, b);
  if (p && armed) live++;
  return p;
}
void *realloc(void *o, size_t n) {
  if (should_fail()) return NULL;
  void *p = __libc_realloc(o, n);
  if (p && !o && armed) live++;
  return p;
}
void free(void *p) {
  if (p && armed) live--;
  __libc_free(p);
}

typedef int (*parse_fn)(const void *in, size_t n); /* 1 parsed, 0 refused */

/* Run fn with no failure (counting allocations; it must give `expect`),
 * then once per allocation with that one failing.  Every run leaves no
 * block behind; a failing run may refuse a good input (out of memory) but
 * never accepts a bad one. */
static void sweep(const char *what, parse_fn fn, const void *in, size_t n, int expect) {
  calls = 0, fail_at = -1, live = 0, armed = 1;
  int ok = fn(in, n);
  armed = 0;
  long total = calls;
  if (ok != expect) TEST_FAIL_("%s: parse gave %d, expected %d", what, ok, expect);
  if (total == 0) TEST_FAIL_("%s: no allocation seen: malloc is not interposed", what);
  if (live != 0) TEST_FAIL_("%s: %ld blocks left without a failure", what, live);
  for (long i = 0; i < total; i++) {
    calls = 0, fail_at = i, live = 0, armed = 1;
    int r = fn(in, n);
    armed = 0;
    if (live != 0) TEST_FAIL_("%s: allocation %ld of %ld failing left %ld blocks", what, i, total, live);
    if (r && !expect) TEST_FAIL_("%s: allocation %ld failing made a bad input pass", what, i);
  }
  printf("  %s: %ld allocations, each failed once (parse %s)\n", what, total, ok ? "ok" : "refused");
}

static int p_json(const void *in, size_t n) {
  json_value *v = json_parse(in, n, NULL, 0);
  json_free(v);
  return v != NULL;
}

static int p_pbjson(const void *in, size_t n) {
  char err[256];
  ProtobufCMessage *m = pbjson_decode(&pb__start_process_request__descriptor, in, n, err, sizeof err);
  if (!m) return 0;
  size_t jl;
  char *j = pbjson_encode(m, &jl);
  free(j);
  protobuf_c_message_free_unpacked(m, NULL);
  return 1;
}

static int p_pbwire(const void *in, size_t n) {
  char scratch[256];
  pbmem mem;
  pbmem_init(&mem, scratch, sizeof scratch, 1 << 20);
  ProtobufCMessage *m = pbwire_unpack_mem(&pb__start_process_request__descriptor, in, n, &mem);
  if (!m) return 0;
  char err[128];
  int ok = pbjson_check_decoded(m, err, sizeof err) == 0;
  protobuf_c_message_free_unpacked(m, &mem.a);
  return ok;
}

static int p_initmsg(const void *in, size_t n) {
  initmsg_plan p;
  char *msg = NULL, err[128];
  int rc = initmsg_process(in, n, &p, &msg, err, sizeof err);
  if (rc == 0) initmsg_plan_free(&p);
  free(msg);
  return rc == 0;
}

static void m_load(void *a, const char *p) {}
static void m_builtin(void *a, const char *n) {}
static void m_warn(void *a, const char *n, const char *w) {}
static int p_modules(const void *in, size_t n) {
  const char *names[] = {"vsock_loopback", "erofs", "nosuch"};
  modules_plan_ops ops = {m_load, m_builtin, m_warn, NULL};
  return modules_plan(in, n, "kernel/x.ko\n", 12, names, 3, &ops) >= 0;
}

static int p_gunzip(const void *in, size_t n) {
  uint8_t *o = NULL;
  size_t ol;
  gz_result r = gz_inflate(in, n, 1 << 20, &o, &ol);
  free(o);
  return r == GZ_OK;
}

/* deflate, then inflate what it made: both must succeed or fail cleanly */
static int p_gzip_round(const void *in, size_t n) {
  size_t zl, ol;
  uint8_t *z = gz_deflate(in, n / 2, (const uint8_t *)in + n / 2, n - n / 2, 5, 6, &zl);
  if (!z) return 0;
  uint8_t *o = NULL;
  int ok = gz_inflate(z + 5, zl, n, &o, &ol) == GZ_OK && ol == n && memcmp(o, in, n) == 0;
  free(o);
  free(z);
  return ok;
}

static const char JSON_DOC[] =
    "{\"cmd\":\"python3\",\"args\":[\"-c\",\"print(1)\",\"x\"],\"env\":{\"A\":\"b\",\"C\":\"d\"},"
    "\"cwd\":\"/tmp\",\"pty\":{\"cols\":80,\"rows\":24},\"stdin\":\"aGk=\",\"tag\":\"t\\u00e9\"}";

TEST(json_parser) {
  sweep("json", p_json, JSON_DOC, strlen(JSON_DOC), 1);
  const char *deep = "[[[[[[[[{\"a\":[1,2,{\"b\":\"c\"}]}]]]]]]]]";
  sweep("json deep", p_json, deep, strlen(deep), 1);
  sweep("json refused", p_json, "[1,2", 4, 0);
}

TEST(pbjson_decoder) {
  sweep("pbjson", p_pbjson, JSON_DOC, strlen(JSON_DOC), 1);
  const char *bad = "{\"cmd\":\"x\",\"env\":{\"A\":\"1\",\"A\":\"2\"}}";
  sweep("pbjson refused", p_pbjson, bad, strlen(bad), 0);
}

TEST(protobuf_decoder) {
  Pb__StartProcessRequest r = PB__START_PROCESS_REQUEST__INIT;
  char *args[] = {"-c", "print(1)"};
  r.cmd = "python3";
  r.args = args;
  r.n_args = 2;
  Pb__StartProcessRequest__EnvEntry e = PB__START_PROCESS_REQUEST__ENV_ENTRY__INIT, *ep = &e;
  e.key = "K";
  e.value = "V";
  r.env = &ep;
  r.n_env = 1;
  uint8_t buf[256];
  size_t n = protobuf_c_message_pack(&r.base, buf);
  sweep("protobuf", p_pbwire, buf, n, 1);
}

TEST(init_message) {
  const char *m = "{\"version\":1,\"sandboxID\":\"s\",\"agentToken\":\"t\",\"env\":{\"K\":\"V\"},"
                  "\"network\":{\"guestIP\":\"10.0.2.15\",\"prefixLength\":24,\"gateway\":\"10.0.2.2\","
                  "\"dns\":{\"nameservers\":[\"10.0.2.3\"],\"search\":[\"a.test\"],\"options\":[\"x\"]}},"
                  "\"timestampMs\":1764590000123,\"entropy\":\"AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\"}";
  sweep("init message", p_initmsg, m, strlen(m), 1);
  const char *bad = "{\"version\":1,\"sandboxID\":\"s\",\"agentToken\":\"t\",\"env\":{\"K=\":\"V\"}}";
  sweep("init message refused", p_initmsg, bad, strlen(bad), 0);
}

TEST(module_order) {
  const char *dep = "kernel/net/vsock.ko:\nkernel/net/vsock_loopback.ko: kernel/net/vmw_common.ko kernel/net/vsock.ko\n"
                    "kernel/net/vmw_common.ko: kernel/net/vsock.ko\nkernel/fs/erofs.ko: kernel/lib/lz4.ko\n"
                    "kernel/lib/lz4.ko:\n";
  sweep("modules", p_modules, dep, strlen(dep), 1);
}

TEST(gzip) {
  char big[20000];
  for (size_t i = 0; i < sizeof big; i++) big[i] = (char)('a' + (i * 7 + i / 13) % 26);
  sweep("gzip round trip", p_gzip_round, big, sizeof big, 1);
  size_t zl;
  uint8_t *z = gz_deflate((const uint8_t *)big, sizeof big, NULL, 0, 0, 6, &zl);
  ASSERT(z != NULL);
  sweep("gunzip", p_gunzip, z, zl, 1);
  sweep("gunzip refused", p_gunzip, z, zl - 3, 0);
  free(z);
}

int main(void) {
  RUN(json_parser);
  RUN(pbjson_decoder);
  RUN(protobuf_decoder);
  RUN(init_message);
  RUN(module_order);
  RUN(gzip);
  return test_summary();
}
