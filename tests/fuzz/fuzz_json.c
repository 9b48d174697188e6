/* fuzz_json — the strict JSON parser (proto/json.c).  Properties: a parse
 * that succeeds saw valid UTF-8; every decoded string and key is valid
 * UTF-8; the parse into a caller's buffer gives the same tree as the heap
 * parse; a small budget only ever turns success into "over budget".
 * The writers of proto/text.h, on the same bytes taken as a string: the
 * JSON literal parses back to the input (each byte that is not UTF-8 as
 * U+FFFD), has no raw control byte, and its counted length is its written
 * length; %q output is valid UTF-8 without control bytes; base64 round
 * trips. */
#include <stdlib.h>
#include <string.h>

#include "proto/json.h"
#include "proto/text.h"
#include "fuzz.h"

static int same(const json_value *a, const json_value *b) {
  if (a->type != b->type || a->len != b->len || a->n != b->n) return 0;
  if ((a->type == JSON_STRING || a->type == JSON_NUMBER) && memcmp(a->str, b->str, a->len) != 0) return 0;
  for (size_t i = 0; (a->type == JSON_ARRAY || a->type == JSON_OBJECT) && i < a->n; i++) {
    if (a->type == JSON_OBJECT &&
        (a->key_lens[i] != b->key_lens[i] || memcmp(a->keys[i], b->keys[i], a->key_lens[i]) != 0))
      return 0;
    if (!same(&a->items[i], &b->items[i])) return 0;
  }
  return 1;
}

static void strings_valid(const json_value *v) {
  if (v->type == JSON_STRING) FUZZ_CHECK(text_utf8_valid(v->str, v->len));
  for (size_t i = 0; (v->type == JSON_ARRAY || v->type == JSON_OBJECT) && i < v->n; i++) {
    if (v->type == JSON_OBJECT) FUZZ_CHECK(text_utf8_valid(v->keys[i], v->key_lens[i]));
    strings_valid(&v->items[i]);
  }
}

static void text_writers(const char *s, size_t size) {
  char *js = malloc(TEXT_JSON_MAX(size));
  size_t k = text_json_string(NULL, s, size);
  FUZZ_CHECK(js && k <= TEXT_JSON_MAX(size) && text_json_string(js, s, size) == k);
  for (size_t i = 0; i < k; i++) FUZZ_CHECK((unsigned char)js[i] >= 0x20);
  /* what the parser must give back: the input, bad bytes as U+FFFD */
  char *want = malloc(size * 3 + 1);
  size_t wn = 0;
  for (size_t i = 0, w; i < size; i += w) {
    uint32_t r = text_utf8_rune((const unsigned char *)s + i, size - i, &w);
    if (r == TEXT_RUNE_ERROR && w == 1) {
      memcpy(want + wn, "\xef\xbf\xbd", 3);
      wn += 3;
    } else {
      memcpy(want + wn, s + i, w);
      wn += w;
    }
  }
  FUZZ_CHECK(wn == size || !text_utf8_valid(s, size));
  json_value *v = json_parse(js, k, NULL, 0);
  FUZZ_CHECK(v && v->type == JSON_STRING && v->len == wn && memcmp(v->str, want, wn) == 0);
  json_free(v);
  free(want);
  free(js);

  char *q = malloc(TEXT_QUOTE_MAX(size));
  k = text_go_quote(NULL, s, size);
  FUZZ_CHECK(q && k <= TEXT_QUOTE_MAX(size) && text_go_quote(q, s, size) == k);
  FUZZ_CHECK(k >= 2 && q[0] == '"' && q[k - 1] == '"' && text_utf8_valid(q, k));
  for (size_t i = 0; i < k; i++) FUZZ_CHECK((unsigned char)q[i] >= 0x20 && q[i] != 0x7f);
  free(q);

  char *b = malloc(text_b64_encoded_len(size) + 1);
  unsigned char *back = malloc(TEXT_B64_DECODED_MAX(text_b64_encoded_len(size)) + 1);
  k = text_b64_encode((const unsigned char *)s, size, b);
  FUZZ_CHECK(k == text_b64_encoded_len(size));
  FUZZ_CHECK(text_b64_decode(b, k, back) == (long)size && memcmp(back, s, size) == 0);
  free(back);
  free(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  text_writers(s, size);
  char err[128];
  json_value *v = json_parse(s, size, err, sizeof err);
  if (v) {
    FUZZ_CHECK(text_utf8_valid(s, size));
    strings_valid(v);
    char stack[512];
    int over = 0;
    json_value *w = json_parse_in(s, size, (size_t)1 << 30, stack, sizeof stack, err, sizeof err, &over);
    FUZZ_CHECK(w != NULL && same(v, w));
    json_free(w);
  }
  int over = 0;
  json_value *small = json_parse_ex(s, size, 256, err, sizeof err, &over);
  FUZZ_CHECK(!small || v);         /* the budget never makes a bad document good */
  FUZZ_CHECK(small || !v || over); /* and fails a good one only by running out */
  json_free(small);
  json_free(v);
  return 0;
}
