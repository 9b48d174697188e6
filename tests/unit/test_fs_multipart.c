/* Unit tests: fs/multipart — parameters of a part's Content-Disposition. */
#include "tests/unit/test.h"

#include <stdlib.h>
#include <string.h>

#include "fs/multipart.h"

/* The file name the parser gives for one part with this disposition:
 * "" when the part is not a file, "!" when the body was an error. */
static char *part_name(const char *disp) {
  static char got[256];
  fs_mp m;
  char err[128];
  if (fs_mp_init(&m, "multipart/form-data; boundary=\"B x\"", err, sizeof err) != 0) return strcpy(got, "init");
  char body[1024];
  snprintf(body, sizeof body, "--B x\r\nContent-Disposition: %s\r\n\r\ndata\r\n--B x--\r\n", disp);
  const uint8_t *p = (const uint8_t *)body, *d;
  size_t n = strlen(body), used, dl;
  strcpy(got, "?");
  for (;;) {
    fs_mp_event ev = fs_mp_next(&m, p, n, &used, &d, &dl);
    p += used;
    n -= used;
    if (ev == FS_MP_PART) {
      snprintf(got, sizeof got, "%s", m.filename ? m.filename : "");
      break;
    }
    if (ev == FS_MP_ERROR || ev == FS_MP_NEED || ev == FS_MP_END) {
      strcpy(got, "!");
      break;
    }
  }
  fs_mp_free(&m);
  return got;
}

TEST(quoted_parameters_are_whole) {
  ASSERT_STR_EQ(part_name("form-data; name=\"a; filename=inject\"; filename=\"real.txt\""), "real.txt");
  ASSERT_STR_EQ(part_name("form-data; name=\"a; filename=inject\""), "");
  ASSERT_STR_EQ(part_name("form-data; name=\"a\\\"; filename=inject\"; filename=r"), "r");
  ASSERT_STR_EQ(part_name("form-data; name=\"x\"; filename=\"a\\\"b;c.txt\""), "a\"b;c.txt");
  ASSERT_STR_EQ(part_name("form-data; name=f; filename=plain.txt"), "plain.txt");
  ASSERT_STR_EQ(part_name("form-data; name=\"f\"; FileName = \"sp.txt\""), "sp.txt");
  ASSERT_STR_EQ(part_name("form-data; xfilename=\"no\"; name=f"), "");
  ASSERT_STR_EQ(part_name("form-data; name=\"f\"; filename*=UTF-8''%C3%A9.txt; filename=\"e.txt\""),
                "\xc3\xa9.txt");
  ASSERT_STR_EQ(part_name("form-data; name=\"f\"; filename=\"open"), "!");
}

int main(void) {
  RUN(quoted_parameters_are_whole);
  return test_summary();
}
