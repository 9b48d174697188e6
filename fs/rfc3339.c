/* fs/rfc3339 — UTC timestamps; see rfc3339.h.
 *
 * Hand-formatted: gmtime_r takes glibc's time-zone lock and snprintf is
 * most of the cost of a one-file ListFiles.  Days to a civil date is the
 * usual era arithmetic (400-year eras of 146097 days, years starting on
 * 1 March so the leap day is last), over the whole time_t range. */
#include "fs/rfc3339.h"
#include "proto/text.h"

#include <stdint.h>
#include <string.h>

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

static char *put2(char *p, int v) {
  p[0] = (char)('0' + v / 10);
  p[1] = (char)('0' + v % 10);
  return p + 2;
}

/* Year as Go prints it: at least four digits, '-' before negative years. */
static char *put_year(char *p, int64_t y) {
  char tmp[24], *end = tmp + sizeof tmp;
  char *d = text_u64_dec(end, y < 0 ? (uint64_t)0 - (uint64_t)y : (uint64_t)y);
  while (end - d < 4) *--d = '0';
  if (y < 0) *p++ = '-';
  memcpy(p, d, (size_t)(end - d));
  return p + (end - d);
}

size_t fs_rfc3339(time_t t, char *out, size_t outlen) {
  if (outlen == 0) return 0;
  out[0] = 0;
  int64_t days = (int64_t)t / 86400, secs = (int64_t)t % 86400;
  if (secs < 0) { /* no overflow even at INT64_MIN */
    secs += 86400;
    days--;
  }
  /* civil date of `days` since 1970-01-01 */
  int64_t z = days + 719468; /* days since 0000-03-01 */
  int64_t era = floor_div(z, 146097);
  int64_t doe = z - era * 146097;                                      /* [0, 146096] */
  int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; /* [0, 399] */
  int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);               /* [0, 365] */
  int64_t mp = (5 * doy + 2) / 153;                                    /* March = 0 */
  int mday = (int)(doy - (153 * mp + 2) / 5 + 1);
  int mon = (int)(mp < 10 ? mp + 3 : mp - 9);
  int64_t year = yoe + era * 400 + (mon <= 2);

  char b[FS_RFC3339_MAX + 8], *p = put_year(b, year);
  *p++ = '-';
  p = put2(p, mon);
  *p++ = '-';
  p = put2(p, mday);
  *p++ = 'T';
  p = put2(p, (int)(secs / 3600));
  *p++ = ':';
  p = put2(p, (int)(secs / 60 % 60));
  *p++ = ':';
  p = put2(p, (int)(secs % 60));
  *p++ = 'Z';
  size_t n = (size_t)(p - b);
  if (n >= outlen) return 0;
  memcpy(out, b, n);
  out[n] = 0;
  return n;
}
