/* fs/rfc3339 — UTC timestamps; see rfc3339.h. */
#include "fs/rfc3339.h"

#include <stdio.h>

size_t fs_rfc3339(time_t t, char *out, size_t outlen) {
  struct tm tm;
  if (outlen == 0) return 0;
  out[0] = 0;
  if (!gmtime_r(&t, &tm)) return 0;
  long long year = (long long)tm.tm_year + 1900;
  int n = snprintf(out, outlen, "%04lld-%02d-%02dT%02d:%02d:%02dZ", year, tm.tm_mon + 1,
                   tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
  if (n < 0 || (size_t)n >= outlen) {
    out[0] = 0;
    return 0;
  }
  return (size_t)n;
}
