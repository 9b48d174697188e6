/* fuzz_gunzip — request decompression (proto/gzip.c) under a limit chosen
 * by the first byte.  Properties: the output never passes the limit; what
 * inflates, deflated again, inflates to the same bytes; the input itself
 * survives deflate → inflate. */
#include <string.h>

#include "proto/gzip.h"
#include "fuzz.h"

static void round_trip(const uint8_t *p, size_t n) {
  size_t zl, ol;
  uint8_t *z = gz_deflate(p, n / 3, p + n / 3, n - n / 3, 5, 1 + (int)(n % 9), &zl);
  FUZZ_CHECK(z != NULL);
  uint8_t *o = NULL;
  FUZZ_CHECK(gz_inflate(z + 5, zl, n, &o, &ol) == GZ_OK);
  FUZZ_CHECK(ol == n && (n == 0 || memcmp(o, p, n) == 0));
  free(o);
  free(z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  size_t max = (size_t)data[0] * 4096;
  uint8_t *out = NULL;
  size_t ol = 0;
  gz_result r = gz_inflate(data + 1, size - 1, max, &out, &ol);
  FUZZ_CHECK(r == GZ_OK || out == NULL);
  if (r == GZ_OK) {
    FUZZ_CHECK(ol <= max);
    round_trip(out, ol);
    free(out);
  }
  round_trip(data + 1, size - 1);
  return 0;
}
