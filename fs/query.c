/* fs/query — see query.h. */
#include "fs/query.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/text.h"

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

long fs_percent_decode(const char *s, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '+') {
      out[o++] = ' ';
    } else if (s[i] == '%') {
      int hi = i + 1 < n ? hexval(s[i + 1]) : -1;
      int lo = i + 2 < n ? hexval(s[i + 2]) : -1;
      if (hi < 0 || lo < 0) return -1;
      out[o++] = (char)(hi << 4 | lo);
      i += 2;
    } else {
      out[o++] = s[i];
    }
  }
  return (long)o;
}

void fs_query_free(fs_query *q) {
  free(q->path);
  free(q->username);
  free(q->expires);
  free(q->signature);
  memset(q, 0, sizeof *q);
}

int fs_query_parse(const char *q, fs_query *out, char *err, size_t errlen) {
  memset(out, 0, sizeof *out);
  if (!q) return 0;
  size_t qn = strlen(q);
  if (qn > FS_QUERY_MAX) {
    snprintf(err, errlen, "invalid query: longer than %u bytes", FS_QUERY_MAX);
    return -1;
  }
  const char *p = q, *end = q + qn;
  while (p < end) {
    const char *amp = memchr(p, '&', (size_t)(end - p));
    if (!amp) amp = end;
    const char *eq = memchr(p, '=', (size_t)(amp - p));
    const char *v = eq ? eq + 1 : amp;
    size_t kl = (size_t)((eq ? eq : amp) - p), vl = (size_t)(amp - v);
    char key[16];
    long k = kl < sizeof key ? fs_percent_decode(p, kl, key) : -2;
    char **slot = NULL;
    const char *name = NULL;
    if (k >= 0) {
      static const char *const names[] = {"path", "username", "expires", "signature"};
      char **slots[] = {&out->path, &out->username, &out->expires, &out->signature};
      for (size_t i = 0; i < 4; i++)
        if ((size_t)k == strlen(names[i]) && memcmp(key, names[i], (size_t)k) == 0) {
          slot = slots[i];
          name = names[i];
        }
    }
    if (k == -1) {
      snprintf(err, errlen, "invalid query: bad percent-encoding");
      goto fail;
    }
    if (slot) {
      if (*slot) {
        snprintf(err, errlen, "invalid query: %s given more than once", name);
        goto fail;
      }
      char *d = malloc(vl + 1);
      if (!d) {
        snprintf(err, errlen, "out of memory");
        goto fail;
      }
      long dl = fs_percent_decode(v, vl, d);
      if (dl < 0) {
        free(d);
        snprintf(err, errlen, "invalid query: bad percent-encoding in %s", name);
        goto fail;
      }
      d[dl] = 0;
      if (!text_utf8_valid(d, (size_t)dl)) {
        free(d);
        snprintf(err, errlen, "invalid query: %s is not valid UTF-8", name);
        goto fail;
      }
      *slot = d;
      if (slot == &out->path) out->path_len = (size_t)dl;
    }
    p = amp + 1;
  }
  return 0;
fail:
  fs_query_free(out);
  return -1;
}
