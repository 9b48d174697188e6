/* test_gzip — proto/gzip.c: deflate/inflate round trips (one and two
 * input parts, empty, incompressible), the output bound (bombs stop at the
 * limit), several gzip members, truncated and corrupt input, parsing of
 * the accept-encoding headers. */
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "proto/gzip.h"
#include "tests/unit/test.h"

static uint8_t *text(size_t n) {
  uint8_t *p = malloc(n ? n : 1);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)("{\"name\":\"file-0042.txt\",\"size\":\"6\"},"[i % 36]);
  return p;
}

static void round_trip(const uint8_t *a, size_t an, const uint8_t *b, size_t bn) {
  size_t zl, ol;
  uint8_t *z = gz_deflate(a, an, b, bn, 5, 6, &zl);
  ASSERT(z != NULL);
  uint8_t *o = NULL;
  ASSERT_EQ(gz_inflate(z + 5, zl, an + bn, &o, &ol), GZ_OK);
  ASSERT_EQ(ol, an + bn);
  if (an) ASSERT_MEM_EQ(o, a, an);
  if (bn) ASSERT_MEM_EQ(o + an, b, bn);
  free(o);
  free(z);
}

TEST(round_trip_sizes) {
  size_t sizes[] = {0, 1, 1023, 1024, 65536, 1u << 20, 3u << 20};
  for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
    uint8_t *t = text(sizes[i]);
    round_trip(t, sizes[i], NULL, 0);
    free(t);
  }
}

TEST(round_trip_two_parts) {
  uint8_t *t = text(200000);
  round_trip(t, 7, t + 7, 199993);
  round_trip(t, 0, t, 5000);
  round_trip(t, 5000, t, 0);
  free(t);
}

TEST(incompressible_grows_past_bound_guess) {
  size_t n = 1u << 20;
  uint8_t *r = malloc(n);
  uint32_t x = 12345;
  for (size_t i = 0; i < n; i++) r[i] = (uint8_t)((x = x * 1103515245 + 12345) >> 16);
  round_trip(r, n / 2, r + n / 2, n / 2);
  free(r);
}

TEST(compresses) {
  uint8_t *t = text(100000);
  size_t zl;
  uint8_t *z = gz_deflate(t, 100000, NULL, 0, 0, 6, &zl);
  ASSERT(z != NULL);
  ASSERT(zl < 5000);
  ASSERT_EQ(z[0], 0x1f); /* gzip magic: a gzip member, not raw zlib */
  ASSERT_EQ(z[1], 0x8b);
  free(z);
  free(t);
}

TEST(bomb_stops_at_limit) {
  size_t n = 64u << 20; /* 64 MiB of zeros: ~64 KiB of gzip */
  uint8_t *zero = calloc(1, n);
  size_t zl;
  uint8_t *z = gz_deflate(zero, n, NULL, 0, 0, 9, &zl);
  free(zero);
  ASSERT(z != NULL);
  ASSERT(zl < 100000);
  uint8_t *o = (uint8_t *)1;
  size_t ol = 7;
  ASSERT_EQ(gz_inflate(z, zl, 16u << 20, &o, &ol), GZ_TOO_BIG);
  ASSERT(o == (uint8_t *)1 && ol == 7); /* untouched on failure */
  /* exactly at the limit is fine, one byte less is not */
  size_t ex = 1u << 20;
  uint8_t *zz = calloc(1, ex);
  uint8_t *z2 = gz_deflate(zz, ex, NULL, 0, 0, 9, &zl);
  free(zz);
  ASSERT_EQ(gz_inflate(z2, zl, ex, &o, &ol), GZ_OK);
  ASSERT_EQ(ol, ex);
  free(o);
  ASSERT_EQ(gz_inflate(z2, zl, ex - 1, &o, &ol), GZ_TOO_BIG);
  free(z2);
  free(z);
}

TEST(members_concatenated) {
  size_t l1, l2;
  uint8_t *a = gz_deflate((const uint8_t *)"hello ", 6, NULL, 0, 0, 6, &l1);
  uint8_t *b = gz_deflate((const uint8_t *)"world", 5, NULL, 0, 0, 6, &l2);
  uint8_t *cat = malloc(l1 + l2);
  memcpy(cat, a, l1);
  memcpy(cat + l1, b, l2);
  uint8_t *o;
  size_t ol;
  ASSERT_EQ(gz_inflate(cat, l1 + l2, 100, &o, &ol), GZ_OK);
  ASSERT_EQ(ol, 11);
  ASSERT_MEM_EQ(o, "hello world", 11);
  free(o);
  free(cat);
  free(a);
  free(b);
}

TEST(truncated_and_corrupt) {
  uint8_t *t = text(50000);
  size_t zl;
  uint8_t *z = gz_deflate(t, 50000, NULL, 0, 0, 6, &zl);
  uint8_t *o;
  size_t ol;
  for (size_t cut = 0; cut < zl; cut += (cut < 32 ? 1 : 97))
    ASSERT_EQ(gz_inflate(z, cut, 1u << 20, &o, &ol), GZ_BAD);
  uint8_t *bad = malloc(zl);
  memcpy(bad, z, zl);
  bad[zl - 5] ^= 0x55; /* the ISIZE/CRC trailer no longer matches */
  ASSERT_EQ(gz_inflate(bad, zl, 1u << 20, &o, &ol), GZ_BAD);
  memcpy(bad, z, zl);
  bad[0] = 0x78; /* a zlib header, not gzip */
  ASSERT_EQ(gz_inflate(bad, zl, 1u << 20, &o, &ol), GZ_BAD);
  ASSERT_EQ(gz_inflate((const uint8_t *)"plain text", 10, 100, &o, &ol), GZ_BAD);
  /* trailing garbage after a complete member is not another member */
  uint8_t *tail = malloc(zl + 3);
  memcpy(tail, z, zl);
  memcpy(tail + zl, "abc", 3);
  ASSERT_EQ(gz_inflate(tail, zl + 3, 1u << 20, &o, &ol), GZ_BAD);
  free(tail);
  free(bad);
  free(z);
  free(t);
}

