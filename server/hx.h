/* hx — one HTTP exchange (request + response), whatever the HTTP version.
 *
 * The transports (http1.c, h2.c) create an hx when a request's headers are
 * complete and hand it to router_dispatch().  The handler then installs its
 * callbacks (hx_set_handler) and answers with hx_respond / hx_write / hx_end.
 *
 * Lifetime: the transport owns the hx.  After hx_end() the handler gets no
 * more callbacks and must forget the hx.  If the peer goes away (connection
 * closed, RST_STREAM) before hx_end(), on_abort runs once and the hx is freed
 * when it returns.  Transports never call a handler callback from inside an
 * hx_* call made by that handler (no re-entrancy).
 *
 * Backpressure: hx_outq() counts bytes written by the handler and not yet
 * accepted by the kernel; on_drain runs when it falls under HX_OUTQ_LOW
 * after having been higher.  hx_pause_body(1) stops delivery of request
 * body bytes (and reading: the socket / the HTTP/2 stream window).
 */
#ifndef CONCH_HX_H
#define CONCH_HX_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/bufref.h"

typedef struct hx hx;
struct hsink;

typedef struct hx_header {
  const char *name; /* lower case */
  const char *value;
  size_t nlen; /* strlen(name) for request headers (hx_get compares it first); 0 elsewhere */
} hx_header;

typedef struct hx_handler {
  void (*on_body)(hx *x, const uint8_t *data, size_t len);
  void (*on_body_end)(hx *x);
  void (*on_abort)(hx *x);
  void (*on_drain)(hx *x);
  /* Optional: the handler's own memory where the next *len request body
   * bytes may be read (or NULL); they then come to on_body at that
   * address.  Only asked by a transport that reads straight into it. */
  uint8_t *(*body_into)(hx *x, size_t *len);
} hx_handler;

#define HX_OUTQ_LOW (1u * 1024 * 1024)
#define HX_TRIM_BYTES (1u * 1024 * 1024)

/* One piece of body bytes: len > 0 bytes at data; owner (bufref.h) is
 * released once they are written, or at once on failure. */
typedef struct hx_part {
  void *owner;
  const uint8_t *data;
  size_t len;
} hx_part;

/* Transport side of an hx (a vtable; see http1.c, h2.c). */
typedef struct hx_ops {
  int (*respond)(hx *x, int status, const hx_header *h, size_t n, int64_t content_length);
  /* n (1 or 2) pieces that go out back to back: queued all, or none (every
   * owner released at once) */
  int (*write)(hx *x, const hx_part *parts, unsigned n);
  int (*end)(hx *x, const hx_header *trailers, size_t n);
  void (*pause_body)(hx *x, int paused);
  size_t (*outq)(const hx *x);
  /* room for about n more bytes now?  1: yes, reserved until the next
   * write; 0: on_drain runs once there is (see hx_room) */
  int (*room)(hx *x, size_t n);
  /* the answer waits on something outside the connection (NULL: nothing
   * to do; see hx_waiting) */
  void (*waiting)(hx *x);
  /* Optional (NULL: not on this transport): len bytes of fd from off, sent
   * from the file to the socket by the kernel (sendfile) after what was
   * written before; on_drain runs once they all left.  0 started, 1 not
   * possible here (nothing done), -1 failed. */
  int (*write_file)(hx *x, int fd, uint64_t off, uint64_t len);
  /* Optional (NULL: the transport cannot end one exchange alone): cut this
   * answer short and leave the connection be (HTTP/2: RST_STREAM); the
   * handler's on_abort follows from the loop.  0, or -1 (close instead). */
  int (*reset)(hx *x);
} hx_ops;

#define HX_MAX_HEADERS 128
#define HX_INLINE_HEADERS 12
#define HX_INLINE_STR 448

struct hx {
  const hx_ops *ops;
  void *tp; /* transport's per-exchange state */
  struct hsink *sink; /* the connection it arrived on */
  /* request, valid until the hx is freed */
  char *method;
  char *path;   /* path without the query string */
  char *query;  /* after '?', or NULL */
  hx_header *hdr; /* grown as fields arrive, at most HX_MAX_HEADERS */
  size_t nhdr, caphdr;
  /* Request strings and the first headers live inline (no malloc for a
   * typical request); what does not fit is malloc'd (see hx_strdup). */
  hx_header hdr_inl[HX_INLINE_HEADERS];
  size_t str_used;
  char str_inl[HX_INLINE_STR];
  int http2;
  int64_t content_length; /* -1 unknown */
  /* handler */
  const hx_handler *h;
  void *hdata;
  int responded, ended;
  int bulk; /* hx_bulk: counted in its sink until freed */
  size_t out_bytes; /* body bytes written: a big answer's end asks for a trim */
  size_t in_bytes;  /* request body bytes handed on (hx_body): a big request's too */
};

