/* hx — the version-independent exchange API; see hx.h. */
#include "server/hx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "server/sink.h"

const char *hx_getn(const hx *x, const char *lname, size_t l) {
  for (size_t i = 0; i < x->nhdr; i++)
    if (x->hdr[i].nlen == l && memcmp(x->hdr[i].name, lname, l) == 0) return x->hdr[i].value;
  return NULL;
}

void hx_set_handler(hx *x, const hx_handler *h, void *data) {
  x->h = h;
  x->hdata = data;
}

int hx_respond(hx *x, int status, const hx_header *h, size_t n, int64_t content_length) {
  if (x->responded || x->ended) return -1;
  x->responded = 1;
  return x->ops->respond(x, status, h, n, content_length);
}

/* n <= 2 (the transports' limit) */
static int hx_write_parts(hx *x, hx_part *p, unsigned n) {
  unsigned k = 0;
  for (unsigned i = 0; i < n; i++) { /* empty pieces are released at once */
    if (p[i].len == 0) bufref_owner_free(p[i].owner);
    else p[k++] = p[i];
  }
  if (!x->responded || x->ended) {
    for (unsigned i = 0; i < k; i++) bufref_owner_free(p[i].owner);
    return -1;
  }
  for (unsigned i = 0; i < k; i++) x->out_bytes += p[i].len;
  return k ? x->ops->write(x, p, k) : 0;
}

int hx_write_owned(hx *x, void *owner, const uint8_t *data, size_t len) {
  hx_part p = {owner, data, len};
  return hx_write_parts(x, &p, 1);
}

int hx_write_pair(hx *x, uint8_t *buf, size_t off, size_t len, const uint8_t *data, size_t dlen,
                  bufref *ref) {
  hx_part p[2] = {{buf, buf + off, len}, {bufref_owner(ref), data, dlen}};
  return hx_write_parts(x, p, 2);
}

int hx_write(hx *x, uint8_t *buf, size_t len) { return hx_write_owned(x, buf, buf, len); }

int hx_write_copy(hx *x, const void *data, size_t len) {
  uint8_t *b = malloc(len ? len : 1);
  if (!b) return -1;
  memcpy(b, data, len);
  return hx_write(x, b, len);
}

int hx_write_file(hx *x, int fd, uint64_t off, uint64_t len) {
  if (!x->responded || x->ended) return -1;
  if (!x->ops->write_file) return 1;
  int r = x->ops->write_file(x, fd, off, len);
  if (r == 0) x->out_bytes += len;
  return r;
}

int hx_end(hx *x, const hx_header *trailers, size_t n) {
  if (x->ended) return -1;
  if (!x->responded) hx_respond(x, 200, NULL, 0, 0);
  x->ended = 1;
  /* a long-lived connection may never close: give a big answer's (or a big
   * upload's) memory back once it is done, too — with main.c's fixed 4 MiB
   * trim threshold the heap keeps that much otherwise */
  if ((x->out_bytes >= HX_TRIM_BYTES || x->in_bytes >= HX_TRIM_BYTES) && x->sink) x->sink->ops->trim(x->sink);
  return x->ops->end(x, trailers, n);
}

int hx_simple(hx *x, int status, const char *content_type, const char *body,
              const hx_header *extra, size_t nextra) {
  hx_header h[8];
  size_t n = 0;
  if (content_type) h[n++] = (hx_header){"content-type", content_type};
  for (size_t i = 0; i < nextra && n < 8; i++) h[n++] = extra[i];
  size_t bl = body ? strlen(body) : 0;
  if (hx_respond(x, status, h, n, (int64_t)bl) != 0) return -1;
  if (bl) hx_write_copy(x, body, bl);
  return hx_end(x, NULL, 0);
}

void hx_pause_body(hx *x, int paused) {
  if (!x->ended) x->ops->pause_body(x, paused);
}

