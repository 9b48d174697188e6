/* Unit tests: fs/walk — ListFiles/SearchFiles walk on a temp tree. */
#include "tests/unit/test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs/glob.h"
#include "fs/walk.h"
#include "server/rpc.h"
#include "proto/agent.pb-c.h"

static char root[64];

static void mkfile(const char *rel, const char *content) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  int fd = open(p, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0) abort();
  if (write(fd, content, strlen(content)) != (ssize_t)strlen(content)) abort();
  close(fd);
  chmod(p, 0644);
}
static void mkd(const char *rel) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  if (mkdir(p, 0755) != 0) abort();
  chmod(p, 0755);
}
static void mkl(const char *target, const char *rel) {
  char p[256];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  if (symlink(target, p) != 0) abort();
}

/* The listing as "relpath[/]" lines (dirs get a trailing slash). */
static const char *listing(const fs_walk *w) {
  static char out[4096];
  size_t k = 0, rl = strlen(root);
  out[0] = 0;
  for (size_t i = 0; i < w->n; i++) {
    const char *p = w->entries[i].path;
    if (strncmp(p, root, rl) == 0 && p[rl] == '/') p += rl + 1;
    k += (size_t)snprintf(out + k, sizeof out - k, "%s%s%s", k ? " " : "", p,
                          w->entries[i].is_dir ? "/" : "");
  }
  return out;
}

static int run_walk(fs_walk *w, const char *r, int depth) {
  memset(w, 0, sizeof *w);
  w->root = r;
  w->max_depth = depth;
  return fs_walk_run(w);
}

TEST(depth1_byte_order) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 1), RPC_OK);
  ASSERT_STR_EQ(listing(&w), "B.txt a.txt broken linked/ loop/ remote.txt target/");
  fs_walk_free(&w);
}

TEST(depth2) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 2), RPC_OK);
  ASSERT_STR_EQ(listing(&w),
                "B.txt a.txt broken linked/ linked/main.py linked/sub/ loop/ loop/back/ "
                "remote.txt target/ target/main.py target/sub/");
  fs_walk_free(&w);
}

TEST(depth3_and_cycles) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 3), RPC_OK);
  /* loop/back and sub/up point at the root, which is on the chain */
  ASSERT_STR_EQ(listing(&w),
                "B.txt a.txt broken linked/ linked/main.py linked/sub/ linked/sub/deep.txt "
                "linked/sub/up/ loop/ loop/back/ remote.txt target/ target/main.py "
                "target/sub/ target/sub/deep.txt target/sub/up/");
  fs_walk_free(&w);
}

TEST(unlimited_stops_at_cycles) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 0), RPC_OK);
  /* up → root and back → root are on the chain: listed, never entered */
  ASSERT_STR_EQ(listing(&w),
                "B.txt a.txt broken linked/ linked/main.py linked/sub/ linked/sub/deep.txt "
                "linked/sub/up/ loop/ loop/back/ remote.txt target/ target/main.py "
                "target/sub/ target/sub/deep.txt target/sub/up/");
  fs_walk_free(&w);
}

TEST(entry_fields) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 2), RPC_OK);
  int seen = 0;
  for (size_t i = 0; i < w.n; i++) {
    const fs_entry *e = &w.entries[i];
    ASSERT(strchr(e->mtime, 'T') && e->mtime[strlen(e->mtime) - 1] == 'Z');
    if (strcmp(e->name, "a.txt") == 0) {
      ASSERT_EQ(e->size, 1);
      ASSERT_EQ(e->is_dir, 0);
      ASSERT_STR_EQ(e->perms, "-rw-r--r--");
      seen++;
    } else if (strcmp(e->name, "broken") == 0) {
      ASSERT_EQ(e->is_dir, 0);
      ASSERT_STR_EQ(e->perms, "Lrwxrwxrwx");
      ASSERT_EQ(e->size, (int64_t)strlen("nowhere/at/all"));
      seen++;
    } else if (strcmp(e->name, "linked") == 0) {
      ASSERT_EQ(e->is_dir, 1);
      ASSERT_STR_EQ(e->perms, "drwxr-xr-x");
      char want[128];
      snprintf(want, sizeof want, "%s/linked", root);
      ASSERT_STR_EQ(e->path, want);
      seen++;
    } else if (strcmp(e->name, "main.py") == 0) {
      ASSERT_EQ(e->size, 12);
      seen++;
    }
  }
  ASSERT_EQ(seen, 5);
  fs_walk_free(&w);
}

