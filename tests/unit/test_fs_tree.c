/* Unit tests: fs/tree — recursive remove (symlinks never followed, depth
 * bound, cancel) and the cross-filesystem move (/dev/shm is tmpfs, the
 * build tree is on the repository's disk); mkdir -p and its undo; FIFOs
 * copied without being opened; mount boundaries by mount ID (a bind mount
 * of the same filesystem — same st_dev — neither entered by Remove nor
 * copied by Move: root only, in a private mount namespace of this process,
 * so nothing is mounted on the host; it says so when it cannot run). */
#include "tests/unit/test.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs/tree.h"

static char disk[256], shm[256];

static void put(const char *path, const char *s) {
  int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
  if (fd < 0 || write(fd, s, strlen(s)) != (ssize_t)strlen(s)) abort();
  close(fd);
}

static int exists(const char *p) {
  struct stat sb;
  return lstat(p, &sb) == 0;
}

TEST(remove_keeps_link_targets) {
  char t[512], p[600], outside[512];
  snprintf(outside, sizeof outside, "%s/outside", disk);
  snprintf(t, sizeof t, "%s/t", disk);
  ASSERT_EQ(mkdir(outside, 0755), 0);
  snprintf(p, sizeof p, "%s/keep", outside);
  put(p, "k");
  ASSERT_EQ(mkdir(t, 0755), 0);
  snprintf(p, sizeof p, "%s/sub", t);
  ASSERT_EQ(mkdir(p, 0500), 0);
  snprintf(p, sizeof p, "%s/link", t);
  ASSERT_EQ(symlink(outside, p), 0);
  fs_status st = {RPC_OK, NULL};
  ASSERT_EQ(fs_tree_remove(t, NULL, &st), 0);
  ASSERT_EQ(exists(t), 0);
  snprintf(p, sizeof p, "%s/keep", outside);
  ASSERT_EQ(exists(p), 1);
  fs_status_clear(&st);
}

TEST(remove_canceled) {
  char t[512];
  snprintf(t, sizeof t, "%s/c", disk);
  ASSERT_EQ(mkdir(t, 0755), 0);
  atomic_int cancel = 1;
  fs_status st = {RPC_OK, NULL};
  ASSERT_EQ(fs_tree_remove(t, &cancel, &st), -1);
  ASSERT_EQ(st.code, RPC_CANCELED);
  fs_status_clear(&st);
  ASSERT_EQ(fs_tree_remove(t, NULL, &st), 0);
}

TEST(remove_too_deep) {
  char t[512];
  snprintf(t, sizeof t, "%s/deep", shm);
  ASSERT_EQ(mkdir(t, 0755), 0);
  int fd = open(t, O_RDONLY | O_DIRECTORY);
  for (int i = 0; i < FS_TREE_MAX_DEPTH + 2; i++) {
    ASSERT_EQ(mkdirat(fd, "d", 0755), 0);
    int n = openat(fd, "d", O_RDONLY | O_DIRECTORY);
    close(fd);
    fd = n;
  }
  close(fd);
  fs_status st = {RPC_OK, NULL};
  ASSERT_EQ(fs_tree_remove(t, NULL, &st), -1);
  ASSERT_EQ(st.code, RPC_RESOURCE_EXHAUSTED);
  ASSERT(strstr(st.msg, "directory tree deeper than 1024 levels") != NULL);
  fs_status_clear(&st);
}

TEST(move_xdev_file_and_failure) {
  char src[512], dst[512];
  snprintf(src, sizeof src, "%s/f", shm);
  snprintf(dst, sizeof dst, "%s/f2", disk);
  put(src, "hello");
  chmod(src, 0600);
  fs_status st = {RPC_OK, NULL};
  ASSERT_EQ(fs_tree_move_xdev(src, dst, NULL, &st), 0);
  ASSERT_EQ(exists(src), 0);
  struct stat sb;
  ASSERT_EQ(stat(dst, &sb), 0);
  ASSERT_EQ(sb.st_size, 5);
  ASSERT_EQ(sb.st_mode & 0777, 0600);
  /* onto a non-empty directory: fails, source kept, no copy left */
  char full[512], x[600];
  snprintf(full, sizeof full, "%s/full", shm);
  ASSERT_EQ(mkdir(full, 0755), 0);
  snprintf(x, sizeof x, "%s/x", full);
  ASSERT_EQ(mkdir(x, 0755), 0);
  char d[512];
  snprintf(d, sizeof d, "%s/dir", disk);
  ASSERT_EQ(mkdir(d, 0755), 0);
  snprintf(x, sizeof x, "%s/inner", d);
  put(x, "i");
  ASSERT_EQ(fs_tree_move_xdev(d, full, NULL, &st), -1);
  ASSERT(strstr(st.msg, "directory not empty") != NULL);
  ASSERT_EQ(exists(x), 1);
  DIR *dd = opendir(shm);
  struct dirent *de;
  while ((de = readdir(dd)))
    ASSERT(strncmp(de->d_name, ".conch-move-", 12) != 0);
  closedir(dd);
  fs_status_clear(&st);
}

