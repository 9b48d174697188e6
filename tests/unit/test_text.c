/* test_text — proto/text.h: UTF-8 decoding at every edge, the one JSON
 * string form, Go's %q, base64. */
#include "tests/unit/test.h"
#include "proto/json.h"
#include "proto/text.h"

#include <stdlib.h>
#include <time.h>

/* ------------------------------------------------------------ UTF-8 */

/* text_utf8_seq on a literal (length counted without the NUL). */
#define SEQ(lit) text_utf8_seq((const unsigned char *)(lit), sizeof(lit) - 1)
static uint32_t rune(const char *s, size_t n, size_t *w) {
  return text_utf8_rune((const unsigned char *)s, n, w);
}
#define RUNE(lit, w) rune(lit, sizeof(lit) - 1, w)

TEST(utf8_valid_edges) {
  size_t w;
  ASSERT_EQ(SEQ("\x00"), 1);
  ASSERT_EQ(SEQ("\x7f"), 1);
  ASSERT_EQ(SEQ("\xc2\x80"), 2);          /* U+0080, smallest 2-byte */
  ASSERT_EQ(SEQ("\xdf\xbf"), 2);          /* U+07FF */
  ASSERT_EQ(SEQ("\xe0\xa0\x80"), 3);      /* U+0800, smallest 3-byte */
  ASSERT_EQ(SEQ("\xed\x9f\xbf"), 3);      /* U+D7FF, just below the surrogates */
  ASSERT_EQ(SEQ("\xee\x80\x80"), 3);      /* U+E000, just above */
  ASSERT_EQ(SEQ("\xef\xbf\xbf"), 3);      /* U+FFFF */
  ASSERT_EQ(SEQ("\xf0\x90\x80\x80"), 4);  /* U+10000, smallest 4-byte */
  ASSERT_EQ(SEQ("\xf4\x8f\xbf\xbf"), 4);  /* U+10FFFF, the last code point */
  ASSERT_EQ(RUNE("\xf4\x8f\xbf\xbf", &w), 0x10FFFF);
  ASSERT_EQ(w, 4);
  ASSERT_EQ(RUNE("\xe4\xb8\xad", &w), 0x4E2D);
  ASSERT_EQ(w, 3);
  ASSERT_EQ(RUNE("\xc3\xa9x", &w), 0xE9);
  ASSERT_EQ(w, 2);
  ASSERT_EQ(RUNE("A", &w), 'A');
  ASSERT_EQ(w, 1);
  ASSERT_EQ(RUNE("\xef\xbf\xbd", &w), 0xFFFD); /* a real U+FFFD: width 3 */
  ASSERT_EQ(w, 3);
  /* every code point round-trips through text_utf8_put */
  for (uint32_t cp = 0; cp < 0x110000; cp++) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    unsigned char b[4];
    size_t n = text_utf8_put(b, cp);
    ASSERT_EQ(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
    ASSERT_EQ(text_utf8_seq(b, n), n);
    ASSERT_EQ(text_utf8_rune(b, n, &w), cp);
    ASSERT_EQ(w, n);
  }
}

