/* fs/httphdr — see httphdr.h. */
#include "fs/httphdr.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* RFC 9110 IMF-fixdate */
void fs_http_date(time_t t, char out[40]) {
  struct tm tm;
  gmtime_r(&t, &tm);
  static const char *const days[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static const char *const mons[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                     "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  snprintf(out, 40, "%s, %02d %s %04d %02d:%02d:%02d GMT", days[tm.tm_wday], tm.tm_mday,
           mons[tm.tm_mon], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* An IMF-fixdate; -1 when it is not one. */
int64_t fs_http_parse_date(const char *s) {
  static const char mons[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
  char wd[4], mon[4];
  int d, y, H, M, S, n = 0;
  if (!s || sscanf(s, "%3s, %d %3s %d %d:%d:%d GMT%n", wd, &d, mon, &y, &H, &M, &S, &n) != 7 || !n ||
      s[n] != 0)
    return -1;
  const char *m = strstr(mons, mon);
  if (!m || (m - mons) % 3 || strlen(mon) != 3) return -1;
  struct tm tm = {.tm_sec = S, .tm_min = M, .tm_hour = H, .tm_mday = d, .tm_mon = (int)(m - mons) / 3,
                  .tm_year = y - 1900};
  return (int64_t)timegm(&tm);
}

/* Does the If-None-Match list name etag (weak comparison)? */
int fs_http_etag_listed(const char *list, const char *etag) {
  size_t el = strlen(etag);
  const char *p = list;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    if (*p == '*') return 1;
    if (p[0] == 'W' && p[1] == '/') p += 2;
    if (strncmp(p, etag, el) == 0 && (p[el] == 0 || p[el] == ',' || p[el] == ' ' || p[el] == '\t'))
      return 1;
    while (*p && *p != ',') p++;
  }
  return 0;
}

/* Content-Disposition (RFC 6266): an ASCII filename, and filename* when
 * the name is not plain ASCII. */
char *fs_http_disposition(const char *name) {
  size_t n = strlen(name);
  char *out = malloc(n * 4 + 64);
  if (!out) return NULL;
  int plain = 1;
  char *o = out + sprintf(out, "attachment; filename=\"");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)name[i];
    if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '%') {
      plain = plain && c >= 0x20 && c < 0x7f && c != '%' ? plain : 0;
      *o++ = '_';
    } else {
      *o++ = (char)c;
    }
  }
  *o++ = '"';
  if (!plain) {
    o += sprintf(o, "; filename*=UTF-8''");
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)name[i];
      if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
          strchr("!#$&+-.^_`|~", c))
        *o++ = (char)c;
      else
        o += sprintf(o, "%%%02X", c);
    }
  }
  *o = 0;
  return out;
}


/* One byte range of size bytes: `a-b`, `a-` or `-n`.  NONE for a header
 * that is absent, malformed or names several ranges (the whole file). */
fs_http_rng fs_http_range(const char *v, uint64_t size, uint64_t *a, uint64_t *b) {
  if (!v || strncmp(v, "bytes=", 6) != 0 || strchr(v, ',')) return FS_RANGE_NONE;
  const char *p = v + 6;
  while (*p == ' ') p++;
  char *e;
  if (*p == '-') {
    if (p[1] < '0' || p[1] > '9') return FS_RANGE_NONE;
    errno = 0;
    unsigned long long k = strtoull(p + 1, &e, 10);
    if (errno || *e) return FS_RANGE_NONE;
    if (k == 0 || size == 0) return FS_RANGE_BAD;
    *a = k >= size ? 0 : size - k;
    *b = size - 1;
    return FS_RANGE_OK;
  }
  if (*p < '0' || *p > '9') return FS_RANGE_NONE;
  errno = 0;
  unsigned long long x = strtoull(p, &e, 10);
  if (errno || *e != '-') return FS_RANGE_NONE;
  p = e + 1;
  unsigned long long y = UINT64_MAX;
  if (*p) {
    if (*p < '0' || *p > '9') return FS_RANGE_NONE;
    y = strtoull(p, &e, 10);
    if (errno || *e || y < x) return FS_RANGE_NONE;
  }
  if (x >= size) return FS_RANGE_BAD;
  *a = x;
  *b = y >= size ? size - 1 : y;
  return FS_RANGE_OK;
}

