/* fuzz_query — the /files query string (fs/query.c).  Properties: a query
 * that parses gives values that are valid UTF-8 (the path's length counts
 * a NUL it holds); percent-encoding the decoded path and parsing that
 * again gives the same bytes; fs_percent_decode never writes more bytes
 * than it reads and decodes any %XX-encoded input back to its bytes. */
#include <string.h>

#include "fs/query.h"
#include "proto/text.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *q = malloc(size + 1);
  FUZZ_CHECK(q != NULL);
  memcpy(q, data, size);
  q[size] = 0;
  fs_query fq;
  char err[200];
  if (fs_query_parse(q, &fq, err, sizeof err) == 0) {
    if (fq.path) {
      FUZZ_CHECK(text_utf8_valid(fq.path, fq.path_len));
      FUZZ_CHECK(fq.path_len >= strlen(fq.path));
      char *enc = malloc(fq.path_len * 3 + 8), *p = enc;
      FUZZ_CHECK(enc != NULL);
      p += sprintf(p, "path=");
      for (size_t i = 0; i < fq.path_len; i++) p += sprintf(p, "%%%02X", (unsigned char)fq.path[i]);
      fs_query f2;
      FUZZ_CHECK(fs_query_parse(enc, &f2, err, sizeof err) == 0);
      FUZZ_CHECK(f2.path_len == fq.path_len && memcmp(f2.path, fq.path, fq.path_len) == 0);
      fs_query_free(&f2);
      free(enc);
    }
    if (fq.username) FUZZ_CHECK(text_utf8_valid(fq.username, strlen(fq.username)));
    fs_query_free(&fq);
  } else {
    FUZZ_CHECK(strncmp(err, "invalid query: ", 15) == 0 || strcmp(err, "out of memory") == 0);
  }
  /* raw bytes percent-encoded decode back to themselves */
  char *enc = malloc(size * 3 + 1), *dec = malloc(size * 3 + 1);
  FUZZ_CHECK(enc && dec);
  for (size_t i = 0; i < size; i++) sprintf(enc + 3 * i, "%%%02x", data[i]);
  FUZZ_CHECK(fs_percent_decode(enc, size * 3, dec) == (long)size);
  FUZZ_CHECK(size == 0 || memcmp(dec, data, size) == 0);
  long r = fs_percent_decode(q, size, dec);
  FUZZ_CHECK(r <= (long)size);
  free(enc);
  free(dec);
  free(q);
  return 0;
}
