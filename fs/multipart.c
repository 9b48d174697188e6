/* fs/multipart — see multipart.h.
 *
 * The delimiter is "\r\n--boundary"; the body's first one has no CRLF in
 * front, so the preamble starts as if the CRLF had been seen.  A boundary
 * holds no CR (RFC 2046's characters), so a mismatch after k matched bytes
 * cannot hide the start of another match among them: they are data, and
 * the byte that broke the match is looked at again. */
#include "fs/multipart.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "fs/query.h"
#include "proto/text.h"

static int mp_bchar(unsigned char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         strchr("'()+_,-./:=? ", c) != NULL;
}

/* A parameter's value in a header value: `name=token` or `name="quoted"`
 * (backslash escapes), matched as a whole parameter name.  The walk goes
 * from parameter to parameter over whole values, so a quoted value that
 * holds `;` or `name=` is never taken for parameters.  Returns a malloc'd
 * copy, or NULL when absent; *bad set when malformed. */
static char *mp_param(const char *v, const char *name, int *bad) {
  size_t nl = strlen(name);
  const char *p = v;
  for (;;) {
    int quoted = 0; /* to the next ';' outside a quoted string */
    while (*p && (quoted || *p != ';')) {
      if (quoted && *p == '\\' && p[1])
        p++;
      else if (*p == '"')
        quoted = !quoted;
      p++;
    }
    if (!*p) return NULL;
    p++;
    while (*p == ' ' || *p == '\t') p++;
    const char *n = p;
    while (*p && *p != '=' && *p != ';' && *p != ' ' && *p != '\t') p++;
    size_t len = (size_t)(p - n);
    while (*p == ' ' || *p == '\t') p++;
    if (*p != '=') continue;
    p++;
    while (*p == ' ' || *p == '\t') p++;
    if (len != nl || strncasecmp(n, name, nl) != 0) continue; /* its value is skipped above */
    const char *q = p;
    char *out = malloc(strlen(q) + 1);
    if (!out) {
      *bad = 1;
      return NULL;
    }
    size_t o = 0;
    if (*q == '"') {
      q++;
      while (*q && *q != '"') {
        if (*q == '\\' && q[1]) q++;
        out[o++] = *q++;
      }
      if (*q != '"') {
        free(out);
        *bad = 1;
        return NULL;
      }
    } else {
      while (*q && *q != ';' && *q != ' ' && *q != '\t') out[o++] = *q++;
    }
    out[o] = 0;
    return out;
  }
}

int fs_mp_init(fs_mp *m, const char *ct, char *err, size_t errlen) {
  memset(m, 0, sizeof *m);
  if (!ct || strncasecmp(ct, "multipart/form-data", 19) != 0) {
    snprintf(err, errlen, "invalid multipart body: not multipart/form-data");
    return -1;
  }
  int bad = 0;
  char *b = mp_param(ct, "boundary", &bad);
  size_t bl = b ? strlen(b) : 0;
  int ok = b && bl >= 1 && bl <= FS_MP_BOUNDARY_MAX && b[bl - 1] != ' ';
  for (size_t i = 0; ok && i < bl; i++) ok = mp_bchar((unsigned char)b[i]);
  if (!ok) {
    free(b);
    snprintf(err, errlen, "invalid multipart body: missing or invalid boundary");
    return -1;
  }
  memcpy(m->delim, "\r\n--", 4);
  memcpy(m->delim + 4, b, bl);
  m->dlen = bl + 4;
  free(b);
  m->state = MP_PREAMBLE;
  m->match = 2; /* the first delimiter has no CRLF in front */
  return 0;
}

void fs_mp_free(fs_mp *m) {
  free(m->filename);
  m->filename = NULL;
}

static fs_mp_event mp_fail(fs_mp *m, const char *why) {
  m->state = MP_FAILED;
  snprintf(m->err, sizeof m->err, "invalid multipart body: %s", why);
  return FS_MP_ERROR;
}

const char *fs_mp_basename(const char *f) {
  const char *b = f;
  for (const char *p = f; *p; p++)
    if (*p == '/' || *p == '\\') b = p + 1;
  if (!*b || strcmp(b, ".") == 0 || strcmp(b, "..") == 0) return NULL;
  return b;
}

