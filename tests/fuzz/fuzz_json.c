/* fuzz_json — the strict JSON parser (proto/json.c).  Properties: a parse
 * that succeeds saw valid UTF-8; every decoded string and key is valid
 * UTF-8; the parse into a caller's buffer gives the same tree as the heap
 * parse; a small budget only ever turns success into "over budget". */
#include <string.h>

#include "proto/json.h"
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
  if (v->type == JSON_STRING) FUZZ_CHECK(json_utf8_valid(v->str, v->len));
  for (size_t i = 0; (v->type == JSON_ARRAY || v->type == JSON_OBJECT) && i < v->n; i++) {
    if (v->type == JSON_OBJECT) FUZZ_CHECK(json_utf8_valid(v->keys[i], v->key_lens[i]));
    strings_valid(&v->items[i]);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  char err[128];
  json_value *v = json_parse(s, size, err, sizeof err);
  if (v) {
    FUZZ_CHECK(json_utf8_valid(s, size));
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