TEST(file_root_and_missing) {
  fs_walk w;
  char p[128];
  snprintf(p, sizeof p, "%s/a.txt", root);
  ASSERT_EQ(run_walk(&w, p, 1), RPC_OK);
  ASSERT_EQ(w.n, 1);
  ASSERT_STR_EQ(w.entries[0].path, p);
  ASSERT_STR_EQ(w.entries[0].name, "a.txt");
  fs_walk_free(&w);

  snprintf(p, sizeof p, "%s/nope", root);
  ASSERT_EQ(run_walk(&w, p, 1), RPC_NOT_FOUND);
  char want[160];
  snprintf(want, sizeof want, "path not found: %s", p);
  ASSERT_STR_EQ(w.st.msg, want);
  ASSERT_EQ(w.n, 0);
  fs_walk_free(&w);

  snprintf(p, sizeof p, "%s/broken", root); /* a dangling root is missing */
  ASSERT_EQ(run_walk(&w, p, 1), RPC_NOT_FOUND);
  fs_walk_free(&w);

  snprintf(p, sizeof p, "%s/linked", root); /* a linked root is walked logically */
  ASSERT_EQ(run_walk(&w, p, 1), RPC_OK);
  ASSERT_EQ(w.n, 2);
  snprintf(want, sizeof want, "%s/linked/main.py", root);
  ASSERT_STR_EQ(w.entries[0].path, want);
  fs_walk_free(&w);
}

TEST(slash_root) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, "/", 1), RPC_OK);
  ASSERT(w.n > 0);
  for (size_t i = 0; i < w.n; i++) {
    ASSERT(w.entries[i].path[0] == '/');
    ASSERT(strchr(w.entries[i].path + 1, '/') == NULL);
    ASSERT_STR_EQ(w.entries[i].name, w.entries[i].path + 1);
  }
  fs_walk_free(&w);
}

/* Below the root an unreadable directory is listed, not entered, and does
 * not fail the walk (as root, /proc/1/fdinfo may be the only such place). */
TEST(unreadable_subdir) {
  DIR *d = opendir("/proc/1/fdinfo");
  if (d) {
    closedir(d);
    return; /* readable here: nothing to check */
  }
  if (errno != EACCES) return;
  fs_walk w;
  ASSERT_EQ(run_walk(&w, "/proc/1", 2), RPC_OK);
  int seen = 0;
  for (size_t i = 0; i < w.n; i++) {
    ASSERT(strncmp(w.entries[i].path, "/proc/1/fdinfo/", 15) != 0);
    if (strcmp(w.entries[i].path, "/proc/1/fdinfo") == 0) seen = 1;
  }
  ASSERT(seen);
  fs_walk_free(&w);
  ASSERT_EQ(run_walk(&w, "/proc/1/fdinfo", 1), RPC_PERMISSION_DENIED);
  ASSERT_STR_EQ(w.st.msg, "read directory /proc/1/fdinfo: permission denied");
  fs_walk_free(&w);
}

static int py_filter(void *arg, const char *rel, size_t rellen, const char *base, size_t bl,
                     int is_dir) {
  const char *pat = arg;
  if (is_dir) return 0;
  return fs_glob_match(pat, strlen(pat), rel, rellen) == 1 ||
         fs_glob_match(pat, strlen(pat), base, bl) == 1;
}

