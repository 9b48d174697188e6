/* Unit tests: fs/quote — Go strconv.Quote for error texts. */
#include "tests/unit/test.h"

#include <stdlib.h>

#include "fs/quote.h"

static char *q;
static const char *Q(const char *s, size_t n) {
  free(q);
  q = fs_go_quote(s, n);
  return q;
}
#define QS(lit) Q(lit, sizeof(lit) - 1)

TEST(plain) {
  ASSERT_STR_EQ(QS(""), "\"\"");
  ASSERT_STR_EQ(QS("*.py"), "\"*.py\"");
  ASSERT_STR_EQ(QS("[a-z]?"), "\"[a-z]?\"");
}

TEST(escapes) {
  ASSERT_STR_EQ(QS("a\\"), "\"a\\\\\"");
  ASSERT_STR_EQ(QS("say \"hi\""), "\"say \\\"hi\\\"\"");
  ASSERT_STR_EQ(QS("\a\b\f\n\r\t\v"), "\"\\a\\b\\f\\n\\r\\t\\v\"");
  ASSERT_STR_EQ(QS("\x01\x1f\x7f"), "\"\\x01\\x1f\\x7f\"");
  ASSERT_STR_EQ(QS("a\0b"), "\"a\\x00b\"");
}

TEST(unicode) {
  ASSERT_STR_EQ(QS("\xe4\xb8\xad\xe6\x96\x87"), "\"\xe4\xb8\xad\xe6\x96\x87\""); /* 中文 kept */
  ASSERT_STR_EQ(QS("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");                 /* emoji kept */
  ASSERT_STR_EQ(QS("\xc2\x80"), "\"\\u0080\"");                                    /* C1 control */
  ASSERT_STR_EQ(QS("\xc2\xa0"), "\"\\u00a0\"");                                    /* NBSP */
  ASSERT_STR_EQ(QS("\xef\xbb\xbf"), "\"\\ufeff\"");                                /* BOM */
  ASSERT_STR_EQ(QS("\xf3\xb0\x80\x80"), "\"\\U000f0000\"");                       /* private use */
}

TEST(invalid_utf8) {
  ASSERT_STR_EQ(QS("\xff"), "\"\\xff\"");
  ASSERT_STR_EQ(QS("a\xc3"), "\"a\\xc3\"");             /* truncated sequence */
  ASSERT_STR_EQ(QS("\xc0\xaf"), "\"\\xc0\\xaf\"");       /* overlong */
  ASSERT_STR_EQ(QS("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\""); /* surrogate */
}

TEST(worst_case_fits) {
  char in[64];
  memset(in, 0x01, sizeof in);
  const char *r = Q(in, sizeof in);
  ASSERT_EQ(strlen(r), 2 + 4 * sizeof in);
}

int main(void) {
  RUN(plain);
  RUN(escapes);
  RUN(unicode);
  RUN(invalid_utf8);
  RUN(worst_case_fits);
  free(q);
  return test_summary();
}