TEST(bad_level) {
  size_t zl;
  ASSERT(gz_deflate((const uint8_t *)"x", 1, NULL, 0, 0, 42, &zl) == NULL);
}

TEST(accepted) {
  ASSERT_EQ(gz_accepted(NULL), 0);
  ASSERT_EQ(gz_accepted(""), 0);
  ASSERT_EQ(gz_accepted("gzip"), 1);
  ASSERT_EQ(gz_accepted("GZip"), 1);
  ASSERT_EQ(gz_accepted("identity,deflate,gzip"), 1); /* grpcio */
  ASSERT_EQ(gz_accepted("deflate, gzip, br, zstd"), 1); /* curl --compressed */
  ASSERT_EQ(gz_accepted("gzip;q=0.5"), 1);
  ASSERT_EQ(gz_accepted("gzip ; q=1"), 1);
  ASSERT_EQ(gz_accepted("identity"), 0);
  ASSERT_EQ(gz_accepted("br, x-gzip"), 0);
  ASSERT_EQ(gz_accepted("gzipx"), 0);
  ASSERT_EQ(gz_accepted("gzip;q=0"), 0);
  ASSERT_EQ(gz_accepted("gzip; q=0.000, br"), 0);
  ASSERT_EQ(gz_accepted("gzip;q=0.01"), 1);
  ASSERT_EQ(gz_accepted("gzip;q=0, gzip"), 1);
  ASSERT_EQ(gz_accepted(",,gzip,"), 1);
  ASSERT_EQ(gz_accepted("*"), 0); /* a wildcard is not asked for by any RPC client */
}

typedef struct collect {
  uint8_t *p;
  size_t n, cap;
} collect;

static int collect_sink(void *arg, const uint8_t *p, size_t n) {
  collect *c = arg;
  ASSERT(n > 0 && n <= GZ_STREAM_OUT);
  if (c->n + n > c->cap) {
    c->cap = (c->n + n) * 2;
    c->p = realloc(c->p, c->cap);
  }
  memcpy(c->p + c->n, p, n);
  c->n += n;
  return 0;
}

TEST(stream_both_ways_in_pieces) {
  size_t n = 3u << 20;
  uint8_t *src = malloc(n);
  for (size_t i = 0; i < n; i++) src[i] = i < n / 2 ? (uint8_t)(i * 7 % 251) : (uint8_t)(rand() & 0xff);
  gz_stream *e = gz_stream_new(1, 1);
  collect z = {0};
  for (size_t off = 0, step = 1; off < n; off += step, step = step * 3 + 1) {
    if (step > n - off) step = n - off;
    ASSERT(gz_stream_feed(e, src + off, step, 0, collect_sink, &z) == GZ_OK);
  }
  ASSERT(gz_stream_feed(e, NULL, 0, 1, collect_sink, &z) == GZ_OK);
  gz_stream_free(e);
  uint8_t *out = NULL;
  size_t ol = 0;
  ASSERT(gz_inflate(z.p, z.n, n, &out, &ol) == GZ_OK && ol == n && memcmp(out, src, n) == 0);
  free(out);
  /* decoded in pieces, the stream twice (two members) */
  for (int cut = 0; cut < 2; cut++) {
    gz_stream *d = gz_stream_new(0, 0);
    collect o = {0};
    for (int m = 0; m < 2; m++)
      for (size_t off = 0, step = 7; off < z.n; off += step, step = step * 2 + 3) {
        if (step > z.n - off) step = z.n - off;
        ASSERT(gz_stream_feed(d, z.p + off, step, 0, collect_sink, &o) == GZ_OK);
      }
    ASSERT(o.n == 2 * n && memcmp(o.p, src, n) == 0 && memcmp(o.p + n, src, n) == 0);
    ASSERT(gz_stream_feed(d, z.p, cut ? z.n - 1 : 0, 1, collect_sink, &o) == (cut ? GZ_BAD : GZ_OK));
    gz_stream_free(d);
    free(o.p);
  }
  gz_stream *d = gz_stream_new(0, 0);
  collect o = {0};
  ASSERT(gz_stream_feed(d, (const uint8_t *)"not gzip at all", 15, 1, collect_sink, &o) == GZ_BAD);
  gz_stream_free(d);
  free(o.p);
  free(z.p);
  free(src);
}

int main(void) {
  RUN(stream_both_ways_in_pieces);
  RUN(round_trip_sizes);
  RUN(round_trip_two_parts);
  RUN(incompressible_grows_past_bound_guess);
  RUN(compresses);
  RUN(bomb_stops_at_limit);
  RUN(members_concatenated);
  RUN(truncated_and_corrupt);
  RUN(bad_level);
  RUN(accepted);
  return test_summary();
}
