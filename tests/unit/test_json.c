/* test_json — the strict JSON parser (proto/json.h). */
#include "tests/unit/test.h"
#include "proto/json.h"
#include "proto/text.h"

#include <stdlib.h>

static json_value *P(const char *s) {
  char err[200];
  json_value *v = json_parse(s, strlen(s), err, sizeof err);
  return v;
}

/* Parse must fail (and report a non-empty reason). */
static int rejects_n(const char *s, size_t n) {
  char err[200] = "";
  json_value *v = json_parse(s, n, err, sizeof err);
  if (v) {
    json_free(v);
    return 0;
  }
  return err[0] != 0;
}
static int rejects(const char *s) { return rejects_n(s, strlen(s)); }

TEST(scalars) {
  json_value *v = P("null");
  ASSERT(v && v->type == JSON_NULL);
  json_free(v);
  v = P(" true ");
  ASSERT(v && v->type == JSON_TRUE);
  json_free(v);
  v = P("\n\tfalse\r\n");
  ASSERT(v && v->type == JSON_FALSE);
  json_free(v);
  v = P("\"abc\"");
  ASSERT(v && v->type == JSON_STRING);
  ASSERT_EQ(v->len, 3);
  ASSERT_STR_EQ(v->str, "abc");
  json_free(v);
  v = P("-12.5e+3");
  ASSERT(v && v->type == JSON_NUMBER);
  ASSERT_STR_EQ(v->str, "-12.5e+3");
  ASSERT_EQ(v->len, 8);
  json_free(v);
}

TEST(containers) {
  json_value *v = P("{\"a\":[1,2,{\"b\":null}],\"c\":{},\"d\":[],\"a\":true}");
  ASSERT(v && v->type == JSON_OBJECT);
  ASSERT_EQ(v->n, 4);
  ASSERT_STR_EQ(v->keys[0], "a");
  ASSERT_STR_EQ(v->keys[1], "c");
  ASSERT_STR_EQ(v->keys[3], "a");
  const json_value *a = json_get(v, "a");
  ASSERT(a == &v->items[0]); /* first of the duplicates */
  ASSERT(a->type == JSON_ARRAY);
  ASSERT_EQ(a->n, 3);
  ASSERT_STR_EQ(a->items[1].str, "2");
  const json_value *b = json_get(&a->items[2], "b");
  ASSERT(b && b->type == JSON_NULL);
  ASSERT(json_get(v, "zz") == NULL);
  ASSERT(json_get(a, "b") == NULL); /* not an object */
  ASSERT(json_get(v, "c")->type == JSON_OBJECT && json_get(v, "c")->n == 0);
  ASSERT(json_get(v, "d")->type == JSON_ARRAY && json_get(v, "d")->n == 0);
  json_free(v);
  /* many members (growth) */
  char buf[20000];
  size_t o = 0;
  buf[o++] = '[';
  for (int i = 0; i < 2000; i++) o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%d", i ? "," : "", i);
  buf[o++] = ']';
  buf[o] = 0;
  v = P(buf);
  ASSERT(v && v->n == 2000);
  ASSERT_STR_EQ(v->items[1999].str, "1999");
  json_free(v);
  v = P(" [ 1 , \"x\" , [ ] , { } ] ");
  ASSERT(v && v->n == 4);
  json_free(v);
}

TEST(escapes) {
  json_value *v = P("\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\u20AC\"");
  ASSERT(v && v->type == JSON_STRING);
  ASSERT_STR_EQ(v->str, "\"\\/\b\f\n\r\tA\xc3\xa9\xe2\x82\xac");
  json_free(v);
  v = P("\"a\\u0000b\"");
  ASSERT(v);
  ASSERT_EQ(v->len, 3);
  ASSERT_MEM_EQ(v->str, "a\0b", 4);
  json_free(v);
  /* keys are decoded too, with NUL */
  v = P("{\"k\\u0000x\":1,\"\\u00e9\":2}");
  ASSERT(v && v->n == 2);
  ASSERT_EQ(v->key_lens[0], 3);
  ASSERT(json_get_n(v, "k\0x", 3) == &v->items[0]);
  ASSERT(json_get(v, "\xc3\xa9") == &v->items[1]);
  json_free(v);
  /* raw UTF-8 passes through */
  v = P("\"\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80\"");
  ASSERT(v);
  ASSERT_STR_EQ(v->str, "\xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80");
  json_free(v);
  ASSERT(rejects("\"\\x\""));
  ASSERT(rejects("\"\\u12\""));
  ASSERT(rejects("\"\\u12G4\""));
  ASSERT(rejects("\"\\'\""));
  ASSERT(rejects("\"abc"));
  ASSERT(rejects("\"abc\\"));
  ASSERT(rejects("\"abc\\\""));
}

