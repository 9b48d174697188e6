/* layers — pmem selection and overlay options; see layers.h. */
#include "init/layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int layers_pmem_index(const char *name, unsigned *idx) {
  if (strncmp(name, "pmem", 4) != 0) return 0;
  const char *d = name + 4;
  size_t len = strlen(d);
  if (len == 0 || len > 5) return 0;
  if (d[0] == '0' && len > 1) return 0;
  unsigned v = 0;
  for (size_t i = 0; i < len; i++) {
    if (d[i] < '0' || d[i] > '9') return 0;
    v = v * 10 + (unsigned)(d[i] - '0');
  }
  if (v > LAYERS_PMEM_MAX_INDEX) return 0;
  *idx = v;
  return 1;
}

static int cmp_uint(const void *a, const void *b) {
  unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
  return x < y ? -1 : x > y;
}

size_t layers_pmem_select(const char *const *names, size_t n, unsigned *idx, size_t max) {
  size_t cnt = 0;
  for (size_t i = 0; i < n && cnt < max; i++) {
    unsigned v;
    if (!layers_pmem_index(names[i], &v)) continue;
    size_t j;
    for (j = 0; j < cnt; j++)
      if (idx[j] == v) break;
    if (j == cnt) idx[cnt++] = v;
  }
  qsort(idx, cnt, sizeof *idx, cmp_uint);
  return cnt;
}

static int path_ok(const char *p) { return strpbrk(p, ":,") == NULL; }

int layers_overlay_opts(char *out, size_t outlen, const char *const *lower, size_t nlower,
                        const char *upper, const char *work) {
  if (nlower == 0 || !path_ok(upper) || !path_ok(work)) return -1;
  size_t off = 0;
  int w = snprintf(out, outlen, "lowerdir=");
  if (w < 0 || (size_t)w >= outlen) return -1;
  off = (size_t)w;
  for (size_t i = 0; i < nlower; i++) {
    if (!path_ok(lower[i])) return -1;
    w = snprintf(out + off, outlen - off, "%s%s", i ? ":" : "", lower[i]);
    if (w < 0 || (size_t)w >= outlen - off) return -1;
    off += (size_t)w;
  }
  w = snprintf(out + off, outlen - off, ",upperdir=%s,workdir=%s", upper, work);
  if (w < 0 || (size_t)w >= outlen - off) return -1;
  return 0;
}
