/* json — a strict RFC 8259 JSON parser into a small DOM.
 *
 * json_parse() accepts exactly one JSON value (surrounding whitespace
 * allowed, nothing else), nesting depth <= JSON_MAX_DEPTH, valid UTF-8 only
 * (no overlongs, no surrogates, nothing above U+10FFFF), no raw control
 * characters inside strings, the exact RFC number grammar.  \uXXXX escapes
 * (incl. surrogate pairs) decode to UTF-8; lone surrogates are an error.
 * Objects keep their members in document order, duplicates included
 * (json_get returns the first).  The whole tree lives in a few blocks that
 * json_free(root) frees together (nodes and strings cannot be freed or
 * taken over one by one), and it may take at most a budget of memory:
 * JSON_MEM_BUDGET(input length) unless json_parse_ex says otherwise.
 */
#ifndef CONCH_JSON_H
#define CONCH_JSON_H

#include <stddef.h>

#define JSON_MAX_DEPTH 64
/* The default memory bound of a parsed document.  Nodes are 56 bytes and
 * an array's outgrown blocks stay until the document is freed, so an array
 * of tiny values ("[1,1,...]": 2 bytes of input each) can need ~116 times
 * its length; strings and objects far less.  128 times plus 1 MiB, and
 * never more than 64 MiB: a command with 10 000 one-character arguments
 * fits (16 times refused it), and no 16 MiB body can take half a gigabyte
 * (the cap, not the factor, bounds those). */
#define JSON_MEM_BUDGET(n) \
  ((size_t)(n) < ((size_t)63 << 20) / 128 ? (size_t)(n) * 128 + ((size_t)1 << 20) : (size_t)64 << 20)

typedef enum json_type { JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING,
                         JSON_ARRAY, JSON_OBJECT } json_type;
typedef struct json_value json_value;
struct json_value {
  json_type type;
  char *str;  size_t len;   /* STRING: decoded bytes, NUL-terminated (may contain \0 from \u0000);
                               NUMBER: the literal text as written */
  size_t n;                 /* ARRAY / OBJECT: number of members */
  json_value *items;        /* ARRAY: n values; OBJECT: n values, in document order */
  char **keys; size_t *key_lens;   /* OBJECT: n decoded keys (NUL-terminated); both arrays
                                      share the items block (freed with it) */
};

/* Parse exactly one JSON value; whitespace around it allowed, anything else
 * after it (a second value, garbage) is an error. Depth bound 64. Input
 * must be valid UTF-8; \uXXXX escapes incl. surrogate pairs decode to UTF-8;
 * lone surrogates are an error. Returns NULL and a reason in err on error
 * (err may be NULL when errlen is 0). */
json_value *json_parse(const char *s, size_t n, char *err, size_t errlen);
/* json_parse with an explicit memory budget in bytes; *over (if not NULL)
 * is set to 1 when the parse failed because the budget ran out. */
json_value *json_parse_ex(const char *s, size_t n, size_t budget, char *err, size_t errlen,
                          int *over);
/* json_parse_ex with the root and first block in the caller's buffer
 * (bufsz bytes at buf, any alignment; not used when too small): a small
 * document then needs no malloc.  json_free must still be called (for the
 * blocks after the first), before the buffer goes away. */
json_value *json_parse_in(const char *s, size_t n, size_t budget, void *buf, size_t bufsz, char *err,
                          size_t errlen, int *over);
/* Frees a document; v must be a root returned by json_parse. */
void json_free(json_value *v);
/* First member with this key (NULL if none / not an object). */
const json_value *json_get(const json_value *obj, const char *key);
/* Same with an explicit key length (keys may contain NUL bytes). */
const json_value *json_get_n(const json_value *obj, const char *key, size_t keylen);

/* Name of a type ("null", "false", "true", "number", "string", "array", "object"). */
const char *json_type_name(json_type t);

#endif
