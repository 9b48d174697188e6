/* Unit tests: fs/glob — Go path.Match table plus SearchFiles cases. */
#include "tests/unit/test.h"

#include <stdlib.h>
#include <time.h>

#include "fs/glob.h"

typedef struct {
  const char *pat, *name;
  int match; /* 1 / 0; -1 = bad pattern */
} glob_case;

/* Go's path/match_test.go table (semantics we must share). */
static const glob_case go_table[] = {
    {"abc", "abc", 1},
    {"*", "abc", 1},
    {"*c", "abc", 1},
    {"a*", "a", 1},
    {"a*", "abc", 1},
    {"a*", "ab/c", 0},
    {"a*/b", "abc/b", 1},
    {"a*/b", "a/c/b", 0},
    {"a*b*c*d*e*/f", "axbxcxdxe/f", 1},
    {"a*b*c*d*e*/f", "axbxcxdxexxx/f", 1},
    {"a*b*c*d*e*/f", "axbxcxdxe/xxx/f", 0},
    {"a*b*c*d*e*/f", "axbxcxdxexxx/fff", 0},
    {"a*b?c*x", "abxbbxdbxebxczzx", 1},
    {"a*b?c*x", "abxbbxdbxebxczzy", 0},
    {"ab[c]", "abc", 1},
    {"ab[b-d]", "abc", 1},
    {"ab[e-g]", "abc", 0},
    {"ab[^c]", "abc", 0},
    {"ab[^b-d]", "abc", 0},
    {"ab[^e-g]", "abc", 1},
    {"a\\*b", "a*b", 1},
    {"a\\*b", "ab", 0},
    {"a?b", "a\xe2\x98\xba" "b", 1},
    {"a[^a]b", "a\xe2\x98\xba" "b", 1},
    {"a???b", "a\xe2\x98\xba" "b", 0},
    {"a[^a][^a][^a]b", "a\xe2\x98\xba" "b", 0},
    {"[a-\xce\xb6]*", "\xce\xb1", 1},
    {"*[a-\xce\xb6]", "A", 0},
    {"a?b", "a/b", 0},
    {"a*b", "a/b", 0},
    {"[\\]a]", "]", 1},
    {"[\\-]", "-", 1},
    {"[x\\-]", "x", 1},
    {"[x\\-]", "-", 1},
    {"[x\\-]", "z", 0},
    {"[\\-x]", "x", 1},
    {"[\\-x]", "-", 1},
    {"[\\-x]", "a", 0},
    {"[]a]", "]", -1},
    {"[-]", "-", -1},
    {"[x-]", "x", -1},
    {"[x-]", "-", -1},
    {"[x-]", "z", -1},
    {"[-x]", "x", -1},
    {"[-x]", "-", -1},
    {"[-x]", "a", -1},
    {"\\", "a", -1},
    {"[a-b-c]", "a", -1},
    {"[", "a", -1},
    {"[^", "a", -1},
    {"[^bc", "a", -1},
    {"a[", "a", -1},
    {"a[", "ab", -1},
    {"a[", "x", -1},
    {"a/b[", "x", -1},
    {"*x", "xxx", 1},
};

/* SearchFiles-flavoured cases. */
static const glob_case more[] = {
    {"*.py", "main.py", 1},
    {"*.py", "target/main.py", 0},
    {"*/*.py", "target/main.py", 1},
    {"*.bak", "x.bak", 1},
    {"*.py", ".py", 1},
    {"*.py", "main.pyc", 0},
    {"?", "", 0},
    {"", "", 1},
    {"", "a", 0},
    {"*", "", 1},
    {"**", "a/b", 0},
    {"a\\", "a", -1},
    {"*\\", "a", -1},
    {"[a]*[", "b", -1},
    {"x*[", "abc", -1}, /* syntax error reported even after a mismatch */
    {"[!a]", "!", 1},   /* '!' is not negation in Go */
    {"[/]", "/", 1},     /* a class may match a slash */
    {"[^/]", "/", 0},
    {"\\[a]", "[a]", 1},
    {"M*", "main.py", 0}, /* case sensitive */
    {"[\xff]", "a", -1},  /* invalid UTF-8 in a class */
    {"?", "\xff", 1},     /* an invalid byte is one rune */
    {"??", "\xce\xb1", 0},
    {"*a*a*a*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 0},
};

static void run_table(const glob_case *t, size_t n) {
  for (size_t i = 0; i < n; i++) {
    int m = fs_glob_match(t[i].pat, strlen(t[i].pat), t[i].name, strlen(t[i].name));
    int v = fs_glob_valid(t[i].pat, strlen(t[i].pat));
    if (t[i].match < 0) {
      if (m != -1 || v != 0)
        TEST_FAIL_("pattern %s name %s: match %d valid %d, want bad pattern", t[i].pat,
                   t[i].name, m, v);
    } else if (m != t[i].match || v != 1) {
      TEST_FAIL_("pattern %s name %s: match %d valid %d, want %d", t[i].pat, t[i].name, m, v,
                 t[i].match);
    }
  }
}

TEST(go_match_table) { run_table(go_table, sizeof go_table / sizeof *go_table); }
TEST(search_cases) { run_table(more, sizeof more / sizeof *more); }

TEST(valid_only) {
  ASSERT_EQ(fs_glob_valid("*.py", 4), 1);
  ASSERT_EQ(fs_glob_valid("[a-z]*.[ch]", 11), 1);
  ASSERT_EQ(fs_glob_valid("[z-a]", 5), 1); /* Go: an empty range is not an error */
  ASSERT_EQ(fs_glob_valid("[", 1), 0);
  ASSERT_EQ(fs_glob_valid("ok*[", 4), 0);
  ASSERT_EQ(fs_glob_valid("[]", 2), 0);
  ASSERT_EQ(fs_glob_valid("[^]", 3), 0);
}

TEST(no_blowup) {
  /* A pattern that would explode a naive backtracker: 30 stars against a
   * long name of 'a's that does not end in 'b'.  Must be quick. */
  char pat[128], name[4097];
  size_t k = 0;
  for (int i = 0; i < 30; i++) {
    pat[k++] = '*';
    pat[k++] = 'a';
  }
  pat[k++] = 'b';
  pat[k] = 0;
  memset(name, 'a', 4096);
  name[4096] = 0;
  clock_t t0 = clock();
  for (int i = 0; i < 20; i++) ASSERT_EQ(fs_glob_match(pat, k, name, 4096), 0);
  double secs = (double)(clock() - t0) / CLOCKS_PER_SEC;
  ASSERT(secs < 2.0);
}

int main(void) {
  RUN(go_match_table);
  RUN(search_cases);
  RUN(valid_only);
  RUN(no_blowup);
  return test_summary();
}