TEST(utf8_invalid_edges) {
  static const char *bad[] = {
      "\x80", "\xbf",                 /* stray continuation bytes */
      "\xc0\x80", "\xc1\xbf",         /* overlong 2-byte (C0, C1 never valid) */
      "\xe0\x80\x80", "\xe0\x9f\xbf", /* overlong 3-byte */
      "\xf0\x80\x80\x80", "\xf0\x8f\xbf\xbf", /* overlong 4-byte */
      "\xed\xa0\x80", "\xed\xbf\xbf", /* surrogates U+D800, U+DFFF */
      "\xf4\x90\x80\x80",             /* U+110000 */
      "\xf5\x80\x80\x80", "\xf7\xbf\xbf\xbf", /* beyond, F5..F7 */
      "\xf8\x88\x80\x80\x80", "\xfc\x84\x80\x80\x80\x80", /* 5- and 6-byte forms */
      "\xfe", "\xff",
      "\xc3", "\xe4\xb8", "\xf0\x9f\x98", /* truncated */
      "\xc3x", "\xe4\xb8x", "\xf0\x9f\x98x", "\xe4x\xad", /* cut by a non-continuation */
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t n = strlen(bad[i]), w;
    if (text_utf8_seq((const unsigned char *)bad[i], n) != 0) TEST_FAIL_("accepted #%zu", i);
    if (text_utf8_rune((const unsigned char *)bad[i], n, &w) != TEXT_RUNE_ERROR || w != 1)
      TEST_FAIL_("rune of #%zu not (RuneError, 1)", i);
    if (text_utf8_valid(bad[i], n)) TEST_FAIL_("valid #%zu", i);
  }
  /* the avail bound is honoured: a 3-byte sequence with 2 bytes available */
  ASSERT_EQ(text_utf8_seq((const unsigned char *)"\xe4\xb8\xad", 2), 0);
  size_t w;
  ASSERT_EQ(text_utf8_rune((const unsigned char *)"", 0, &w), TEXT_RUNE_ERROR);
  ASSERT_EQ(w, 0);
  ASSERT(text_utf8_valid("", 0));
  ASSERT(text_utf8_valid("a\0b", 3));
  ASSERT(text_utf8_valid("\xe4\xb8\xad\xf0\x9f\x98\x80", 7));
  ASSERT(!text_utf8_valid("\xe4\xb8\xad\xf0\x9f\x98", 6));
}

/* The decoder agrees with a straightforward reference on every 1- to 3-byte
 * string and on all 4-byte strings that start F0..F4 with continuation-ish
 * second bytes. */
