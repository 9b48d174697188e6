/* initstr — text helpers of the init protocol (boot.md §3).
 *
 * A growing string (bounded by the caller's input, explicit OOM flag), Go's
 * strconv.Quote (the reference formats user strings with %q, so the error
 * texts must quote the same way), Go's strings.TrimSpace / unicode.IsSpace /
 * unicode.IsControl, strict IPv4 dotted quads, and JSON string output.
 *
 * initstr_quote follows strconv.Quote: \a \b \f \n \r \t \v \\ \", other C0
 * controls, DEL and invalid UTF-8 bytes as \xNN, valid runes that are not
 * printable as \uNNNN / \UNNNNNNNN, everything else verbatim.  "Printable"
 * here is: not a control, not a space other than U+0020, not a format
 * character (U+00AD, U+0600–0605, U+061C, U+06DD, U+070F, U+180E,
 * U+200B–200F, U+202A–202E, U+2060–206F, U+FEFF, U+FFF9–FFFB), not private
 * use, not a noncharacter U+xFFFE/U+xFFFF.  Go additionally escapes
 * unassigned code points (it has the full Unicode tables); we print those
 * verbatim — the only place our texts can differ from the reference.
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
/* Go %q of s[0..n). */
void istr_quote(istr *b, const char *s, size_t n);
/* A JSON string literal (with quotes), escaping like Go's encoding/json:
 * " \ and C0 controls, plus < > & U+2028 U+2029 as \u escapes. */
void istr_json(istr *b, const char *s, size_t n);
/* Take the buffer (caller frees); NULL on OOM. */
char *istr_take(istr *b, size_t *len);
void istr_free(istr *b);

/* One UTF-8 rune at s (n > 0): returns the rune and its width in *w;
 * invalid → -1 with *w = 1. */
int32_t initstr_rune(const unsigned char *s, size_t n, size_t *w);
int initstr_is_space(int32_t r);   /* unicode.IsSpace */
int initstr_is_control(int32_t r); /* unicode.IsControl */
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