TEST(surrogates) {
  json_value *v = P("\"\\ud83d\\ude00\"");
  ASSERT(v);
  ASSERT_STR_EQ(v->str, "\xf0\x9f\x98\x80");
  json_free(v);
  v = P("\"\\uDBFF\\uDFFF\"");
  ASSERT(v);
  ASSERT_STR_EQ(v->str, "\xf4\x8f\xbf\xbf");
  json_free(v);
  ASSERT(rejects("\"\\ud83d\""));
  ASSERT(rejects("\"\\ud83dx\""));
  ASSERT(rejects("\"\\ud83d\\u0041\""));
  ASSERT(rejects("\"\\ude00\""));
  ASSERT(rejects("\"\\ude00\\ud83d\""));
  ASSERT(rejects("\"\\ud83d\\ud83d\""));
  ASSERT(rejects("\"\\ud83d\\"));
}

TEST(trailing) {
  ASSERT(rejects("{} {}"));
  ASSERT(rejects("1 2"));
  ASSERT(rejects("{}x"));
  ASSERT(rejects("[1]]"));
  ASSERT(rejects("truex"));
  ASSERT(rejects("nul"));
  ASSERT(rejects("\"a\"\"b\""));
  ASSERT(rejects_n("{}\0", 3));
  json_value *v = P("{}  \n");
  ASSERT(v);
  json_free(v);
}

TEST(depth) {
  char buf[300];
  /* 64 nested arrays: allowed */
  memset(buf, '[', 64);
  memset(buf + 64, ']', 64);
  json_value *v = json_parse(buf, 128, NULL, 0);
  ASSERT(v);
  json_free(v);
  /* 65: rejected */
  memset(buf, '[', 65);
  memset(buf + 65, ']', 65);
  ASSERT(rejects_n(buf, 130));
  /* a bomb of a million brackets */
  size_t n = 1000000;
  char *big = malloc(n);
  ASSERT(big);
  memset(big, '[', n);
  ASSERT(rejects_n(big, n));
  for (size_t i = 0; i < n; i += 5) memcpy(big + i, "{\"a\":", 5);
  ASSERT(rejects_n(big, n));
  free(big);
  /* mixed object/array nesting counts both */
  size_t o = 0;
  for (int i = 0; i < 33; i++) o += (size_t)snprintf(buf + o, sizeof buf - o, "{\"a\":[");
  ASSERT(rejects_n(buf, o));
}

TEST(truncated) {
  const char *doc = "{\"a\":[1,-2.5e3,\"x\\u00e9\",true,false,null,{\"b\":{}}],\"c\":\"\\ud83d\\ude00\"}";
  size_t n = strlen(doc);
  json_value *v = json_parse(doc, n, NULL, 0);
  ASSERT(v);
  json_free(v);
  for (size_t i = 0; i < n; i++) ASSERT(rejects_n(doc, i));
  ASSERT(rejects(""));
  ASSERT(rejects("   "));
  ASSERT(json_parse(NULL, 0, NULL, 0) == NULL);
}

TEST(invalid_utf8) {
  ASSERT(rejects("\"\xff\""));
  ASSERT(rejects("\"\x80\""));
  ASSERT(rejects("\"\xc3\""));          /* truncated 2-byte */
  ASSERT(rejects("\"\xc0\xaf\""));      /* overlong '/' */
  ASSERT(rejects("\"\xc1\xbf\""));      /* overlong */
  ASSERT(rejects("\"\xe0\x80\xaf\""));  /* overlong 3-byte */
  ASSERT(rejects("\"\xed\xa0\x80\""));  /* encoded surrogate */
  ASSERT(rejects("\"\xf0\x80\x80\xaf\"")); /* overlong 4-byte */
  ASSERT(rejects("\"\xf4\x90\x80\x80\"")); /* > U+10FFFF */
  ASSERT(rejects("\"\xf5\x80\x80\x80\""));
  ASSERT(rejects("\"\xe2\x82\""));      /* truncated 3-byte */
  ASSERT(rejects("{\"\xff\":1}"));      /* in a key */
  ASSERT(rejects("\xef\xbb\xbf{}"));    /* BOM is not whitespace */
  ASSERT(rejects("[\xc3\xa9]"));        /* non-ASCII outside a string */
  json_value *v = P("\"\xed\x9f\xbf\xee\x80\x80\xef\xbf\xbf\"");
  ASSERT(v);
  json_free(v);
}