static int ref_seq(const unsigned char *p, size_t n) {
  uint32_t cp, min;
  size_t need;
  if (p[0] < 0x80) return 1;
  if ((p[0] & 0xE0) == 0xC0) need = 2, cp = p[0] & 0x1F, min = 0x80;
  else if ((p[0] & 0xF0) == 0xE0) need = 3, cp = p[0] & 0x0F, min = 0x800;
  else if ((p[0] & 0xF8) == 0xF0) need = 4, cp = p[0] & 0x07, min = 0x10000;
  else return 0;
  if (n < need) return 0;
  for (size_t i = 1; i < need; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return (int)need;
}

TEST(utf8_matches_reference) {
  unsigned char b[4];
  for (unsigned x = 0; x < 1u << 24; x++) {
    b[0] = (unsigned char)(x >> 16), b[1] = (unsigned char)(x >> 8), b[2] = (unsigned char)x;
    if (b[0] < 0x80 && (x & 0xFFFF)) continue; /* ASCII: the rest does not matter */
    for (size_t n = 1; n <= 3; n++)
      if ((int)text_utf8_seq(b, n) != ref_seq(b, n)) TEST_FAIL_("%02x %02x %02x / %zu", b[0], b[1], b[2], n);
  }
  for (unsigned x = 0; x < 5u << 18; x++) {
    b[0] = (unsigned char)(0xF0 + (x >> 18)), b[1] = (unsigned char)(0x80 + (x >> 12 & 63));
    b[2] = (unsigned char)(0x80 + (x >> 6 & 63)), b[3] = (unsigned char)(0x80 + (x & 63));
    if ((int)text_utf8_seq(b, 4) != ref_seq(b, 4)) TEST_FAIL_("%02x %02x %02x %02x", b[0], b[1], b[2], b[3]);
  }
}

TEST(classes) {
  ASSERT(text_is_space(' ') && text_is_space('\t') && text_is_space(0x85) && text_is_space(0xA0) &&
         text_is_space(0x2000) && text_is_space(0x200A) && text_is_space(0x3000));
  ASSERT(!text_is_space('a') && !text_is_space(0x200B) && !text_is_space(TEXT_RUNE_ERROR));
  ASSERT(text_is_control(0) && text_is_control(0x1F) && text_is_control(0x7F) && text_is_control(0x9F));
  ASSERT(!text_is_control(' ') && !text_is_control(0xA0));
  ASSERT(text_is_print(' ') && text_is_print('~') && text_is_print(0xE9) && text_is_print(0x4E2D) &&
         text_is_print(0x1F600) && text_is_print(0xFFFD));
  ASSERT(!text_is_print(0xA0) && !text_is_print(0xAD) && !text_is_print(0x2028) &&
         !text_is_print(0xFEFF) && !text_is_print(0xE000) && !text_is_print(0xFFFE) &&
         !text_is_print(0x1FFFF) && !text_is_print(0xFDD0) && !text_is_print(0x10FFFD));
}

/* ------------------------------------------------------------ JSON */

static char jbuf[4096];
static const char *J(const char *s, size_t n) {
  size_t k = text_json_string(jbuf, s, n);
  if (k != text_json_string(NULL, s, n) || k > TEXT_JSON_MAX(n)) return "(length mismatch)";
  jbuf[k] = 0;
  return jbuf;
}
#define JS(lit) J(lit, sizeof(lit) - 1)

TEST(json_every_control_char) {
  static const char *named[0x20] = {['\b'] = "\\b", ['\f'] = "\\f", ['\n'] = "\\n", ['\r'] = "\\r",
                                    ['\t'] = "\\t"};
  for (unsigned c = 0; c < 0x20; c++) {
    char in[3] = {'a', (char)c, 'z'}, want[16];
    if (named[c]) snprintf(want, sizeof want, "\"a%sz\"", named[c]);
    else snprintf(want, sizeof want, "\"a\\u%04xz\"", c);
    ASSERT_STR_EQ(J(in, 3), want);
  }
  ASSERT_STR_EQ(JS("\x1f\x1e\x0b"), "\"\\u001f\\u001e\\u000b\""); /* lower-case hex */
}

TEST(json_quotes_backslash_and_what_stays) {
  ASSERT_STR_EQ(JS(""), "\"\"");
  ASSERT_STR_EQ(JS("say \"hi\""), "\"say \\\"hi\\\"\"");
  ASSERT_STR_EQ(JS("a\\b"), "\"a\\\\b\"");
  /* not escaped: DEL, '/', HTML characters, U+2028/2029, non-ASCII */
  ASSERT_STR_EQ(JS("\x7f/<>&'"), "\"\x7f/<>&'\"");
  ASSERT_STR_EQ(JS("\xe2\x80\xa8\xe2\x80\xa9"), "\"\xe2\x80\xa8\xe2\x80\xa9\"");
  ASSERT_STR_EQ(JS("\xe4\xb8\xad\xf0\x9f\x98\x80\xc3\xa9"), "\"\xe4\xb8\xad\xf0\x9f\x98\x80\xc3\xa9\"");
  ASSERT_STR_EQ(JS("\xf4\x8f\xbf\xbf"), "\"\xf4\x8f\xbf\xbf\"");
}

TEST(json_invalid_bytes) {
  /* one \ufffd per byte that does not start a valid sequence */
  ASSERT_STR_EQ(JS("\xff"), "\"\\ufffd\"");
  ASSERT_STR_EQ(JS("a\xe4\xb8"), "\"a\\ufffd\\ufffd\"");             /* truncated: 2 bytes, 2 */
  ASSERT_STR_EQ(JS("\xc0\xaf"), "\"\\ufffd\\ufffd\"");               /* overlong */
  ASSERT_STR_EQ(JS("\xed\xa0\x80"), "\"\\ufffd\\ufffd\\ufffd\"");    /* surrogate */
  ASSERT_STR_EQ(JS("\xf4\x90\x80\x80"), "\"\\ufffd\\ufffd\\ufffd\\ufffd\""); /* > U+10FFFF */
  ASSERT_STR_EQ(JS("\xe4x"), "\"\\ufffdx\"");
  /* a real U+FFFD stays as it is */
  ASSERT_STR_EQ(JS("\xef\xbf\xbd\xff"), "\"\xef\xbf\xbd\\ufffd\"");
  ASSERT_STR_EQ(JS("a\0b"), "\"a\\u0000b\"");
}

/* Every byte that needs care, at every offset around the 8-byte fast path,
 * against a byte-at-a-time reference; the strict parser reads each result
 * back to the input (bad bytes as U+FFFD). */
TEST(json_everywhere_and_parses_back) {
  for (unsigned c = 0; c < 256; c++) {
    for (size_t len = 1; len <= 19; len++)
      for (size_t at = 0; at < len; at++) {
        char in[32], want[160], back[64];
        memset(in, 'm', len);
        in[at] = (char)c;
        size_t o = 0, bo = 0;
        want[o++] = '"';
        for (size_t i = 0; i < len; i++) {
          unsigned char b = (unsigned char)in[i];
          if (b == '"' || b == '\\') o += (size_t)sprintf(want + o, "\\%c", b);
          else if (b == '\b') o += (size_t)sprintf(want + o, "\\b");
          else if (b == '\f') o += (size_t)sprintf(want + o, "\\f");
          else if (b == '\n') o += (size_t)sprintf(want + o, "\\n");
          else if (b == '\r') o += (size_t)sprintf(want + o, "\\r");
          else if (b == '\t') o += (size_t)sprintf(want + o, "\\t");
          else if (b < 0x20) o += (size_t)sprintf(want + o, "\\u%04x", b);
          else if (b >= 0x80) o += (size_t)sprintf(want + o, "\\ufffd"); /* a lone byte */
          else want[o++] = (char)b;
          if (b >= 0x80) memcpy(back + bo, "\xef\xbf\xbd", 3), bo += 3;
          else back[bo++] = (char)b;
        }
        want[o++] = '"';
        want[o] = 0;
        const char *got = J(in, len);
        if (strcmp(got, want) != 0) TEST_FAIL_("byte 0x%02x at %zu of %zu: %s", c, at, len, got);
        json_value *v = json_parse(got, strlen(got), NULL, 0);
        ASSERT(v && v->type == JSON_STRING);
        ASSERT_EQ(v->len, bo);
        ASSERT_MEM_EQ(v->str, back, bo);
        json_free(v);
      }
  }
}

TEST(json_speed) {
  /* 8 MiB of file-name-like text with a few escapes: the encoder's hot path */
  size_t n = 8u << 20;
  char *in = malloc(n), *out = malloc(TEXT_JSON_MAX(n));
  ASSERT(in && out);
  for (size_t i = 0; i < n; i++) in[i] = (char)(i % 97 == 0 ? '"' : i % 61 == 0 ? '\n' : 'a' + (char)(i % 26));
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  size_t k = text_json_string(NULL, in, n);
  size_t k2 = text_json_string(out, in, n);
  clock_gettime(CLOCK_MONOTONIC, &b);
  ASSERT_EQ(k, k2);
  double ms = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
  printf("  json string 8 MiB, count + write: %.1f ms (this build)\n", ms);
  ASSERT(ms < 5000);
  free(in);
  free(out);
}

/* ------------------------------------------------------------ Go %q */

static char *q;
static const char *Q(const char *s, size_t n) {
  free(q);
  q = text_go_quote_dup(s, n);
  if (q && strlen(q) != text_go_quote(NULL, s, n)) return "(length mismatch)";
  return q;
}
#define QS(lit) Q(lit, sizeof(lit) - 1)

TEST(quote_plain_and_escapes) {
  ASSERT_STR_EQ(QS(""), "\"\"");
  ASSERT_STR_EQ(QS("*.py"), "\"*.py\"");
  ASSERT_STR_EQ(QS("[a-z]?"), "\"[a-z]?\"");
  ASSERT_STR_EQ(QS("a\\"), "\"a\\\\\"");
  ASSERT_STR_EQ(QS("say \"hi\""), "\"say \\\"hi\\\"\"");
  ASSERT_STR_EQ(QS("\a\b\f\n\r\t\v"), "\"\\a\\b\\f\\n\\r\\t\\v\"");
  ASSERT_STR_EQ(QS("\x01\x1f\x7f"), "\"\\x01\\x1f\\x7f\"");
  ASSERT_STR_EQ(QS("a\0b"), "\"a\\x00b\"");
  ASSERT_STR_EQ(QS("<>&'/"), "\"<>&'/\"");
}

TEST(quote_unicode) {
  ASSERT_STR_EQ(QS("\xe4\xb8\xad\xe6\x96\x87"), "\"\xe4\xb8\xad\xe6\x96\x87\""); /* 中文 kept */
  ASSERT_STR_EQ(QS("\xf0\x9f\x98\x80"), "\"\xf0\x9f\x98\x80\"");                 /* emoji kept */
  ASSERT_STR_EQ(QS("\xc3\xa9"), "\"\xc3\xa9\"");
  ASSERT_STR_EQ(QS("\xc2\x80"), "\"\\u0080\"");       /* C1 control */
  ASSERT_STR_EQ(QS("\xc2\x85"), "\"\\u0085\"");
  ASSERT_STR_EQ(QS("\xc2\xa0"), "\"\\u00a0\"");       /* NBSP */
  ASSERT_STR_EQ(QS("\xc2\xad"), "\"\\u00ad\"");       /* soft hyphen */
  ASSERT_STR_EQ(QS("\xe2\x80\xa8"), "\"\\u2028\"");
  ASSERT_STR_EQ(QS("\xef\xbb\xbf"), "\"\\ufeff\"");   /* BOM */
  ASSERT_STR_EQ(QS("\xef\xb7\x90"), "\"\\ufdd0\"");   /* noncharacter */
  ASSERT_STR_EQ(QS("\xf3\xb0\x80\x80"), "\"\\U000f0000\""); /* private use */
  ASSERT_STR_EQ(QS("\xf4\x8f\xbf\xbf"), "\"\\U0010ffff\"");
  ASSERT_STR_EQ(QS("\xef\xbf\xbd"), "\"\xef\xbf\xbd\""); /* a real U+FFFD is printable */
}

TEST(quote_invalid_utf8) {
  ASSERT_STR_EQ(QS("\xff"), "\"\\xff\"");
  ASSERT_STR_EQ(QS("a\xc3"), "\"a\\xc3\"");                 /* truncated sequence */
  ASSERT_STR_EQ(QS("\xe4\xb8"), "\"\\xe4\\xb8\"");
  ASSERT_STR_EQ(QS("\xc0\xaf"), "\"\\xc0\\xaf\"");           /* overlong */
  ASSERT_STR_EQ(QS("\xed\xa0\x80"), "\"\\xed\\xa0\\x80\"");  /* surrogate */
  ASSERT_STR_EQ(QS("\xf4\x90\x80\x80"), "\"\\xf4\\x90\\x80\\x80\""); /* > U+10FFFF */
}

TEST(quote_worst_case) {
  char in[64];
  memset(in, 0x01, sizeof in);
  ASSERT_EQ(strlen(Q(in, sizeof in)), TEXT_QUOTE_MAX(sizeof in));
  memset(in, 0xff, sizeof in);
  ASSERT_EQ(strlen(Q(in, sizeof in)), TEXT_QUOTE_MAX(sizeof in));
  char p[64];
  for (size_t i = 0; i < sizeof p; i += 4) memcpy(p + i, "\xf3\xb0\x80\x80", 4); /* 10 per 4 bytes */
  ASSERT(strlen(Q(p, sizeof p)) <= TEXT_QUOTE_MAX(sizeof p));
}

/* ------------------------------------------------------------ base64 */

static size_t ref_b64(const unsigned char *in, size_t n, char *out) {
  static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8 | in[i + 2];
    out[o++] = A[v >> 18];
    out[o++] = A[v >> 12 & 63];
    out[o++] = A[v >> 6 & 63];
    out[o++] = A[v & 63];
  }
  if (n - i == 1) {
    unsigned v = (unsigned)in[i] << 16;
    out[o++] = A[v >> 18];
    out[o++] = A[v >> 12 & 63];
    out[o++] = '=';
    out[o++] = '=';
  } else if (n - i == 2) {
    unsigned v = (unsigned)in[i] << 16 | (unsigned)in[i + 1] << 8;
    out[o++] = A[v >> 18];
    out[o++] = A[v >> 12 & 63];
    out[o++] = A[v >> 6 & 63];
    out[o++] = '=';
  }
  return o;
}

