/* Unit tests: fs/mode (Go FileMode.String) on real files, and fs/rfc3339. */
#include "tests/unit/test.h"

#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fs/mode.h"
#include "fs/rfc3339.h"

static char tmpd[64];
static char pathbuf[256];

static const char *P(const char *name) {
  snprintf(pathbuf, sizeof pathbuf, "%s/%s", tmpd, name);
  return pathbuf;
}

static const char *mode_of(const char *path, int use_lstat) {
  static char out[FS_MODE_STR_MAX];
  struct stat st;
  if ((use_lstat ? lstat(path, &st) : stat(path, &st)) != 0) return "(stat failed)";
  return fs_mode_string(st.st_mode, out);
}

TEST(regular_and_dir) {
  int fd = open(P("f"), O_CREAT | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT_EQ(chmod(P("f"), 0644), 0);
  ASSERT_STR_EQ(mode_of(P("f"), 0), "-rw-r--r--");
  ASSERT_EQ(chmod(P("f"), 0), 0);
  ASSERT_STR_EQ(mode_of(P("f"), 0), "----------");
  ASSERT_EQ(chmod(P("f"), 0777), 0);
  ASSERT_STR_EQ(mode_of(P("f"), 0), "-rwxrwxrwx");
  ASSERT_EQ(mkdir(P("d"), 0755), 0);
  ASSERT_EQ(chmod(P("d"), 0755), 0);
  ASSERT_STR_EQ(mode_of(P("d"), 0), "drwxr-xr-x");
}

TEST(sticky_tmp_like) {
  ASSERT_EQ(mkdir(P("t"), 0700), 0);
  ASSERT_EQ(chmod(P("t"), 01777), 0);
  ASSERT_STR_EQ(mode_of(P("t"), 0), "dtrwxrwxrwx");
}

TEST(dev_null) { ASSERT_STR_EQ(mode_of("/dev/null", 0), "Dcrw-rw-rw-"); }

TEST(broken_symlink) {
  ASSERT_EQ(symlink("does-not-exist", P("broken")), 0);
  ASSERT_STR_EQ(mode_of(P("broken"), 1), "Lrwxrwxrwx");
}

TEST(setuid_setgid) {
  int fd = open(P("su"), O_CREAT | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT_EQ(chmod(P("su"), 04755), 0);
  ASSERT_STR_EQ(mode_of(P("su"), 0), "urwxr-xr-x");
  ASSERT_EQ(chmod(P("su"), 02755), 0);
  ASSERT_STR_EQ(mode_of(P("su"), 0), "grwxr-xr-x");
  ASSERT_EQ(chmod(P("su"), 07777), 0);
  ASSERT_STR_EQ(mode_of(P("su"), 0), "ugtrwxrwxrwx");
}

TEST(fifo_and_socket) {
  ASSERT_EQ(mkfifo(P("fifo"), 0600), 0);
  ASSERT_EQ(chmod(P("fifo"), 0644), 0);
  ASSERT_STR_EQ(mode_of(P("fifo"), 0), "prw-r--r--");

  int s = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT(s >= 0);
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  snprintf(sa.sun_path, sizeof sa.sun_path, "%s", P("sock"));
  ASSERT_EQ(bind(s, (struct sockaddr *)&sa, sizeof sa), 0);
  close(s);
  ASSERT_EQ(chmod(P("sock"), 0755), 0);
  ASSERT_STR_EQ(mode_of(P("sock"), 0), "Srwxr-xr-x");
}

TEST(synthetic_modes) {
  char out[FS_MODE_STR_MAX];
  ASSERT_STR_EQ(fs_mode_string(S_IFBLK | 0660, out), "Drw-rw----");
  ASSERT_STR_EQ(fs_mode_string(S_IFCHR | 0620, out), "Dcrw--w----");
  ASSERT_STR_EQ(fs_mode_string(S_IFCHR | S_ISUID | 0600, out), "Ducrw-------");
  ASSERT_STR_EQ(fs_mode_string(S_IFDIR | S_ISGID | 02775, out), "dgrwxrwxr-x");
  ASSERT_STR_EQ(fs_mode_string(S_IFLNK | 0777, out), "Lrwxrwxrwx");
  ASSERT_STR_EQ(fs_mode_string(S_IFREG | 0400, out), "-r--------");
}

TEST(rfc3339) {
  char b[FS_RFC3339_MAX];
  ASSERT_EQ(fs_rfc3339(0, b, sizeof b), 20);
  ASSERT_STR_EQ(b, "1970-01-01T00:00:00Z");
  fs_rfc3339(1783764000, b, sizeof b);
  ASSERT_STR_EQ(b, "2026-07-11T10:00:00Z");
  fs_rfc3339(951782400, b, sizeof b); /* leap day */
  ASSERT_STR_EQ(b, "2000-02-29T00:00:00Z");
  fs_rfc3339(1700000000, b, sizeof b);
  ASSERT_STR_EQ(b, "2023-11-14T22:13:20Z");
  fs_rfc3339(-1, b, sizeof b);
  ASSERT_STR_EQ(b, "1969-12-31T23:59:59Z");
  fs_rfc3339(253402300799LL, b, sizeof b);
  ASSERT_STR_EQ(b, "9999-12-31T23:59:59Z");
  /* too small a buffer → empty, 0 */
  char small[8];
  ASSERT_EQ(fs_rfc3339(0, small, sizeof small), 0);
  ASSERT_STR_EQ(small, "");
}

/* The hand-written formatter agrees with gmtime_r across the range glibc
 * can represent, and prints Go's forms beyond it. */
TEST(rfc3339_matches_gmtime) {
  char b[FS_RFC3339_MAX], want[64];
  uint64_t seed = 88172645463325252ull;
  for (int i = 0; i < 200000; i++) {
    seed ^= seed << 13;
    seed ^= seed >> 7;
    seed ^= seed << 17;
    /* years -3000 .. 9999 and small values around the epoch */
    int64_t t = (i & 1) ? (int64_t)(seed % 410000000000ull) - 156000000000ll
                        : (int64_t)(seed % 20000000ull) - 10000000ll;
    time_t tt = (time_t)t;
    struct tm tm;
    ASSERT(gmtime_r(&tt, &tm) != NULL);
    long long y = (long long)tm.tm_year + 1900;
    if (y < 0)
      snprintf(want, sizeof want, "-%04lld-%02d-%02dT%02d:%02d:%02dZ", -y, tm.tm_mon + 1,
               tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    else
      snprintf(want, sizeof want, "%04lld-%02d-%02dT%02d:%02d:%02dZ", y, tm.tm_mon + 1,
               tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec);
    ASSERT_EQ(fs_rfc3339(tt, b, sizeof b), strlen(want));
    if (strcmp(b, want) != 0) {
      fprintf(stderr, "t=%lld got %s want %s\n", (long long)t, b, want);
      ASSERT_STR_EQ(b, want);
    }
  }
  fs_rfc3339(253402300800LL, b, sizeof b);
  ASSERT_STR_EQ(b, "10000-01-01T00:00:00Z");
  fs_rfc3339(-62135596800LL - 86400, b, sizeof b); /* the day before 0001-01-01 */
  ASSERT_STR_EQ(b, "0000-12-31T00:00:00Z");
  fs_rfc3339(-62167219200LL - 1, b, sizeof b); /* a second before year 0 */
  ASSERT_STR_EQ(b, "-0001-12-31T23:59:59Z");
  /* the ends of time_t: no overflow, some answer that fits */
  ASSERT(fs_rfc3339((time_t)INT64_MAX, b, sizeof b) > 20);
  ASSERT(fs_rfc3339((time_t)INT64_MIN, b, sizeof b) > 20);
  ASSERT_EQ(b[0], '-');
}

TEST(rfc3339_is_utc) {
  char b[FS_RFC3339_MAX];
  setenv("TZ", "Asia/Shanghai", 1);
  tzset();
  fs_rfc3339(0, b, sizeof b);
  ASSERT_STR_EQ(b, "1970-01-01T00:00:00Z");
  unsetenv("TZ");
  tzset();
}

static void cleanup(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpd);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed\n");
}

int main(void) {
  snprintf(tmpd, sizeof tmpd, "/tmp/test_fs_mode.XXXXXX");
  if (!mkdtemp(tmpd)) return 1;
  RUN(regular_and_dir);
  RUN(sticky_tmp_like);
  RUN(dev_null);
  RUN(broken_symlink);
  RUN(setuid_setgid);
  RUN(fifo_and_socket);
  RUN(synthetic_modes);
  RUN(rfc3339);
  RUN(rfc3339_matches_gmtime);
  RUN(rfc3339_is_utc);
  cleanup();
  return test_summary();
}
