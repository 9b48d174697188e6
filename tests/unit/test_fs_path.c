/* Unit tests: fs/path — remote path validation (api.md §7). */
#include "tests/unit/test.h"

#include "fs/path.h"

static const char *check(const char *p, size_t len, const char *op) {
  static char err[256];
  err[0] = 0;
  if (fs_path_check(p, len, op, err, sizeof err) == 0) return "OK";
  return err;
}
#define CHECK(s, op) check(s, sizeof(s) - 1, op)

TEST(accepted) {
  const char *ok[] = {"/", "/etc/passwd", "/workspace/a/b.txt", "/a", "/.a", "/..a", "/a..",
                      "/a/.b/c..", "/tmp/conch-doc-api/remote.txt", "/a b/c\\d", "/...",
                      "/\xe4\xb8\xad\xe6\x96\x87"};
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    ASSERT_STR_EQ(check(ok[i], strlen(ok[i]), "list files"), "OK");
    ASSERT_EQ(fs_path_is_clean(ok[i], strlen(ok[i])), 1);
  }
}

TEST(rejected_not_clean) {
  const char *bad[] = {"etc/passwd", "../x", "/a/../b", "/../a", "/a/./b", "/a//b", "/a/",
                       ".",          "..",   "/.",      "/..",   "//",     "//a",   "/a/.",
                       "/a/..",      "a",    " /a",     "./a",   "/a/b/",  "///"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ASSERT_STR_EQ(check(bad[i], strlen(bad[i]), "stream upload"),
                  "filepath must be a normalized absolute guest path for stream upload");
    ASSERT_EQ(fs_path_is_clean(bad[i], strlen(bad[i])), 0);
  }
}

TEST(required_and_nul) {
  ASSERT_STR_EQ(check("", 0, "stream file retrieval"),
                "filepath is required for stream file retrieval");
  ASSERT_STR_EQ(CHECK("/a\0b", "search files"), "filepath contains a NUL byte for search files");
  /* NUL is checked before normalization */
  ASSERT_STR_EQ(CHECK("a/../\0", "list files"), "filepath contains a NUL byte for list files");
  ASSERT_STR_EQ(CHECK("\0", "list files"), "filepath contains a NUL byte for list files");
}

TEST(ops_in_text) {
  const char *ops[] = {"stream upload", "stream file retrieval", "list files", "search files"};
  char want[128];
  for (size_t i = 0; i < 4; i++) {
    snprintf(want, sizeof want, "filepath must be a normalized absolute guest path for %s", ops[i]);
    ASSERT_STR_EQ(CHECK("x", ops[i]), want);
  }
}

TEST(err_truncation_safe) {
  char err[8];
  ASSERT_EQ(fs_path_check("x", 1, "list files", err, sizeof err), -1);
  ASSERT_EQ(strlen(err), 7);
}

TEST(base_and_dir) {
  ASSERT_STR_EQ(fs_path_base("/"), "/");
  ASSERT_STR_EQ(fs_path_base("/a"), "a");
  ASSERT_STR_EQ(fs_path_base("/a/bc.txt"), "bc.txt");
  ASSERT_EQ(fs_path_dir_len("/"), 1);
  ASSERT_EQ(fs_path_dir_len("/a"), 1);
  ASSERT_EQ(fs_path_dir_len("/a/b"), 2);
  ASSERT_EQ(fs_path_dir_len("/abc/de/f"), 7);
}

int main(void) {
  RUN(accepted);
  RUN(rejected_not_clean);
  RUN(required_and_nul);
  RUN(ops_in_text);
  RUN(err_truncation_safe);
  RUN(base_and_dir);
  return test_summary();
}
