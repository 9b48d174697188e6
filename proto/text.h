/* text — the one implementation of the text encodings every module needs:
 * UTF-8 decoding and validation, JSON string literals, Go's %q quoting,
 * base64, decimal digits, the kernel's octal escapes.  No allocation except text_go_quote_dup; no I/O.
 *
 * UTF-8 follows Go's unicode/utf8 (and RFC 3629): overlongs, surrogates
 * (U+D800–DFFF), anything above U+10FFFF and truncated sequences are
 * invalid, and an invalid sequence counts as ONE bad byte: decoding moves on
 * by a single byte, so "\xe4\xb8" is two errors, not one.
 *
 * JSON string literals — one output for one input, whoever writes them
 * (pbjson's messages, Connect error bodies, the init protocol's response):
 *   '"' → \"   '\' → \\   \b \f \n \r \t by name,
 *   other bytes below 0x20 → \u00XX (lower-case hex),
 *   every byte that does not start a valid UTF-8 sequence → \ufffd,
 *   everything else as it is (DEL, '/', '<', '>', '&', U+2028, U+2029 and
 *   all valid non-ASCII).
 * That is protobuf's canonical JSON as Go's protojson writes it (api.md §3
 * names the canonical mapping) — protojson refuses invalid UTF-8, where we
 * must still answer (a file name from disk, a cut error text), so such a
 * byte becomes the escaped \ufffd that Go's encoding/json (connect-go's
 * error bodies) writes.  Escaped rather than the raw bytes EF BF BD: the
 * output stays ASCII where the input was not UTF-8, and a U+FFFD that was
 * really in the input (written raw) stays distinguishable.  Not escaped:
 * encoding/json's HTML-safe \u003c \u003e \u0026 \u2028 \u2029 (these
 * documents are never embedded in HTML or pre-2019 JavaScript source, and
 * protojson does not escape them either); any JSON parser reads both forms
 * alike.
 *
 * Go quoting is strconv.Quote (fmt's %q), which the reference's error texts
 * use for user input: '"' and '\' escaped, \a \b \f \n \r \t \v by name,
 * other C0 controls, DEL and invalid bytes as \xNN, valid runes that are
 * not printable as \uNNNN / \UNNNNNNNN, the rest verbatim.  Go's
 * strconv.IsPrint has the full Unicode tables; text_is_print approximates
 * it: not a control, not a space other than U+0020, not a format character
 * (U+00AD, U+0600–0605, U+061C, U+06DD, U+070F, U+180E, U+200B–200F,
 * U+202A–202E, U+2060–206F, U+FEFF, U+FFF9–FFFB), not private use, not a
 * noncharacter (U+FDD0–FDEF, U+xFFFE/U+xFFFF).  Go additionally escapes
 * unassigned code points; we print those verbatim — the only place our
 * texts can differ from the reference.
 *
 * base64 (implementation: text_b64.c, on libb64): the encoder writes the
 * standard alphabet with padding and no line breaks; the decoder is strict
 * and accepts the standard or the URL-safe alphabet (not both mixed), with
 * or without padding; anything else (whitespace, stray '=', a lone last
 * character, an unknown character) is -1.
 */
#ifndef CONCH_PROTO_TEXT_H
#define CONCH_PROTO_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------- UTF-8 */

#define TEXT_RUNE_ERROR 0xFFFDu

/* Length (1..4) of the valid UTF-8 sequence at p (avail > 0 bytes there),
 * or 0 when the bytes there are not valid UTF-8.  ASCII is 1. */
size_t text_utf8_seq(const unsigned char *p, size_t avail);
/* Go's utf8.DecodeRune: the rune at s (n bytes available), its width in
 * *w.  Invalid → (TEXT_RUNE_ERROR, 1) (a real U+FFFD has width 3);
 * n == 0 → (TEXT_RUNE_ERROR, 0). */
uint32_t text_utf8_rune(const unsigned char *s, size_t n, size_t *w);
/* 1 when s[0..n) is entirely valid UTF-8. */
int text_utf8_valid(const char *s, size_t n);
/* UTF-8 of code point cp (< 0x110000, no surrogate) into o[0..4); returns
 * its length. */
size_t text_utf8_put(unsigned char *o, uint32_t cp);

/* The end of the run of bytes from s on that stand for themselves in a JSON
 * string: printable ASCII and DEL, but '"' and '\'.  The JSON parser's and
 * writer's fast path, 8 bytes at a time. */
const unsigned char *text_plain_run(const unsigned char *s, const unsigned char *end);

/* Go's unicode.IsSpace, unicode.IsControl and (approximately, see above)
 * strconv.IsPrint. */
int text_is_space(uint32_t r);
int text_is_control(uint32_t r);
int text_is_print(uint32_t r);

/* ---------------------------------------------------------------- JSON */

/* The JSON string literal of s[0..n), quotes included, escaped as above,
 * into out (no NUL); returns its length.  out NULL: only the length (the
 * same code runs, so the two always agree).  At most TEXT_JSON_MAX(n). */
size_t text_json_string(char *out, const char *s, size_t n);
#define TEXT_JSON_MAX(n) ((n) * 6 + 2)

/* ---------------------------------------------------------------- Go %q */

/* Go's strconv.Quote of s[0..n), quotes included, into out (no NUL);
 * returns its length; out NULL: only the length.  At most TEXT_QUOTE_MAX(n). */
size_t text_go_quote(char *out, const char *s, size_t n);
#define TEXT_QUOTE_MAX(n) ((n) * 4 + 2)
/* The same, malloc'd and NUL-terminated; NULL when out of memory. */
char *text_go_quote_dup(const char *s, size_t n);

/* ---------------------------------------------------------------- small forms */

/* The decimal digits of v (no sign, no NUL, at most TEXT_U64_DIGITS),
 * written backwards so that they end just before `end`; returns where they
 * start.  For callers that build a number in front of something. */
#define TEXT_U64_DIGITS 20
char *text_u64_dec(char *end, uint64_t v);

/* The kernel's octal escapes (\NNN, as /proc/self/mountinfo writes a space
 * as \040) of s[0..n) decoded into out (which may be s: the result is
 * never longer); a backslash not followed by three octal digits of a byte
 * stays as it is.  Returns the decoded length; no NUL. */
size_t text_octal_unescape(char *out, const char *s, size_t n);

/* ---------------------------------------------------------------- base64 */

size_t text_b64_encoded_len(size_t n);
/* Standard alphabet, padded, no line breaks, no NUL; returns the length
 * (text_b64_encoded_len(n)). */
size_t text_b64_encode(const unsigned char *in, size_t n, char *out);
/* Decoded length, or -1 when in[0..n) is not base64 (see above).  out
 * needs TEXT_B64_DECODED_MAX(n) bytes: libb64 stores a partial byte one
 * past the decoded ones when the input ends inside a group. */
long text_b64_decode(const char *in, size_t n, unsigned char *out);
#define TEXT_B64_DECODED_MAX(n) ((n) / 4 * 3 + 3)

#endif