/* Transports hand request body bytes to the handler through this, so that
 * they are counted; x->h->on_body must be set. */
static inline void hx_body(hx *x, const uint8_t *data, size_t len) {
  x->in_bytes += len;
  x->h->on_body(x, data, len);
}

const char *hx_getn(const hx *x, const char *lname, size_t l);
/* inline: a literal name's length is known at compile time */
static inline const char *hx_get(const hx *x, const char *lname) { return hx_getn(x, lname, strlen(lname)); }
void hx_set_handler(hx *x, const hx_handler *h, void *data);

/* content_length: the exact body length, or -1 to stream (HTTP/1.1 chunked). */
int hx_respond(hx *x, int status, const hx_header *h, size_t n, int64_t content_length);
/* Queue body bytes: buf must be malloc'd; ownership passes to the transport
 * (freed even on error).  Returns 0 or -1 (exchange already gone). */
int hx_write(hx *x, uint8_t *buf, size_t len);
int hx_write_copy(hx *x, const void *data, size_t len);
/* len bytes at data, held by owner (an owner word, bufref.h): released once
 * written, or at once on failure. */
int hx_write_owned(hx *x, void *owner, const uint8_t *data, size_t len);
/* buf[off, off+len) (malloc'd, taken) and then dlen bytes at data held by
 * ref — memory the caller does not own through malloc, such as retained
 * process output; ref->release(ref) runs once, when they are written or at once
 * on failure — queued together or not at all (a message's framing never
 * goes out without its body). */
int hx_write_pair(hx *x, uint8_t *buf, size_t off, size_t len, const uint8_t *data, size_t dlen,
                  struct bufref *ref);
/* See hx_ops.write_file: 0 started (on_drain follows once sent), 1 not on
 * this transport, -1 failed. */
int hx_write_file(hx *x, int fd, uint64_t off, uint64_t len);
/* Finish the response; trailers only reach HTTP/2 peers. */
int hx_end(hx *x, const hx_header *trailers, size_t n);
/* Whole small response in one call. */
int hx_simple(hx *x, int status, const char *content_type, const char *body,
              const hx_header *extra, size_t nextra);
void hx_pause_body(hx *x, int paused);
size_t hx_outq(const hx *x);
/* May a producer of large output (a download) make about n more bytes
 * now?  1: yes — the transport counts them as queued until the next
 * write; 0: not until what this exchange already queued has left for the
 * socket (HTTP/2: for the peer's flow-control window, which must be open)
 * and the connection's queue is under its bound; on_drain runs then.
 * This keeps a connection's output to about one chunk whatever the number
 * of its streams. */
int hx_room(hx *x, size_t n);
/* The handler's answer is small and waits on something outside this
 * connection (a child that reads its stdin): HTTP/2 stops counting it
 * among the answers being made, so that waiting calls do not hold back the
 * connection's other requests (h2.c, H2_COMPUTING_MAX). */
void hx_waiting(hx *x);
/* The answer is bulk data (rpc_bulk): the connection holds the kernel's
 * unsent bytes short until the exchange is freed (hx_free_request). */
void hx_bulk(hx *x);
/* The request passed the token check: its connection is authenticated
 * (with the current token: sink op `authed`). */
void hx_authed(hx *x);

/* Used by transports: fill the request part. Returns 0 or -1 (too many). */
int hx_add_header(hx *x, const char *name, size_t nlen, const char *value, size_t vlen);
/* A NUL-terminated copy of s[0, n) owned by x (freed by hx_free_request):
 * for method, path and query.  NULL when out of memory. */
char *hx_strdup(hx *x, const char *s, size_t n);
/* Copy src's request part (method, path, query, headers) into dst, which
 * has none yet.  0 or -1 (out of memory). */
int hx_copy_request(hx *dst, const hx *src);
/* Frees the request part, and ends what hx_bulk asked of the sink: the
 * transports call it once, when the exchange goes. */
void hx_free_request(hx *x);

#endif
