/* test_h2check — the HTTP/2 request rules (server/h2check.h). */
#include "tests/unit/test.h"
#include "server/h2check.h"

#include <string.h>

static int field(h2check *k, const char *name, const char *value) {
  return h2check_field(k, (const uint8_t *)name, strlen(name), (const uint8_t *)value, strlen(value));
}

/* k from scratch, with the four pseudo-headers (each accepted). */
static void pseudo4(h2check *k, const char *method, const char *scheme, const char *path,
                    const char *authority) {
  h2check_init(k);
  ASSERT_EQ(field(k, ":method", method), 0);
  ASSERT_EQ(field(k, ":scheme", scheme), 0);
  ASSERT_EQ(field(k, ":path", path), 0);
  ASSERT_EQ(field(k, ":authority", authority), 0);
}

/* A complete, good request block into k. */
static void good_block(h2check *k) {
  h2check_init(k);
  ASSERT_EQ(field(k, ":method", "POST"), 0);
  ASSERT_EQ(field(k, ":scheme", "http"), 0);
  ASSERT_EQ(field(k, ":authority", "127.0.0.1:4064"), 0);
  ASSERT_EQ(field(k, ":path", "/pb.FileService/ListFiles?x=1"), 0);
  ASSERT_EQ(field(k, "content-type", "application/json"), 0);
  ASSERT_EQ(field(k, "te", "Trailers"), 0);
  ASSERT_EQ(field(k, "x-empty", ""), 0);
  ASSERT_EQ(field(k, "x-inner", "a \t b"), 0);
  ASSERT_EQ(field(k, "x-obs", "caf\xc3\xa9"), 0);
}

TEST(good_request) {
  h2check k;
  good_block(&k);
  ASSERT_EQ(h2check_end_headers(&k), 0);
  ASSERT_EQ(k.content_length, -1);
  ASSERT_EQ(h2check_data(&k, 1000), 0); /* no content-length: any body */
  ASSERT_EQ(h2check_end_stream(&k), 0);
}