size_t hx_outq(const hx *x) { return x->ops->outq(x); }

void hx_waiting(hx *x) {
  if (x->ops->waiting) x->ops->waiting(x);
}

char *hx_strdup(hx *x, const char *s, size_t n) {
  char *d;
  if (n < sizeof x->str_inl - x->str_used) {
    d = x->str_inl + x->str_used;
    x->str_used += n + 1;
  } else if (!(d = malloc(n + 1))) {
    return NULL;
  }
  memcpy(d, s, n);
  d[n] = 0;
  return d;
}

static void hx_str_free(hx *x, const char *s) {
  if (s && !(s >= x->str_inl && s < x->str_inl + sizeof x->str_inl)) free((char *)s);
}

int hx_add_header(hx *x, const char *name, size_t nlen, const char *value, size_t vlen) {
  if (x->nhdr >= HX_MAX_HEADERS) return -1;
  if (!x->hdr) {
    x->hdr = x->hdr_inl;
    x->caphdr = HX_INLINE_HEADERS;
  }
  if (x->nhdr == x->caphdr) {
    size_t cap = x->caphdr * 2;
    hx_header *h = x->hdr == x->hdr_inl ? malloc(cap * sizeof *h) : realloc(x->hdr, cap * sizeof *h);
    if (!h) return -1;
    if (x->hdr == x->hdr_inl) memcpy(h, x->hdr_inl, sizeof x->hdr_inl);
    x->hdr = h;
    x->caphdr = cap;
  }
  char *nm = hx_strdup(x, name, nlen);
  char *v = nm ? hx_strdup(x, value, vlen) : NULL;
  if (!v) {
    hx_str_free(x, nm);
    return -1;
  }
  if (!x->http2) /* HTTP/2 field names are lower case already (nghttp2 checks) */
    for (size_t i = 0; i < nlen; i++) {
      char c = nm[i];
      if (c >= 'A' && c <= 'Z') nm[i] = (char)(c + 32);
    }
  x->hdr[x->nhdr++] = (hx_header){nm, v, nlen};
  return 0;
}

int hx_copy_request(hx *dst, const hx *src) {
  if (src->method && !(dst->method = hx_strdup(dst, src->method, strlen(src->method)))) return -1;
  if (src->path && !(dst->path = hx_strdup(dst, src->path, strlen(src->path)))) return -1;
  if (src->query && !(dst->query = hx_strdup(dst, src->query, strlen(src->query)))) return -1;
  for (size_t i = 0; i < src->nhdr; i++) {
    const hx_header *h = &src->hdr[i];
    if (hx_add_header(dst, h->name, strlen(h->name), h->value, strlen(h->value)) != 0) return -1;
  }
  return 0;
}

void hx_bulk(hx *x) {
  if (x->bulk || x->ended || !x->sink || !x->sink->ops->bulk) return;
  x->bulk = 1;
  x->sink->ops->bulk(x->sink, 1);
}

void hx_free_request(hx *x) {
  if (x->bulk) {
    x->bulk = 0;
    x->sink->ops->bulk(x->sink, 0);
  }
  for (size_t i = 0; i < x->nhdr; i++) {
    hx_str_free(x, x->hdr[i].name);
    hx_str_free(x, x->hdr[i].value);
  }
  if (x->hdr != x->hdr_inl) free(x->hdr);
  x->hdr = NULL;
  x->nhdr = x->caphdr = 0;
  hx_str_free(x, x->method);
  hx_str_free(x, x->path);
  hx_str_free(x, x->query);
  x->method = x->path = x->query = NULL;
  x->str_used = 0;
}

int hx_room(hx *x, size_t n) {
  if (x->ended) return 0;
  return x->ops->room(x, n);
}

void hx_authed(hx *x) {
  if (!x->sink) return;
  x->sink->authed = 1;
  if (x->sink->ops->authed) x->sink->ops->authed(x->sink);
}