/* path = base + "/" + rel */
static const char *at(char *out, size_t n, const char *base, const char *rel) {
  if ((size_t)snprintf(out, n, "%s/%s", base, rel) >= n) abort();
  return out;
}

TEST(mkdir_p_and_unmake) {
  char p[600], q[600];
  fs_status st = {RPC_OK, NULL};
  size_t made = 99;
  ASSERT_EQ(mkdir(at(q, sizeof q, disk, "m"), 0755), 0);
  at(p, sizeof p, disk, "m/a/b/c/leaf");
  size_t dl = strlen(p) - strlen("/leaf"), a_len = strlen(disk) + strlen("/m/a");
  ASSERT_EQ(fs_tree_mkdir_p(p, dl, &made, &st), 0);
  ASSERT_EQ(made, a_len); /* m/a is the first one created */
  ASSERT(exists(at(q, sizeof q, disk, "m/a/b/c")));
  fs_tree_unmake(p, dl, made);
  ASSERT(exists(at(q, sizeof q, disk, "m")) && !exists(at(q, sizeof q, disk, "m/a")));
  /* nothing created: made 0, and unmake leaves it all */
  ASSERT_EQ(mkdir(at(q, sizeof q, disk, "m/a"), 0755), 0);
  ASSERT_EQ(fs_tree_mkdir_p(p, a_len, &made, &st), 0);
  ASSERT_EQ(made, 0);
  fs_tree_unmake(p, a_len, made);
  ASSERT(exists(at(q, sizeof q, disk, "m/a")));
  /* a created directory someone filled meanwhile stays, with its parents */
  ASSERT_EQ(fs_tree_mkdir_p(p, dl, &made, &st), 0);
  put(at(q, sizeof q, disk, "m/a/b/other"), "x");
  fs_tree_unmake(p, dl, made);
  ASSERT(!exists(at(q, sizeof q, disk, "m/a/b/c")));
  ASSERT(exists(at(q, sizeof q, disk, "m/a/b/other")));
  ASSERT_EQ(st.code, RPC_OK);
}

TEST(move_xdev_fifo_never_opened) {
  /* a FIFO without a writer: opening it for reading would block for good */
  char s[600], p[600], d[600];
  ASSERT_EQ(mkdir(at(s, sizeof s, shm, "withfifo"), 0755), 0);
  ASSERT_EQ(mkfifo(at(p, sizeof p, s, "fifo"), 0640), 0);
  put(at(p, sizeof p, s, "f"), "data");
  fs_status st = {RPC_OK, NULL};
  ASSERT_EQ(fs_tree_move_xdev(s, at(d, sizeof d, disk, "withfifo"), NULL, &st), 0);
  struct stat sb;
  ASSERT_EQ(lstat(at(p, sizeof p, d, "fifo"), &sb), 0);
  ASSERT(S_ISFIFO(sb.st_mode) && (sb.st_mode & 0777) == 0640);
  ASSERT(exists(at(p, sizeof p, d, "f")) && !exists(s));
  ASSERT_EQ(fs_tree_remove(d, NULL, &st), 0);
}

/* This process in a private mount namespace of its own (root only): 1, or
 * 0 when it cannot have one. */
static int private_mounts(void) {
  return unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0;
}