TEST(b64_encode_matches_reference) {
  unsigned seed = 7;
  unsigned char in[400];
  char out[600], ref[600];
  for (size_t n = 0; n <= 400; n++) {
    for (size_t i = 0; i < n; i++) in[i] = (unsigned char)rand_r(&seed);
    memset(out, '#', sizeof out);
    size_t k = text_b64_encode(in, n, out);
    size_t r = ref_b64(in, n, ref);
    ASSERT_EQ(k, r);
    ASSERT_EQ(k, text_b64_encoded_len(n));
    ASSERT_MEM_EQ(out, ref, k);
    ASSERT_EQ(out[k], '#'); /* nothing written past the end */
    ASSERT(memchr(out, '\n', k) == NULL);
    unsigned char back[400 + 8];
    long d = text_b64_decode(out, k, back);
    ASSERT_EQ(d, (long)n);
    ASSERT_MEM_EQ(back, in, n);
  }
}

TEST(b64_decode_variants) {
  unsigned char o[64];
  ASSERT_EQ(text_b64_decode("aGVsbG8K", 8, o), 6);
  ASSERT_MEM_EQ(o, "hello\n", 6);
  ASSERT_EQ(text_b64_decode("aGk=", 4, o), 2);
  ASSERT_EQ(text_b64_decode("aGk", 3, o), 2);
  ASSERT_MEM_EQ(o, "hi", 2);
  ASSERT_EQ(text_b64_decode("aA==", 4, o), 1);
  ASSERT_EQ(text_b64_decode("aA", 2, o), 1);
  ASSERT_EQ(o[0], 'h');
  ASSERT_EQ(text_b64_decode("", 0, o), 0);
  /* URL-safe: 0xfb 0xff 0xbf → "+/+/" standard, "-_-_" URL-safe */
  ASSERT_EQ(text_b64_decode("-_-_", 4, o), 3);
  ASSERT_MEM_EQ(o, "\xfb\xff\xbf", 3);
  ASSERT_EQ(text_b64_decode("+/+/", 4, o), 3);
  ASSERT_MEM_EQ(o, "\xfb\xff\xbf", 3);
  ASSERT_EQ(text_b64_decode("-_8", 3, o), 2);
  /* rejects */
  /* non-zero bits after the last full byte are tolerated, like Go's and
   * Python's default decoders: "aG==" is "h" */
  ASSERT_EQ(text_b64_decode("aG==", 4, o), 1);
  ASSERT_EQ(o[0], 'h');
  const char *bad[] = {"a", "aGVsb", "aGk==", "a===", "====", "=", "aG=k", "aGk=aGk=",
                       "aGV sbG8K", "aGVs\nbG8K", "aGVsbG8K\n", " aGk=", "aGk*", "aGk.", "+/-_",
                       "aGk=\r\n", "aG\tk=", "\xc3\xa9\x41\x41"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    if (text_b64_decode(bad[i], strlen(bad[i]), o) != -1) TEST_FAIL_("accepted base64 \"%s\"", bad[i]);
  ASSERT_EQ(text_b64_decode("aG\0k", 4, o), -1);
}

TEST(b64_speed_1mib) {
  size_t n = 1 << 20;
  unsigned char *in = malloc(n);
  char *out = malloc(text_b64_encoded_len(n));
  unsigned char *back = malloc(n + 8);
  ASSERT(in && out && back);
  for (size_t i = 0; i < n; i++) in[i] = (unsigned char)(i * 2654435761u >> 13);
  struct timespec a, b, c;
  clock_gettime(CLOCK_MONOTONIC, &a);
  size_t k = text_b64_encode(in, n, out);
  clock_gettime(CLOCK_MONOTONIC, &b);
  long d = text_b64_decode(out, k, back);
  clock_gettime(CLOCK_MONOTONIC, &c);
  ASSERT_EQ(k, text_b64_encoded_len(n));
  ASSERT(memchr(out, '\n', k) == NULL);
  ASSERT_EQ(d, (long)n);
  ASSERT(memcmp(in, back, n) == 0);
  double te = (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
  double td = (double)(c.tv_sec - b.tv_sec) * 1e3 + (double)(c.tv_nsec - b.tv_nsec) / 1e6;
  printf("  base64 1 MiB: encode %.2f ms, decode %.2f ms (this build)\n", te, td);
  ASSERT(te < 1000 && td < 1000);
  free(in);
  free(out);
  free(back);
}

TEST(b64_decoded_max_is_enough) {
  /* nothing is written past TEXT_B64_DECODED_MAX(n) (libb64 may store a
   * partial byte right after the decoded ones) */
  static const char *in[] = {"", "aA", "aGk", "aGk=", "aA==", "aGVsbG8K", "aGVsbG8Kww", "aGVsbG8Kwwc"};
  for (size_t i = 0; i < sizeof in / sizeof *in; i++) {
    size_t n = strlen(in[i]);
    unsigned char o[32];
    memset(o, '#', sizeof o);
    long d = text_b64_decode(in[i], n, o);
    ASSERT(d >= 0 && (size_t)d < TEXT_B64_DECODED_MAX(n));
    for (size_t j = TEXT_B64_DECODED_MAX(n); j < sizeof o; j++) ASSERT_EQ(o[j], '#');
  }
}

/* ------------------------------------------------------------ small forms */

TEST(u64_dec) {
  static const struct { uint64_t v; const char *s; } c[] = {
      {0, "0"}, {9, "9"}, {10, "10"}, {4294967295u, "4294967295"},
      {UINT64_MAX, "18446744073709551615"}};
  for (size_t i = 0; i < sizeof c / sizeof *c; i++) {
    char b[TEXT_U64_DIGITS + 2];
    memset(b, '#', sizeof b);
    b[sizeof b - 1] = 0;
    char *p = text_u64_dec(b + sizeof b - 1, c[i].v);
    ASSERT_STR_EQ(p, c[i].s);
    ASSERT(p >= b && (p == b || p[-1] == '#'));
  }
}

static char ubuf[64];
static const char *U(const char *s) {
  ubuf[text_octal_unescape(ubuf, s, strlen(s))] = 0;
  return ubuf;
}

TEST(octal_unescape) {
  ASSERT_STR_EQ(U("/mnt/a\\040b"), "/mnt/a b");
  ASSERT_STR_EQ(U("\\011\\012\\134\\377"), "\t\n\\\xff");
  ASSERT_STR_EQ(U("\\400"), "\\400");   /* not a byte */
  ASSERT_STR_EQ(U("\\08x"), "\\08x");   /* not octal */
  ASSERT_STR_EQ(U("a\\04"), "a\\04");   /* cut */
  ASSERT_STR_EQ(U("\\"), "\\");
  ASSERT_STR_EQ(U(""), "");
  char in[] = "x\\040y\\040z"; /* in place */
  in[text_octal_unescape(in, in, strlen(in))] = 0;
  ASSERT_STR_EQ(in, "x y z");
}

int main(void) {
  RUN(utf8_valid_edges);
  RUN(utf8_invalid_edges);
  RUN(utf8_matches_reference);
  RUN(classes);
  RUN(json_every_control_char);
  RUN(json_quotes_backslash_and_what_stays);
  RUN(json_invalid_bytes);
  RUN(json_everywhere_and_parses_back);
  RUN(json_speed);
  RUN(quote_plain_and_escapes);
  RUN(quote_unicode);
  RUN(quote_invalid_utf8);
  RUN(quote_worst_case);
  RUN(b64_encode_matches_reference);
  RUN(b64_decode_variants);
  RUN(b64_speed_1mib);
  RUN(b64_decoded_max_is_enough);
  RUN(u64_dec);
  RUN(octal_unescape);
  free(q);
  return test_summary();
}
