/* h2check — what makes an HTTP/2 request malformed (RFC 9113 §8.1.1,
 * §8.2, §8.3.1), checked field by field as the header block arrives.
 *
 * nghttp2 can do these checks itself ("HTTP messaging"), but they cost
 * about 2.5 k of the ~20.7 k instructions the loop spends on a unary call
 * (separate passes per field, its token lookups); server/h2.c turns them
 * off and calls this instead.  A malformed request is a stream error of
 * type PROTOCOL_ERROR: h2.c resets the stream and no service sees it.
 *
 * Rules, as nghttp2 1.52 applies them to requests:
 * - names: lower-case token characters only; pseudo-headers only
 *   :method :scheme :authority :path (no :protocol, extended CONNECT is not
 *   enabled), each once, all before the first regular field, none in
 *   trailers;
 * - values: no control characters but HTAB, no DEL; regular fields have no
 *   leading or trailing SP/HTAB; :method is a token, :scheme a scheme,
 *   :authority the authority characters, :path visible characters and
 *   either "/..." or "*" with OPTIONS;
 * - connection, keep-alive, proxy-connection, transfer-encoding and upgrade
 *   are not allowed; te only as "trailers";
 * - content-length at most once, decimal digits; the DATA received must
 *   add up to it exactly (h2check_data, h2check_end_stream);
 * - pseudo-header values and host are not empty, host comes at most once;
 * - the block needs :method, :scheme, :path and :authority or host.
 */
#ifndef CONCH_H2CHECK_H
#define CONCH_H2CHECK_H

#include <stddef.h>
#include <stdint.h>

typedef struct h2check {
  unsigned seen;          /* private: H2CK_* bits */
  int64_t content_length; /* -1 when the request has none */
  uint64_t body;          /* DATA bytes received */
} h2check;

/* What one field is, from its bytes alone (private fields).  A pure
 * function of name and value: h2.c keeps it per HPACK-indexed field, so a
 * field a client sends on every request is checked once per connection. */
typedef struct h2check_kind {
  unsigned kind, flags;
  int64_t num; /* content-length's value */
} h2check_kind;

void h2check_init(h2check *k);
/* The checks that need only the field's bytes: 0 and *f filled in, or -1
 * (malformed wherever it appears). */
int h2check_classify(const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen, h2check_kind *f);
/* The checks that need the block so far (order, repeats): 0 fine, -1
 * malformed.  h2check_field is h2check_classify then h2check_apply. */
int h2check_apply(h2check *k, const h2check_kind *f);
/* One field of the request header block: 0 fine, -1 malformed. */
int h2check_field(h2check *k, const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen);
/* One field of a trailer block: 0 fine, -1 malformed. */
int h2check_trailer_field(const uint8_t *name, size_t nlen, const uint8_t *value, size_t vlen);
/* The header block is complete: 0 fine, -1 malformed. */
int h2check_end_headers(const h2check *k);
/* n more DATA bytes: -1 when they pass the declared content-length. */
int h2check_data(h2check *k, size_t n);
/* The request ended: -1 when the DATA fell short of content-length. */
int h2check_end_stream(const h2check *k);

#endif
