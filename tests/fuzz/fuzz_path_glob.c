/* fuzz_path_glob — FileService path checks and the SearchFiles glob.
 * Input: pattern NUL name.  Properties: a path is accepted exactly when it
 * is clean; a valid pattern never reports a syntax error while matching;
 * a pattern without metacharacters matches only itself; "*" matches
 * exactly the names without '/'. */
#include <stdlib.h>
#include <string.h>

#include "fs/glob.h"
#include "fs/path.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *s = (const char *)data;
  const char *nul = memchr(s, 0, size);
  size_t plen = nul ? (size_t)(nul - s) : size;
  const char *name = nul ? nul + 1 : "";
  size_t nlen = nul ? size - plen - 1 : 0;
  char err[256];
  int ok = fs_path_check(s, size, "stat", err, sizeof err) == 0;
  FUZZ_CHECK(ok == (size > 0 && !nul && fs_path_is_clean(s, size)));
  if (ok) { /* the helpers take C strings */
    char *c = strndup(s, size);
    size_t dl = fs_path_dir_len(c);
    FUZZ_CHECK(dl >= 1 && dl <= size);
    FUZZ_CHECK(strlen(fs_path_base(c)) <= size);
    free(c);
  }
  if (fs_glob_valid(s, plen)) {
    int m = fs_glob_match(s, plen, name, nlen);
    FUZZ_CHECK(m == 0 || m == 1);
    if (!memchr(s, '*', plen) && !memchr(s, '?', plen) && !memchr(s, '[', plen) && !memchr(s, '\\', plen))
      FUZZ_CHECK(m == (plen == nlen && memcmp(s, name, plen) == 0));
  }
  FUZZ_CHECK(fs_glob_match("*", 1, name, nlen) == (memchr(name, '/', nlen) == NULL));
  return 0;
}
