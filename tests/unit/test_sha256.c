/* test_sha256 — core/sha256.c against the FIPS 180-4 examples and NIST's
 * byte-oriented vectors, input fed in every split, and the hex parser. */
#include <stdlib.h>

#include "core/sha256.h"
#include "tests/unit/test.h"

static void hex(const uint8_t *d, char *out) {
  for (int i = 0; i < SHA256_LEN; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void digest_of(const void *p, size_t n, char *out) {
  sha256_ctx s;
  uint8_t d[SHA256_LEN];
  sha256_init(&s);
  sha256_update(&s, p, n);
  sha256_final(&s, d);
  hex(d, out);
}

TEST(fips_examples) {
  char h[65];
  digest_of("abc", 3, h);
  ASSERT_STR_EQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  digest_of("", 0, h);
  ASSERT_STR_EQ(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const char *two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"; /* 448 bits: padding spills */
  digest_of(two, strlen(two), h);
  ASSERT_STR_EQ(h, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  const char *four = "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu";
  digest_of(four, strlen(four), h);
  ASSERT_STR_EQ(h, "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(million_a) { /* in 1000-byte updates */
  char buf[1000], h[65];
  memset(buf, 'a', sizeof buf);
  sha256_ctx s;
  uint8_t d[SHA256_LEN];
  sha256_init(&s);
  for (int i = 0; i < 1000; i++) sha256_update(&s, buf, sizeof buf);
  sha256_final(&s, d);
  hex(d, h);
  ASSERT_STR_EQ(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(block_edges) { /* 55, 56, 63, 64, 65 bytes: one or two padding blocks */
  static const struct {
    size_t n;
    const char *want;
  } v[] = {
      {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
      {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
      {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
      {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
      {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
  };
  char buf[65], h[65];
  memset(buf, 'a', sizeof buf);
  for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
    digest_of(buf, v[i].n, h);
    ASSERT_STR_EQ(h, v[i].want);
  }
}

TEST(every_split) { /* the same digest however the input is cut */
  uint8_t data[300];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 3);
  char whole[65], h[65];
  digest_of(data, sizeof data, whole);
  for (size_t a = 0; a <= sizeof data; a += 7)
    for (size_t b = a; b <= sizeof data; b += 13) {
      sha256_ctx s;
      uint8_t d[SHA256_LEN];
      sha256_init(&s);
      sha256_update(&s, data, a);
      sha256_update(&s, data + a, b - a);
      sha256_update(&s, data + b, sizeof data - b);
      sha256_final(&s, d);
      hex(d, h);
      ASSERT_STR_EQ(h, whole);
    }
}

TEST(from_hex) {
  uint8_t d[SHA256_LEN];
  const char *lo = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  const char *up = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
  char h[65];
  ASSERT_EQ(sha256_from_hex(lo, 64, d), 0);
  hex(d, h);
  ASSERT_STR_EQ(h, lo);
  ASSERT_EQ(sha256_from_hex(up, 64, d), 0);
  hex(d, h);
  ASSERT_STR_EQ(h, lo);
  ASSERT_EQ(sha256_from_hex(lo, 63, d), -1);
  ASSERT_EQ(sha256_from_hex(lo, 0, d), -1);
  char bad[65];
  memcpy(bad, lo, 65);
  bad[10] = 'g';
  ASSERT_EQ(sha256_from_hex(bad, 64, d), -1);
  bad[10] = ' ';
  ASSERT_EQ(sha256_from_hex(bad, 64, d), -1);
}

TEST(hmac_rfc4231) { /* test cases 1, 2 and 6 (a key longer than a block) */
  uint8_t d[SHA256_LEN], key[131];
  char h[65];
  memset(key, 0x0b, 20);
  hmac_sha256(key, 20, "Hi There", 8, d);
  hex(d, h);
  ASSERT_STR_EQ(h, "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  hmac_sha256("Jefe", 4, "what do ya want for nothing?", 28, d);
  hex(d, h);
  ASSERT_STR_EQ(h, "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  memset(key, 0xaa, sizeof key);
  const char *m = "Test Using Larger Than Block-Size Key - Hash Key First";
  hmac_sha256(key, sizeof key, m, strlen(m), d);
  hex(d, h);
  ASSERT_STR_EQ(h, "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

int main(void) {
  RUN(hmac_rfc4231);
  RUN(fips_examples);
  RUN(million_a);
  RUN(block_edges);
  RUN(every_split);
  RUN(from_hex);
  return test_summary();
}