TEST(filter_search) {
  fs_walk w;
  memset(&w, 0, sizeof w);
  w.root = root;
  w.filter = py_filter;
  w.filter_arg = "*.py";
  ASSERT_EQ(fs_walk_run(&w), RPC_OK);
  ASSERT_STR_EQ(listing(&w), "linked/main.py target/main.py");
  fs_walk_free(&w);

  memset(&w, 0, sizeof w);
  w.root = root;
  w.filter = py_filter;
  w.filter_arg = "target/sub/*"; /* relative path match */
  ASSERT_EQ(fs_walk_run(&w), RPC_OK);
  ASSERT_STR_EQ(listing(&w), "target/sub/deep.txt");
  fs_walk_free(&w);
}

TEST(cancel) {
  atomic_int cancel = 1;
  fs_walk w;
  memset(&w, 0, sizeof w);
  w.root = root;
  w.cancel = &cancel;
  ASSERT_EQ(fs_walk_run(&w), RPC_CANCELED);
  fs_walk_free(&w);
}

TEST(size_bound) {
  fs_walk w;
  memset(&w, 0, sizeof w);
  w.root = root;
  w.max_bytes = 200;
  ASSERT_EQ(fs_walk_run(&w), RPC_RESOURCE_EXHAUSTED);
  ASSERT_STR_EQ(w.st.msg, "file list exceeds maximum message size 200 bytes");
  ASSERT(w.bytes <= 200);
  fs_walk_free(&w);
}

TEST(visit_bound) {
  fs_walk w;
  memset(&w, 0, sizeof w);
  w.root = root;
  w.max_visits = 5;
  ASSERT_EQ(fs_walk_run(&w), RPC_RESOURCE_EXHAUSTED);
  ASSERT_STR_EQ(w.st.msg, "file walk exceeds 5 entries");
  ASSERT_EQ(w.n, 5);
  fs_walk_free(&w);
  memset(&w, 0, sizeof w);
  w.root = root;
  w.max_visits = 16; /* the whole tree has exactly 16 entries */
  ASSERT_EQ(fs_walk_run(&w), RPC_OK);
  ASSERT_EQ(w.n, 16);
  ASSERT_EQ(w.visits, 16);
  fs_walk_free(&w);
}

/* The protobuf size estimate is exact; the JSON one is an upper bound. */
TEST(wire_size) {
  fs_walk w;
  ASSERT_EQ(run_walk(&w, root, 0), RPC_OK);
  Pb__FileEntry *ev = calloc(w.n, sizeof *ev);
  Pb__FileEntry **ep = calloc(w.n, sizeof *ep);
  size_t sum = 0;
  for (size_t i = 0; i < w.n; i++) {
    pb__file_entry__init(&ev[i]);
    ev[i].name = (char *)w.entries[i].name;
    ev[i].path = w.entries[i].path;
    ev[i].type = w.entries[i].is_dir ? "directory" : "file";
    ev[i].size = w.entries[i].size;
    ev[i].permissions = w.entries[i].perms;
    ev[i].modified_time = w.entries[i].mtime;
    ev[i].is_directory = w.entries[i].is_dir;
    ep[i] = &ev[i];
    sum += fs_entry_wire_size(&w.entries[i], 0);
  }
  Pb__ListFilesResponse r = PB__LIST_FILES_RESPONSE__INIT;
  r.n_entries = w.n;
  r.entries = ep;
  ASSERT_EQ(pb__list_files_response__get_packed_size(&r), sum);
  ASSERT_EQ(w.bytes, sum);
  free(ev);
  free(ep);
  fs_walk_free(&w);
}

/* The JSON bound holds for names JSON must escape or replace: quotes,
 * backslashes, control characters, valid and invalid UTF-8. */