/* Runs in the private mount namespace (private_mounts). */
TEST(bind_mount_of_the_same_fs) {
  char vol[600], t[600], mnt[600], p[600], dst[600], want[1400];
  ASSERT_EQ(mkdir(at(vol, sizeof vol, shm, "vol"), 0755), 0);
  put(at(p, sizeof p, vol, "keep"), "precious");
  ASSERT_EQ(mkdir(at(t, sizeof t, shm, "t"), 0755), 0);
  ASSERT_EQ(mkdir(at(p, sizeof p, t, "a"), 0755), 0);
  put(at(p, sizeof p, t, "a/f"), "f");
  ASSERT_EQ(mkdir(at(mnt, sizeof mnt, t, "a/mnt"), 0755), 0);
  ASSERT_EQ(mount(vol, mnt, NULL, MS_BIND, NULL), 0);
  struct stat sa, sb;
  ASSERT(stat(mnt, &sa) == 0 && stat(t, &sb) == 0 && sa.st_dev == sb.st_dev); /* st_dev cannot tell */
  at(dst, sizeof dst, disk, "moved");
  /* Move refuses before anything changes; the mount point as the source too */
  fs_status st = {RPC_OK, NULL};
  snprintf(want, sizeof want, "cannot move a mount point across filesystems: %s", mnt);
  ASSERT_EQ(fs_tree_move_xdev(t, dst, NULL, &st), -1);
  ASSERT_EQ(st.code, RPC_INVALID_ARGUMENT);
  ASSERT_STR_EQ(st.msg, want);
  fs_status_clear(&st);
  ASSERT_EQ(fs_tree_move_xdev(mnt, dst, NULL, &st), -1);
  ASSERT_STR_EQ(st.msg, want);
  fs_status_clear(&st);
  ASSERT(exists(at(p, sizeof p, t, "a/f")) && exists(at(p, sizeof p, vol, "keep")) && !exists(dst));
  /* Remove does not enter it, as the tree's root neither */
  snprintf(want, sizeof want, "remove %s: device or resource busy", mnt);
  ASSERT_EQ(fs_tree_remove(t, NULL, &st), -1);
  ASSERT_STR_EQ(st.msg, want);
  fs_status_clear(&st);
  ASSERT_EQ(fs_tree_remove(mnt, NULL, &st), -1);
  ASSERT_STR_EQ(st.msg, want);
  fs_status_clear(&st);
  ASSERT(exists(at(p, sizeof p, vol, "keep")));
  ASSERT_EQ(umount(mnt), 0);
  ASSERT_EQ(fs_tree_remove(t, NULL, &st), 0);
  ASSERT(!exists(t) && exists(at(p, sizeof p, vol, "keep")));
}

int main(int argc, char **argv) {
  /* beside the binary: on the build's disk (build/asan/tests, build/static-arm64/tests) */
  const char *slash = argc > 0 ? strrchr(argv[0], '/') : NULL;
  int dlen = slash ? (int)(slash - argv[0]) : 1;
  snprintf(disk, sizeof disk, "%.*s/tree-%d", dlen, slash ? argv[0] : ".", (int)getpid());
  /* a tmpfs other than the disk's filesystem: /dev/shm, or CONCH_TEST_TMPFS
   * where there is none (the arm64 guest's sandbox root has /tmp) */
  const char *tmpfs = getenv("CONCH_TEST_TMPFS") ? getenv("CONCH_TEST_TMPFS") : "/dev/shm";
  snprintf(shm, sizeof shm, "%s/conch-unit-tree-%d", tmpfs, (int)getpid());
  if (mkdir(disk, 0755) != 0 || mkdir(shm, 0755) != 0) {
    perror("mkdir");
    return 1;
  }
  char *abs = realpath(disk, NULL);
  if (!abs || strlen(abs) >= sizeof disk) return 1;
  memcpy(disk, abs, strlen(abs) + 1);
  free(abs);
  RUN(remove_keeps_link_targets);
  RUN(remove_canceled);
  RUN(remove_too_deep);
  RUN(move_xdev_file_and_failure);
  RUN(mkdir_p_and_unmake);
  RUN(move_xdev_fifo_never_opened);
  if (private_mounts()) /* last: the namespace stays this process's */
    RUN(bind_mount_of_the_same_fs);
  else /* not counted as passed */
    printf("bind_mount_of_the_same_fs: not run (no private mount namespace: %s)\n", strerror(errno));
  /* the over-deep tree is beyond fs_tree_remove by design */
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", disk, shm);
  if (system(cmd) != 0) fprintf(stderr, "cleanup failed: %s\n", cmd);
  return test_summary();
}
