/* gzip — see gzip.h. */
#include "proto/gzip.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

gz_result gz_inflate(const uint8_t *in, size_t n, size_t max, uint8_t **out, size_t *olen) {
  z_stream z = {0};
  int ir = inflateInit2(&z, 16 + MAX_WBITS);
  if (ir != Z_OK) return ir == Z_MEM_ERROR ? GZ_NOMEM : GZ_BAD;
  /* a first guess that fits most messages, so that they need no regrowth */
  size_t cap = n * 4 + 1024, len = 0;
  if (cap > max + 1) cap = max + 1;
  uint8_t *b = malloc(cap);
  z.next_in = (Bytef *)in;
  z.avail_in = (uInt)n;
  int r = Z_OK;
  while (b) {
    z.next_out = b + len;
    z.avail_out = (uInt)(cap - len);
    r = inflate(&z, Z_NO_FLUSH);
    len = cap - z.avail_out;
    if (r == Z_STREAM_END && z.avail_in > 0) { /* another gzip member follows */
      if (inflateReset(&z) != Z_OK) break;
      r = Z_OK;
      if (z.avail_out) continue;
    }
    if (r == Z_STREAM_END) break;
    if (r != Z_OK && r != Z_BUF_ERROR) break;
    if (z.avail_out != 0) { /* input exhausted without stream end */
      r = Z_DATA_ERROR;
      break;
    }
    if (cap > max) {
      inflateEnd(&z);
      free(b);
      return GZ_TOO_BIG;
    }
    size_t nc = cap * 2 > max + 1 ? max + 1 : cap * 2;
    uint8_t *q = realloc(b, nc);
    if (!q) {
      r = Z_MEM_ERROR;
      break;
    }
    b = q;
    cap = nc;
  }
  inflateEnd(&z);
  if (b && r == Z_STREAM_END && len > max) { /* exactly filled the max + 1 guard byte */
    free(b);
    return GZ_TOO_BIG;
  }
  if (!b || r != Z_STREAM_END) {
    free(b);
    return !b || r == Z_MEM_ERROR ? GZ_NOMEM : GZ_BAD;
  }
  *out = b;
  *olen = len;
  return GZ_OK;
}

uint8_t *gz_deflate(const uint8_t *a, size_t an, const uint8_t *b, size_t bn, size_t head,
                    int level, size_t *olen) {
  z_stream z = {0};
  int ir = deflateInit2(&z, level, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  if (ir != Z_OK) return NULL;
  /* a guess for text-like answers (deflateBound's worst case would hold
   * 16 MiB for a 16 MiB answer); grown when it must */
  size_t cap = head + (an + bn) / 4 + 1024, len = head;
  uint8_t *out = malloc(cap);
  const uint8_t *part[2] = {a, b ? b : a};
  size_t plen[2] = {an, b ? bn : 0};
  int r = Z_OK;
  for (int i = 0; i < 2 && out; i++) {
    int flush = i == 1 ? Z_FINISH : Z_NO_FLUSH;
    z.next_in = (Bytef *)part[i];
    z.avail_in = (uInt)plen[i];
    while (out) {
      if (len == cap) {
        uint8_t *q = realloc(out, cap * 2);
        if (!q) {
          free(out);
          out = NULL;
          break;
        }
        out = q;
        cap *= 2;
      }
      z.next_out = out + len;
      z.avail_out = (uInt)(cap - len);
      r = deflate(&z, flush);
      len = cap - z.avail_out;
      if (r == Z_STREAM_END || r == Z_STREAM_ERROR) break;
      if (flush == Z_NO_FLUSH && z.avail_in == 0) break; /* this part is in */
    }
  }
  deflateEnd(&z);
  if (out && r != Z_STREAM_END) {
    free(out);
    out = NULL;
  }
  if (out) *olen = len - head;
  return out;
}

/* "q=0", "q=0.0", "q=0.000": the client refuses it (RFC 9110 §12.4.2) */
static int q_zero(const char *p, const char *end) {
  while (p < end && (*p == ' ' || *p == '\t')) p++;
  if (end - p < 3 || (p[0] != 'q' && p[0] != 'Q') || p[1] != '=') return 0;
  p += 2;
  if (*p != '0') return 0;
  for (p++; p < end && *p != ';'; p++)
    if (*p != '.' && *p != '0' && *p != ' ' && *p != '\t') return 0;
  return 1;
}

int gz_accepted(const char *v) {
  if (!v) return 0;
  while (*v) {
    const char *e = strchr(v, ',');
    if (!e) e = v + strlen(v);
    const char *t = v;
    while (t < e && (*t == ' ' || *t == '\t')) t++;
    const char *te = t;
    while (te < e && *te != ';' && *te != ' ' && *te != '\t') te++;
    if (te - t == 4 && strncasecmp(t, "gzip", 4) == 0) {
      const char *sc = memchr(te, ';', (size_t)(e - te));
      int refused = 0;
      while (sc && !refused) {
        refused = q_zero(sc + 1, e);
        sc = memchr(sc + 1, ';', (size_t)(e - sc - 1));
      }
      if (!refused) return 1;
    }
    v = *e ? e + 1 : e;
  }
  return 0;
}

struct gz_stream {
  z_stream z;
  int encode;
  int ended; /* decoder: the last member ended (more input starts another) */
  uint8_t out[GZ_STREAM_OUT];
};

gz_stream *gz_stream_new(int encode, int level) {
  gz_stream *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->encode = encode;
  int r = encode ? deflateInit2(&g->z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY)
                 : inflateInit2(&g->z, 15 + 16);
  if (r != Z_OK) {
    free(g);
    return NULL;
  }
  return g;
}

void gz_stream_free(gz_stream *g) {
  if (!g) return;
  if (g->encode) deflateEnd(&g->z);
  else inflateEnd(&g->z);
  free(g);
}

gz_result gz_stream_feed(gz_stream *g, const uint8_t *in, size_t n, int finish, gz_sink sink, void *arg) {
  g->z.next_in = (Bytef *)in;
  g->z.avail_in = (uInt)n;
  for (;;) {
    g->z.next_out = g->out;
    g->z.avail_out = sizeof g->out;
    int r;
    if (g->encode) {
      r = deflate(&g->z, finish ? Z_FINISH : Z_NO_FLUSH);
      if (r == Z_STREAM_ERROR) return GZ_BAD;
    } else {
      if (g->ended && g->z.avail_in) { /* another member */
        if (inflateReset(&g->z) != Z_OK) return GZ_BAD;
        g->ended = 0;
      }
      r = g->ended ? Z_BUF_ERROR : inflate(&g->z, Z_NO_FLUSH); /* may have output pending */
      if (r == Z_STREAM_END) g->ended = 1;
      else if (r == Z_MEM_ERROR) return GZ_NOMEM;
      else if (r != Z_OK && r != Z_BUF_ERROR) return GZ_BAD;
    }
    size_t made = sizeof g->out - g->z.avail_out;
    if (made && sink(arg, g->out, made) != 0) return GZ_TOO_BIG;
    if (g->encode) {
      if (finish ? r == Z_STREAM_END : (g->z.avail_in == 0 && g->z.avail_out != 0)) return GZ_OK;
    } else if (g->z.avail_in == 0 && g->z.avail_out != 0) {
      return finish && !g->ended ? GZ_BAD : GZ_OK;
    }
  }
}