/* The header line in m->line is complete. */
static fs_mp_event mp_header_line(fs_mp *m) {
  m->line[m->ll] = 0;
  if (++m->nheaders > FS_MP_HEADERS_MAX) return mp_fail(m, "too many part headers");
  const char *colon = memchr(m->line, ':', m->ll);
  if (!colon || memchr(m->line, 0, m->ll)) return mp_fail(m, "malformed part header");
  if ((size_t)(colon - m->line) != 19 || strncasecmp(m->line, "content-disposition", 19) != 0)
    return FS_MP_NEED; /* other headers do not matter */
  if (m->filename) return mp_fail(m, "two content-disposition headers");
  const char *v = colon + 1;
  while (*v == ' ' || *v == '\t') v++;
  if (strncasecmp(v, "form-data", 9) != 0) return mp_fail(m, "part is not form-data");
  int bad = 0;
  char *star = mp_param(v, "filename*", &bad);
  char *plain = mp_param(v, "filename", &bad);
  if (bad) {
    free(star);
    free(plain);
    return mp_fail(m, "malformed content-disposition");
  }
  if (star) { /* RFC 5987: UTF-8'lang'percent-encoded */
    const char *q = strchr(star, '\'');
    const char *r = q ? strchr(q + 1, '\'') : NULL;
    long n = -1;
    if (q && r && (size_t)(q - star) == 5 && strncasecmp(star, "UTF-8", 5) == 0) {
      char *dec = malloc(strlen(r + 1) + 1);
      if (dec && (n = fs_percent_decode(r + 1, strlen(r + 1), dec)) >= 0) {
        dec[n] = 0;
        if (memchr(dec, 0, (size_t)n)) dec[0] = 0, n = 0; /* a NUL: no valid name */
        free(plain);
        plain = dec;
      } else {
        free(dec);
      }
    }
    free(star);
    if (n < 0) {
      free(plain);
      return mp_fail(m, "malformed filename*");
    }
  }
  if (plain && !text_utf8_valid(plain, strlen(plain))) {
    free(plain);
    return mp_fail(m, "file name is not valid UTF-8");
  }
  m->filename = plain ? plain : strdup(""); /* a file part, named or not (the caller checks) */
  if (!m->filename) return mp_fail(m, "out of memory");
  if (!plain) {
    free(m->filename);
    m->filename = NULL; /* a plain field: not a file */
  }
  return FS_MP_NEED;
}

fs_mp_event fs_mp_next(fs_mp *m, const uint8_t *p, size_t n, size_t *used, const uint8_t **data,
                       size_t *len) {
  size_t i = 0;
  fs_mp_event ev = FS_MP_NEED;
  while (i < n && ev == FS_MP_NEED) {
    switch (m->state) {
      case MP_PREAMBLE:
      case MP_BODY: {
        if (m->match == 0) { /* fast path: data up to the next CR */
          const uint8_t *cr = memchr(p + i, '\r', n - i);
          size_t run = cr ? (size_t)(cr - (p + i)) : n - i;
          if (run) {
            size_t at = i;
            i += run;
            if (m->state == MP_BODY && m->in_part) {
              *data = p + at;
              *len = run;
              ev = FS_MP_DATA;
            }
            break;
          }
        }
        if (p[i] == (uint8_t)m->delim[m->match]) {
          i++;
          if (++m->match == m->dlen) {
            m->match = 0;
            m->state = MP_AFTER_DELIM;
            m->dashes = 0;
            m->lwsp = 0;
            if (m->in_part) {
              m->in_part = 0;
              ev = FS_MP_PART_END;
            }
          }
          break;
        }
        /* a mismatch: what was held back is data; p[i] is looked at again */
        size_t k = m->match;
        m->match = 0;
        if (m->state == MP_BODY && m->in_part && k) {
          *data = (const uint8_t *)m->delim;
          *len = k;
          ev = FS_MP_DATA;
        } else if (m->state == MP_PREAMBLE && k == 0) {
          i++; /* a CR that starts nothing */
        }
        if (k == 0 && m->state == MP_BODY) { /* a lone CR that is data */
          i++;
          if (m->in_part) {
            *data = p + i - 1;
            *len = 1;
            ev = FS_MP_DATA;
          }
        }
        break;
      }
      case MP_AFTER_DELIM: {
        uint8_t c = p[i++];
        if (m->dashes == 1) {
          if (c != '-') return *used = i, mp_fail(m, "malformed delimiter");
          m->state = MP_DONE;
          ev = FS_MP_END;
        } else if (c == '-' && !m->lwsp) {
          m->dashes = 1;
        } else if (c == ' ' || c == '\t') {
          m->lwsp = 1;
        } else if (c == '\r') {
          m->cr = 1;
        } else if (c == '\n' && m->cr) {
          m->cr = 0;
          if (++m->nparts > FS_MP_PARTS_MAX) return *used = i, mp_fail(m, "too many parts");
          m->state = MP_HEADER;
          m->ll = 0;
          m->nheaders = 0;
          free(m->filename);
          m->filename = NULL;
        } else {
          return *used = i, mp_fail(m, "malformed delimiter");
        }
        if (m->cr && c != '\r') return *used = i, mp_fail(m, "malformed delimiter");
        break;
      }
      case MP_HEADER: {
        uint8_t c = p[i++];
        if (m->cr) {
          m->cr = 0;
          if (c != '\n') return *used = i, mp_fail(m, "malformed part header");
          if (m->ll == 0) { /* the empty line: the part's data follows */
            m->state = MP_BODY;
            m->match = 0;
            m->in_part = 1;
            ev = FS_MP_PART;
            break;
          }
          ev = mp_header_line(m);
          m->ll = 0;
          break;
        }
        if (c == '\r') {
          m->cr = 1;
        } else {
          if (m->ll + 1 >= sizeof m->line) return *used = i, mp_fail(m, "part header too long");
          m->line[m->ll++] = (char)c;
        }
        break;
      }
      case MP_DONE:
        i = n; /* the epilogue is ignored */
        break;
      case MP_FAILED:
        *used = i;
        return FS_MP_ERROR;
    }
  }
  *used = i;
  return ev;
}