TEST(control_chars) {
  char s[4] = {'"', 0, '"', 0};
  for (int c = 0; c < 0x20; c++) {
    s[1] = (char)c;
    ASSERT(rejects_n(s, 3));
  }
  s[1] = 0x7f; /* DEL is allowed */
  json_value *v = json_parse(s, 3, NULL, 0);
  ASSERT(v);
  json_free(v);
  ASSERT(rejects("\"a\nb\""));
  ASSERT(rejects("{\"a\tb\":1}"));
}

TEST(numbers) {
  const char *ok[] = {"0", "-0", "1", "-1", "123456789012345678901234567890", "0.5", "-0.0", "1e5",
                      "1E+5", "1e-5", "1.25E-0", "0e0"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    json_value *v = P(ok[i]);
    ASSERT(v && v->type == JSON_NUMBER);
    ASSERT_STR_EQ(v->str, ok[i]);
    json_free(v);
  }
  const char *bad[] = {"01", "-01", "+1", ".5", "1.", "1.e5", "1e", "1e+", "-", "--1", "0x10",
                       "1.5.5", "NaN", "Infinity", "-Infinity", "1 .5", "[01]", "[1,]", "[,1]",
                       "{\"a\":1,}", "{,}", "{\"a\"}", "{\"a\" 1}", "{1:2}", "{'a':1}",
                       "[1 2]", "{\"a\":1 \"b\":2}", "\"a\"x"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (!rejects(bad[i])) TEST_FAIL_("accepted %s", bad[i]);
}

/* Random documents from JSON's own alphabet: every failure says why, only
 * valid UTF-8 is ever accepted, the in-buffer parse agrees with the heap
 * parse, and both outcomes really occur (else the test proves nothing). */
TEST(random_bytes_properties) {
  unsigned seed = 12345;
  char buf[64];
  const char alphabet[] = "{}[]\",:\\u0123456789.eE+-tfnrul aA\xc3\xa9\xff\x01";
  size_t ok = 0, bad = 0;
  for (int it = 0; it < 200000; it++) {
    size_t n = (size_t)(rand_r(&seed) % sizeof buf);
    for (size_t i = 0; i < n; i++) buf[i] = alphabet[rand_r(&seed) % (sizeof alphabet - 1)];
    char err[128] = "";
    json_value *v = json_parse(buf, n, err, sizeof err);
    char stack[256];
    int over = 0;
    json_value *w = json_parse_in(buf, n, (size_t)1 << 20, stack, sizeof stack, NULL, 0, &over);
    ASSERT_EQ(v != NULL, w != NULL);
    if (v) {
      ok++;
      ASSERT(text_utf8_valid(buf, n));
      ASSERT_EQ(v->type, w->type);
    } else {
      bad++;
      ASSERT(err[0] != 0);
    }
    json_free(w);
    json_free(v);
  }
  ASSERT(ok > 100 && bad > 100);
}

/* A document of tiny values needs ~19 times its length as a tree: the
 * default budget (8n + 1 MiB) refuses that beyond about 1 MiB of tree, an
 * explicit budget is kept exactly, and ordinary documents are untouched. */
TEST(memory_budget) {
  size_t n = 1000000; /* "[0,0,...,0]": 2 MB of input, ~110 MB as a tree */
  char *buf = malloc(2 * n + 2);
  ASSERT(buf);
  buf[0] = '[';
  for (size_t i = 0; i < n; i++) {
    buf[1 + 2 * i] = '0';
    buf[2 + 2 * i] = ',';
  }
  buf[2 * n] = ']';
  char err[200];
  int over = 0;
  json_value *v = json_parse_ex(buf, 2 * n + 1, JSON_MEM_BUDGET(2 * n + 1), err, sizeof err, &over);
  ASSERT(v == NULL);
  ASSERT_EQ(over, 1);
  ASSERT(strstr(err, "document needs more than") != NULL);
  /* with room enough it parses, and every element is there */
  v = json_parse_ex(buf, 2 * n + 1, (size_t)256 << 20, err, sizeof err, &over);
  ASSERT(v != NULL);
  ASSERT_EQ(over, 0);
  ASSERT_EQ(v->n, n);
  ASSERT_STR_EQ(v->items[n - 1].str, "0");
  json_free(v);
  free(buf);
  /* a small explicit budget: a syntax error is still a syntax error */
  const char *small = "{\"a\":[1,2,3],\"b\":\"xyz\"}";
  v = json_parse_ex(small, strlen(small), 64, err, sizeof err, &over);
  ASSERT(v == NULL);
  ASSERT_EQ(over, 1);
  v = json_parse_ex("[1,", 3, 64, err, sizeof err, &over);
  ASSERT(v == NULL);
  ASSERT_EQ(over, 0);
  /* a long string in a document within the default budget */
  size_t sl = 3u << 20;
  char *big = malloc(sl + 3);
  ASSERT(big);
  big[0] = '"';
  memset(big + 1, 'x', sl);
  big[sl + 1] = '"';
  v = json_parse(big, sl + 2, err, sizeof err);
  ASSERT(v != NULL);
  ASSERT_EQ(v->len, sl);
  json_free(v);
  free(big);
}

/* Strings are scanned 8 bytes at a time: an escape, a raw control byte, a
 * UTF-8 sequence and DEL at every position of strings around that width. */
TEST(string_bytes_everywhere) {
  char err[200];
  for (size_t len = 1; len <= 19; len++)
    for (size_t at = 0; at < len; at++) {
      char doc[64], want[64];
      /* an escape: "\n" in the text, a newline in the value */
      size_t o = 0, w = 0;
      doc[o++] = '"';
      for (size_t i = 0; i < len; i++) {
        if (i == at) {
          doc[o++] = '\\';
          doc[o++] = 'n';
          want[w++] = '\n';
        } else {
          doc[o++] = (char)('a' + i);
          want[w++] = (char)('a' + i);
        }
      }
      doc[o++] = '"';
      json_value *v = json_parse(doc, o, err, sizeof err);
      if (!v) TEST_FAIL_("escape at %zu of %zu: %s", at, len, err);
      ASSERT_EQ(v->len, w);
      ASSERT_MEM_EQ(v->str, want, w);
      json_free(v);
      /* a raw control byte: refused */
      doc[1 + at] = '\x01';
      memset(doc + 1, 'a', at);
      for (size_t i = at + 1; i < len; i++) doc[1 + i] = 'b';
      doc[1 + len] = '"';
      ASSERT(json_parse(doc, len + 2, err, sizeof err) == NULL);
      ASSERT(strstr(err, "control character") != NULL);
      /* DEL and a two-byte UTF-8 sequence stand for themselves */
      doc[1 + at] = 0x7f;
      v = json_parse(doc, len + 2, err, sizeof err);
      ASSERT(v != NULL);
      ASSERT_EQ(v->len, len);
      ASSERT_EQ((unsigned char)v->str[at], 0x7f);
      json_free(v);
      char u[64];
      memcpy(u, doc, 1 + at);
      u[1 + at] = (char)0xc3;
      u[2 + at] = (char)0xa9;
      memcpy(u + 3 + at, doc + 2 + at, len - at);
      v = json_parse(u, len + 3, err, sizeof err);
      if (!v) TEST_FAIL_("UTF-8 at %zu of %zu: %s", at, len, err);
      ASSERT_EQ(v->len, len + 1);
      ASSERT_EQ((unsigned char)v->str[at], 0xc3);
      json_free(v);
    }
}

int main(void) {
  RUN(scalars);
  RUN(containers);
  RUN(escapes);
  RUN(surrogates);
  RUN(trailing);
  RUN(depth);
  RUN(truncated);
  RUN(invalid_utf8);
  RUN(control_chars);
  RUN(numbers);
  RUN(random_bytes_properties);
  RUN(memory_budget);
  RUN(string_bytes_everywhere);
  return test_summary();
}
