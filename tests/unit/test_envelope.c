/* test_envelope — proto/envelope.c: header bytes, parsing whole, partial,
 * oversized (known from the header alone) and bad-flag envelopes, frames,
 * the gRPC-Web trailer frame. */
#include <stdlib.h>
#include <string.h>

#include "proto/envelope.h"
#include "tests/unit/test.h"

TEST(header_bytes) {
  uint8_t h[5];
  env_put_header(h, 0x01, 0x01020304);
  ASSERT_MEM_EQ(h, "\x01\x01\x02\x03\x04", 5);
  env_put_header(h, 0x80, 0);
  ASSERT_MEM_EQ(h, "\x80\0\0\0\0", 5);
}

TEST(parse_whole_and_partial) {
  uint8_t b[5 + 3];
  env_put_header(b, 0, 3);
  memcpy(b + 5, "abc", 3);
  uint8_t f = 0xff;
  uint32_t l = 0;
  for (size_t n = 0; n < sizeof b; n++) ASSERT_EQ(env_next(b, n, 100, ENV_COMPRESSED, &f, &l), ENV_NEED);
  ASSERT_EQ(env_next(b, sizeof b, 100, ENV_COMPRESSED, &f, &l), ENV_MSG);
  ASSERT_EQ(f, 0);
  ASSERT_EQ(l, 3);
  /* an empty message is whole with its header */
  env_put_header(b, ENV_COMPRESSED, 0);
  ASSERT_EQ(env_next(b, 5, 100, ENV_COMPRESSED, &f, &l), ENV_MSG);
  ASSERT_EQ(f, 1);
  ASSERT_EQ(l, 0);
}

TEST(too_big_from_header_alone) {
  uint8_t h[5];
  uint8_t f;
  uint32_t l;
  env_put_header(h, 0, 101);
  ASSERT_EQ(env_next(h, 5, 100, 0, &f, &l), ENV_TOO_BIG);
  ASSERT_EQ(l, 101);
  env_put_header(h, 0, 100);
  ASSERT_EQ(env_next(h, 5, 100, 0, &f, &l), ENV_NEED);
  h[1] = 0xff; /* 4 GiB - 1: no overflow of 5 + len */
  ASSERT_EQ(env_next(h, 5, 0xffffffffu, 0, &f, &l), ENV_NEED);
}

TEST(bad_flags_only_when_whole) {
  uint8_t b[6];
  uint8_t f;
  uint32_t l;
  env_put_header(b, 0x02, 1);
  b[5] = 'x';
  ASSERT_EQ(env_next(b, 5, 100, ENV_COMPRESSED, &f, &l), ENV_NEED);
  ASSERT_EQ(env_next(b, 6, 100, ENV_COMPRESSED, &f, &l), ENV_BAD_FLAGS);
  ASSERT_EQ(env_next(b, 6, 100, ENV_COMPRESSED | ENV_END_STREAM, &f, &l), ENV_MSG);
  ASSERT_EQ(f, 2);
}

TEST(frame) {
  uint8_t *e = env_frame(ENV_END_STREAM, "{}", 2);
  ASSERT(e != NULL);
  ASSERT_MEM_EQ(e, "\x02\0\0\0\x02{}", 7);
  free(e);
  e = env_frame(0, NULL, 0);
  ASSERT_MEM_EQ(e, "\0\0\0\0\0", 5);
  free(e);
}

TEST(grpc_web_trailer) {
  size_t n;
  uint8_t *e = env_grpc_web_trailer(0, NULL, &n);
  const char *t0 = "grpc-status: 0\r\n";
  ASSERT_EQ(n, 5 + strlen(t0));
  ASSERT_EQ(e[0], 0x80);
  ASSERT_EQ(e[4], strlen(t0));
  ASSERT_MEM_EQ(e + 5, t0, strlen(t0));
  free(e);
  e = env_grpc_web_trailer(16, "bad token %E2%82%AC", &n);
  const char *t1 = "grpc-status: 16\r\ngrpc-message: bad token %E2%82%AC\r\n";
  ASSERT_EQ(n, 5 + strlen(t1));
  ASSERT_MEM_EQ(e + 5, t1, strlen(t1));
  uint8_t f;
  uint32_t l;
  ASSERT_EQ(env_next(e, n, 1000, ENV_TRAILER, &f, &l), ENV_MSG);
  ASSERT_EQ(l, strlen(t1));
  free(e);
  /* a long message is not cut */
  char big[3000];
  memset(big, 'm', sizeof big - 1);
  big[sizeof big - 1] = 0;
  e = env_grpc_web_trailer(13, big, &n);
  ASSERT_EQ(n, 5 + strlen("grpc-status: 13\r\ngrpc-message: \r\n") + sizeof big - 1);
  ASSERT_MEM_EQ(e + n - 3, "m\r\n", 3);
  free(e);
}

int main(void) {
  RUN(header_bytes);
  RUN(parse_whole_and_partial);
  RUN(too_big_from_header_alone);
  RUN(bad_flags_only_when_whole);
  RUN(frame);
  RUN(grpc_web_trailer);
  return test_summary();
}