TEST(json_wire_size_bound) {
  char dir[128];
  snprintf(dir, sizeof dir, "%s/odd", root);
  ASSERT_EQ(mkdir(dir, 0755), 0);
  const char *names[] = {"q\"uote", "back\\slash", "ctl\x01x", "nl\nx", "\xc3\xa9t\xc3\xa9",
                         "bad\xff\xfe" "byte", "\xe2\x82", "plain"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, names[i]);
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    ASSERT(fd >= 0);
    close(fd);
  }
  fs_walk w;
  ASSERT_EQ(run_walk(&w, dir, 1), RPC_OK);
  ASSERT_EQ(w.n, 8);
  for (size_t i = 0; i < w.n; i++) {
    Pb__FileEntry e = PB__FILE_ENTRY__INIT;
    e.name = (char *)w.entries[i].name;
    e.path = w.entries[i].path;
    e.type = w.entries[i].is_dir ? "directory" : "file";
    e.size = w.entries[i].size;
    e.permissions = w.entries[i].perms;
    e.modified_time = w.entries[i].mtime;
    e.is_directory = w.entries[i].is_dir;
    Pb__ListFilesResponse r = PB__LIST_FILES_RESPONSE__INIT;
    Pb__FileEntry *ep = &e;
    r.n_entries = 1;
    r.entries = &ep;
    size_t jl;
    uint8_t *j = rpc_encode(1, &r.base, &jl);
    ASSERT(j != NULL);
    free(j);
    /* {"entries":[…]} around one entry: 14 bytes */
    size_t bound = fs_entry_wire_size(&w.entries[i], 1);
    if (bound < jl - 14) fprintf(stderr, "  %s: bound %zu < %zu\n", w.entries[i].name, bound, jl - 14);
    ASSERT(bound >= jl - 14);
    ASSERT(bound <= jl - 14 + 200); /* and not wildly over */
  }
  fs_walk_free(&w);
}

static void build_tree(void) {
  mkfile("a.txt", "a");
  mkfile("B.txt", "B");
  mkfile("remote.txt", "hello\n");
  mkd("target");
  mkfile("target/main.py", "print('ok')\n");
  mkd("target/sub");
  mkfile("target/sub/deep.txt", "deep");
  mkl("../..", "target/sub/up");
  mkl("target", "linked");
  mkl("nowhere/at/all", "broken");
  mkd("loop");
  mkl("..", "loop/back");
}

/* Deeper than the walker's inline descent chain (16) and with logical
 * paths longer than its inline path buffer (512): both grow onto the heap
 * and the listing stays right (ASan checks the copies). */
TEST(deep_and_long_paths) {
  char base[128], p[1024];
  snprintf(base, sizeof base, "%s/deep", root);
  ASSERT_EQ(mkdir(base, 0755), 0);
  size_t k = (size_t)snprintf(p, sizeof p, "%s", base);
  for (int i = 0; i < 40; i++) {
    k += (size_t)snprintf(p + k, sizeof p - k, "/level%02d-xxxxx", i);
    ASSERT_EQ(mkdir(p, 0755), 0);
  }
  ASSERT(strlen(p) > 512);
  fs_walk w;
  ASSERT_EQ(run_walk(&w, base, 0), RPC_OK);
  ASSERT_EQ(w.n, 40);
  ASSERT_STR_EQ(w.entries[w.n - 1].path, p);
  ASSERT_STR_EQ(w.entries[w.n - 1].name, "level39-xxxxx");
  ASSERT(w.entries[w.n - 1].is_dir);
  fs_walk_free(&w);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/test_fs_walk.XXXXXX");
  if (!mkdtemp(root)) return 1;
  build_tree();
  RUN(depth1_byte_order);
  RUN(depth2);
  RUN(depth3_and_cycles);
  RUN(unlimited_stops_at_cycles);
  RUN(entry_fields);
  RUN(file_root_and_missing);
  RUN(slash_root);
  RUN(unreadable_subdir);
  RUN(filter_search);
  RUN(cancel);
  RUN(size_bound);
  RUN(visit_bound);
  RUN(wire_size);
  RUN(json_wire_size_bound);
  RUN(deep_and_long_paths);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
  if (system(cmd) != 0) return 1;
  return test_summary();
}
