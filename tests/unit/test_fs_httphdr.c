/* Unit tests: fs/httphdr — the header texts of /files (api.md §9). */
#include "tests/unit/test.h"

#include <stdlib.h>

#include "fs/httphdr.h"

TEST(ranges) {
  uint64_t a, b;
  struct { const char *v; uint64_t size; fs_http_rng want; uint64_t a, b; } cases[] = {
      {"bytes=0-9", 100, FS_RANGE_OK, 0, 9},       {"bytes=10-", 100, FS_RANGE_OK, 10, 99},
      {"bytes=-10", 100, FS_RANGE_OK, 90, 99},     {"bytes=-1000", 100, FS_RANGE_OK, 0, 99},
      {"bytes=50-5000", 100, FS_RANGE_OK, 50, 99}, {"bytes=99-99", 100, FS_RANGE_OK, 99, 99},
      {"bytes=100-", 100, FS_RANGE_BAD, 0, 0},     {"bytes=-0", 100, FS_RANGE_BAD, 0, 0},
      {"bytes=-5", 0, FS_RANGE_BAD, 0, 0},         {"bytes=0-", 0, FS_RANGE_BAD, 0, 0},
      {NULL, 100, FS_RANGE_NONE, 0, 0},            {"bytes=0-1,3-4", 100, FS_RANGE_NONE, 0, 0},
      {"bytes=5-1", 100, FS_RANGE_NONE, 0, 0},     {"bytes=a-1", 100, FS_RANGE_NONE, 0, 0},
      {"bytes=1-2x", 100, FS_RANGE_NONE, 0, 0},    {"items=0-1", 100, FS_RANGE_NONE, 0, 0},
      {"bytes=-", 100, FS_RANGE_NONE, 0, 0},       {"bytes=99999999999999999999-", 100, FS_RANGE_NONE, 0, 0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    a = b = 0;
    ASSERT_EQ(fs_http_range(cases[i].v, cases[i].size, &a, &b), cases[i].want);
    if (cases[i].want == FS_RANGE_OK) {
      ASSERT_EQ(a, cases[i].a);
      ASSERT_EQ(b, cases[i].b);
    }
  }
}

TEST(dates) {
  char d[40];
  fs_http_date(784111777, d);
  ASSERT_STR_EQ(d, "Sun, 06 Nov 1994 08:49:37 GMT");
  ASSERT_EQ(fs_http_parse_date(d), 784111777);
  ASSERT_EQ(fs_http_parse_date("Sun, 06 Nov 1994 08:49:37 GMT x"), -1);
  ASSERT_EQ(fs_http_parse_date("Sunday, 06-Nov-94 08:49:37 GMT"), -1);
  ASSERT_EQ(fs_http_parse_date("Sun, 06 Xyz 1994 08:49:37 GMT"), -1);
  ASSERT_EQ(fs_http_parse_date(NULL), -1);
}

TEST(etag_lists) {
  ASSERT_EQ(fs_http_etag_listed("\"a\"", "\"a\""), 1);
  ASSERT_EQ(fs_http_etag_listed("\"x\", W/\"a\"", "\"a\""), 1);
  ASSERT_EQ(fs_http_etag_listed("*", "\"a\""), 1);
  ASSERT_EQ(fs_http_etag_listed("\"ab\"", "\"a\""), 0);
  ASSERT_EQ(fs_http_etag_listed("\"a\"x", "\"a\""), 0);
  ASSERT_EQ(fs_http_etag_listed("", "\"a\""), 0);
}

TEST(disposition) {
  char *s = fs_http_disposition("plain.txt");
  ASSERT_STR_EQ(s, "attachment; filename=\"plain.txt\"");
  free(s);
  s = fs_http_disposition("a\"b\\c%d");
  ASSERT_STR_EQ(s, "attachment; filename=\"a_b_c_d\"; filename*=UTF-8''a%22b%5Cc%25d");
  free(s);
  s = fs_http_disposition("\xe4\xb8\xad.txt");
  ASSERT_STR_EQ(s, "attachment; filename=\"___.txt\"; filename*=UTF-8''%E4%B8%AD.txt");
  free(s);
}

int main(void) {
  RUN(ranges);
  RUN(dates);
  RUN(etag_lists);
  RUN(disposition);
  return test_summary();
}