/* Each field is malformed after a good block's pseudo-headers. */
TEST(malformed_fields) {
  static const char *bad[][2] = {
      {"Content-Type", "x"}, {"x a", "1"}, {"x\x01", "1"}, {"", "x"}, {"x-a", "a\r\nb"},
      {"x-a", "a\x00" "b"}, {"x-a", "\x7f"}, {"x-a", " lead"}, {"x-a", "trail\t"}, {"connection", "close"},
      {"keep-alive", "1"}, {"proxy-connection", "x"}, {"transfer-encoding", "chunked"}, {"upgrade", "h2c"},
      {"te", "gzip"}, {"te", "trailers, deflate"}, {":foo", "bar"}, {":protocol", "websocket"},
      {":method", "GET"}, /* a second :method */
      {":path", "/again"}, {"content-length", "1x"}, {"content-length", ""}, {"content-length", "-1"},
      {"content-length", "99999999999999999999"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    h2check k;
    h2check_init(&k);
    ASSERT_EQ(field(&k, ":method", "POST"), 0);
    ASSERT_EQ(field(&k, ":path", "/"), 0);
    size_t vl = strlen(bad[i][1]);
    if (i == 5) vl = 3; /* "a\0b" */
    int r = h2check_field(&k, (const uint8_t *)bad[i][0], strlen(bad[i][0]), (const uint8_t *)bad[i][1], vl);
    if (r != -1) TEST_FAIL_("accepted: %s: %s", bad[i][0], bad[i][1]);
  }
}

TEST(pseudo_headers) {
  h2check k;
  /* after a regular field */
  h2check_init(&k);
  ASSERT_EQ(field(&k, ":method", "GET"), 0);
  ASSERT_EQ(field(&k, "accept", "*/*"), 0);
  ASSERT_EQ(field(&k, ":path", "/"), -1);
  /* bad values */
  static const char *bad[][2] = {
      {":method", ""}, {":method", "GE T"}, {":path", ""}, {":path", "x/y"}, {":path", "/a b"},
      {":path", "/\x01"}, {":scheme", ""}, {":scheme", "1http"}, {":scheme", "ht tp"},
      {":authority", "a b"}, {":authority", "a/b"}, {":authority", "h\"x"}, {":authority", ""},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    h2check_init(&k);
    if (field(&k, bad[i][0], bad[i][1]) != -1) TEST_FAIL_("accepted: %s: %s", bad[i][0], bad[i][1]);
  }
  /* good ones of note */
  pseudo4(&k, "PATCH", "coap+tcp", "/a%20b?q=\xc3\xa9", "[::1]:4064");
  ASSERT_EQ(h2check_end_headers(&k), 0);
}

TEST(end_of_headers) {
  h2check k;
  const char *need[] = {":method", ":scheme", ":path"};
  for (int miss = 0; miss < 3; miss++) { /* each required pseudo-header missing */
    h2check_init(&k);
    if (miss != 0) ASSERT_EQ(field(&k, ":method", "GET"), 0);
    if (miss != 1) ASSERT_EQ(field(&k, ":scheme", "http"), 0);
    if (miss != 2) ASSERT_EQ(field(&k, ":path", "/"), 0);
    ASSERT_EQ(field(&k, ":authority", "x"), 0);
    if (h2check_end_headers(&k) != -1) TEST_FAIL_("accepted without %s", need[miss]);
  }
  /* :authority or host */
  h2check_init(&k);
  ASSERT_EQ(field(&k, ":method", "GET"), 0);
  ASSERT_EQ(field(&k, ":scheme", "http"), 0);
  ASSERT_EQ(field(&k, ":path", "/"), 0);
  ASSERT_EQ(h2check_end_headers(&k), -1);
  ASSERT_EQ(field(&k, "host", ""), -1);
  ASSERT_EQ(field(&k, "host", "x"), 0);
  ASSERT_EQ(h2check_end_headers(&k), 0);
  ASSERT_EQ(field(&k, "host", "y"), -1); /* once */
  /* "*" only with OPTIONS */
  pseudo4(&k, "GET", "http", "*", "x");
  ASSERT_EQ(h2check_end_headers(&k), -1);
  pseudo4(&k, "OPTIONS", "http", "*", "x");
  ASSERT_EQ(h2check_end_headers(&k), 0);
}

TEST(content_length_against_data) {
  h2check k;
  good_block(&k);
  ASSERT_EQ(field(&k, "content-length", "10"), 0);
  ASSERT_EQ(k.content_length, 10);
  ASSERT_EQ(field(&k, "content-length", "10"), -1); /* once only, even the same value */
  ASSERT_EQ(h2check_end_headers(&k), 0);
  ASSERT_EQ(h2check_data(&k, 4), 0);
  ASSERT_EQ(h2check_end_stream(&k), -1); /* short */
  ASSERT_EQ(h2check_data(&k, 6), 0);
  ASSERT_EQ(h2check_end_stream(&k), 0);
  ASSERT_EQ(h2check_data(&k, 1), -1); /* past it */
  good_block(&k);
  ASSERT_EQ(field(&k, "content-length", "0"), 0);
  ASSERT_EQ(h2check_end_stream(&k), 0);
  good_block(&k);
  ASSERT_EQ(field(&k, "content-length", "9223372036854775807"), 0);
  good_block(&k);
  ASSERT_EQ(field(&k, "content-length", "9223372036854775808"), -1);
}

TEST(trailers) {
  const char *v = "1";
  ASSERT_EQ(h2check_trailer_field((const uint8_t *)"x-sum", 5, (const uint8_t *)v, 1), 0);
  ASSERT_EQ(h2check_trailer_field((const uint8_t *)":path", 5, (const uint8_t *)"/", 1), -1);
  ASSERT_EQ(h2check_trailer_field((const uint8_t *)"X-Sum", 5, (const uint8_t *)v, 1), -1);
  ASSERT_EQ(h2check_trailer_field((const uint8_t *)"connection", 10, (const uint8_t *)v, 1), -1);
}

/* A field's classification is reused (h2.c's memo): the context rules must
 * come from h2check_apply alone. */
TEST(classify_once_apply_per_block) {
  h2check_kind m, p, h, cl;
  ASSERT_EQ(h2check_classify((const uint8_t *)":method", 7, (const uint8_t *)"OPTIONS", 7, &m), 0);
  ASSERT_EQ(h2check_classify((const uint8_t *)":path", 5, (const uint8_t *)"*", 1, &p), 0);
  ASSERT_EQ(h2check_classify((const uint8_t *)"host", 4, (const uint8_t *)"x", 1, &h), 0);
  ASSERT_EQ(h2check_classify((const uint8_t *)"content-length", 14, (const uint8_t *)"12", 2, &cl), 0);
  ASSERT_EQ(cl.num, 12);
  for (int round = 0; round < 2; round++) { /* the same kinds, two blocks */
    h2check k;
    h2check_init(&k);
    ASSERT_EQ(h2check_apply(&k, &m), 0);
    ASSERT_EQ(h2check_apply(&k, &m), -1); /* :method twice */
    h2check_init(&k);
    ASSERT_EQ(h2check_apply(&k, &m), 0);
    ASSERT_EQ(h2check_apply(&k, &p), 0);
    ASSERT_EQ(field(&k, ":scheme", "http"), 0);
    ASSERT_EQ(h2check_apply(&k, &h), 0);
    ASSERT_EQ(h2check_apply(&k, &h), -1); /* host twice */
    ASSERT_EQ(h2check_apply(&k, &cl), 0);
    ASSERT_EQ(k.content_length, 12);
    ASSERT_EQ(h2check_apply(&k, &cl), -1); /* content-length twice */
    ASSERT_EQ(h2check_end_headers(&k), 0); /* OPTIONS * */
    h2check_init(&k);
    ASSERT_EQ(h2check_apply(&k, &h), 0);
    ASSERT_EQ(h2check_apply(&k, &m), -1); /* pseudo-header after a regular field */
  }
  /* what is wrong in the bytes is wrong anywhere */
  h2check_kind x;
  ASSERT_EQ(h2check_classify((const uint8_t *)"te", 2, (const uint8_t *)"gzip", 4, &x), -1);
  ASSERT_EQ(h2check_classify((const uint8_t *)"host", 4, (const uint8_t *)"", 0, &x), -1);
  ASSERT_EQ(h2check_classify((const uint8_t *)":path", 5, (const uint8_t *)"", 0, &x), -1);
  ASSERT_EQ(h2check_classify((const uint8_t *)"content-length", 14, (const uint8_t *)"1x", 2, &x), -1);
}

int main(void) {
  RUN(good_request);
  RUN(malformed_fields);
  RUN(pseudo_headers);
  RUN(end_of_headers);
  RUN(content_length_against_data);
  RUN(trailers);
  RUN(classify_once_apply_per_block);
  return test_summary();
}
