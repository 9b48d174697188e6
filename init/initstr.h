/* initstr — text helpers of the init protocol (boot.md §3).
 *
 * A growing string (bounded by the caller's input, explicit OOM flag) with
 * Go's strconv.Quote (the reference formats user strings with %q, so the
 * error texts must quote the same way) and JSON string output — both are
 * proto/text.h's, which documents them — plus Go's strings.TrimSpace and
 * strict IPv4 dotted quads.
 */
#ifndef CONCH_INIT_INITSTR_H
#define CONCH_INIT_INITSTR_H

#include <stddef.h>
#include <stdint.h>

typedef struct istr {
  char *p;   /* NUL-terminated when !oom */
  size_t n, cap;
  int oom;
} istr;

void istr_add(istr *b, const char *s, size_t n);
void istr_adds(istr *b, const char *s);
void istr_addf(istr *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Go %q of s[0..n): text_go_quote. */
void istr_quote(istr *b, const char *s, size_t n);
/* A JSON string literal (with quotes): text_json_string. */
void istr_json(istr *b, const char *s, size_t n);
/* Take the buffer (caller frees); NULL on OOM. */
char *istr_take(istr *b, size_t *len);
void istr_free(istr *b);

/* strings.TrimSpace on (*s, *n). */
void initstr_trim(const char **s, size_t *n);
/* 1 if s has a space or control rune (invalid UTF-8 counts as control). */
int initstr_has_space_or_control(const char *s, size_t n);
/* Dotted-quad IPv4, each octet 0..255 in canonical decimal (no leading
 * zeros).  Returns 1 and *out in host order. */
int initstr_ipv4(const char *s, size_t n, uint32_t *out);
/* "a.b.c.d" of a host-order address into out[16]. */
void initstr_ipv4_fmt(uint32_t a, char out[16]);

#endif
