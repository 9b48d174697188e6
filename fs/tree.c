/* fs/tree — recursive remove and cross-filesystem move; see tree.h. */
#include "fs/tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "fs/path.h"

#define TREE_TEMP_PREFIX ".conch-move-"
#define TREE_COPY_BUF (128u * 1024)

/* One walk: the path of the current entry (for messages only; every
 * operation goes through directory fds). */
typedef struct tw {
  const atomic_int *cancel;
  fs_status *st;
  char *p;
  size_t len, cap;
  char *buf;    /* copy buffer when copy_file_range cannot be used */
  uint64_t mnt; /* the mount the whole walk stays on (tree_stat) */
} tw;

static int tw_init(tw *t, const char *path, const atomic_int *cancel, fs_status *st) {
  memset(t, 0, sizeof *t);
  t->cancel = cancel;
  t->st = st;
  t->len = strlen(path);
  t->cap = t->len + 256;
  if (!(t->p = malloc(t->cap))) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  memcpy(t->p, path, t->len + 1);
  return 0;
}

static void tw_done(tw *t) {
  free(t->p);
  free(t->buf);
}

/* Append "/name" to the message path; returns the old length, or
 * (size_t)-1 when out of memory (status set). */
static size_t tw_push(tw *t, const char *name) {
  size_t nl = strlen(name), old = t->len;
  if (old + nl + 2 > t->cap) {
    size_t nc = (old + nl + 2) * 2;
    char *np = realloc(t->p, nc);
    if (!np) {
      fs_status_set(t->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return (size_t)-1;
    }
    t->p = np;
    t->cap = nc;
  }
  if (!(old == 1 && t->p[0] == '/')) t->p[t->len++] = '/';
  memcpy(t->p + t->len, name, nl + 1);
  t->len += nl;
  return old;
}

static void tw_pop(tw *t, size_t old) {
  t->len = old;
  t->p[old] = 0;
}

static int tw_fail(tw *t, const char *ctx, int e) {
  fs_status_os(t->st, ctx, t->p, e);
  return -1;
}

static int tw_canceled(tw *t) {
  if (!t->cancel || !atomic_load_explicit(t->cancel, memory_order_relaxed)) return 0;
  fs_status_set(t->st, RPC_CANCELED, "canceled");
  return 1;
}

static int tw_too_deep(tw *t, const char *what) {
  fs_status_set(t->st, RPC_RESOURCE_EXHAUSTED, "%s %s: directory tree deeper than %d levels", what,
                t->p, FS_TREE_MAX_DEPTH);
  return -1;
}

/* Without a mount ID (kernels before 5.8) st_dev stands in, flagged so
 * that it never equals a real mount ID. */
#define TREE_MNT_DEV (1ull << 63)

/* lstat of name in dfd ("" : dfd itself) and the mount it lies on: its
 * mount ID (statx STATX_MNT_ID), never st_dev alone — bind mounts of one
 * filesystem share st_dev, so only the mount ID tells a bind mount from
 * its parent.  0, or -1 with errno. */
static int tree_stat(int dfd, const char *name, struct stat *sb, uint64_t *mnt) {
  int fl = AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT | (name[0] ? 0 : AT_EMPTY_PATH);
  struct statx x;
  if (statx(dfd, name, fl, STATX_BASIC_STATS | STATX_MNT_ID, &x) != 0) {
    if (errno != ENOSYS || fstatat(dfd, name, sb, fl) != 0) return -1;
    *mnt = TREE_MNT_DEV | sb->st_dev;
    return 0;
  }
  memset(sb, 0, sizeof *sb);
  sb->st_mode = x.stx_mode;
  sb->st_uid = x.stx_uid;
  sb->st_gid = x.stx_gid;
  sb->st_ino = x.stx_ino;
  sb->st_size = (off_t)x.stx_size;
  sb->st_dev = makedev(x.stx_dev_major, x.stx_dev_minor);
  sb->st_rdev = makedev(x.stx_rdev_major, x.stx_rdev_minor);
  sb->st_atim.tv_sec = x.stx_atime.tv_sec;
  sb->st_atim.tv_nsec = x.stx_atime.tv_nsec;
  sb->st_mtim.tv_sec = x.stx_mtime.tv_sec;
  sb->st_mtim.tv_nsec = x.stx_mtime.tv_nsec;
  *mnt = (x.stx_mask & STATX_MNT_ID) ? x.stx_mnt_id : (TREE_MNT_DEV | sb->st_dev);
  return 0;
}

static int is_dot(const char *n) { return n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2])); }

/* Remove `name` in directory dfd (t->p is its path), not following links. */
static int rm_at(tw *t, int dfd, const char *name, int depth) {
  if (tw_canceled(t)) return -1;
  if (unlinkat(dfd, name, 0) == 0) return 0;
  int e = errno;
  if (e == ENOENT) return 0;
  if (e != EISDIR) return tw_fail(t, "remove", e);
  if (depth >= FS_TREE_MAX_DEPTH) return tw_too_deep(t, "remove");
  int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    e = errno;
    return e == ENOENT ? 0 : tw_fail(t, "remove", e);
  }
  struct stat sb;
  uint64_t mnt;
  if (tree_stat(fd, "", &sb, &mnt) != 0) {
    e = errno;
    close(fd);
    return tw_fail(t, "remove", e);
  }
  if (mnt != t->mnt) { /* a mount point: never empty another mount, a bind mount included */
    close(fd);
    return tw_fail(t, "remove", EBUSY);
  }
  DIR *d = fdopendir(fd);
  if (!d) {
    e = errno;
    close(fd);
    return tw_fail(t, "remove", e);
  }
  int rc = 0;
  /* entries removed while reading may make readdir skip others: read again
   * until a pass sees nothing (bounded: a directory refilled concurrently
   * ends in ENOTEMPTY below) */
  for (int pass = 0; rc == 0 && pass < FS_TREE_MAX_PASSES; pass++) {
    int seen = 0;
    rewinddir(d);
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
      if (is_dot(de->d_name)) continue;
      seen = 1;
      size_t old = tw_push(t, de->d_name);
      if (old == (size_t)-1) {
        rc = -1;
        break;
      }
      rc = rm_at(t, dirfd(d), de->d_name, depth + 1);
      tw_pop(t, old);
    }
    if (!seen) break;
  }
  closedir(d);
  if (rc) return rc;
  if (unlinkat(dfd, name, AT_REMOVEDIR) != 0) {
    e = errno;
    return e == ENOENT ? 0 : tw_fail(t, "remove", e);
  }
  return 0;
}

/* Open the parent directory of a clean absolute path; *name is its base. */
static int open_parent(const char *path, const char **name, fs_status *st, uint64_t *mnt) {
  size_t dl = fs_path_dir_len(path);
  char *dir = strndup(path, dl);
  if (!dir) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  struct stat sb;
  if (fd < 0 || tree_stat(fd, "", &sb, mnt) != 0) {
    fs_status_os(st, "open directory", dir, errno);
    if (fd >= 0) close(fd);
    free(dir);
    return -1;
  }
  free(dir);
  *name = fs_path_base(path);
  return fd;
}

int fs_tree_remove(const char *path, const atomic_int *cancel, fs_status *st) {
  const char *name;
  uint64_t mnt;
  int dfd = open_parent(path, &name, st, &mnt);
  if (dfd < 0) return -1;
  tw t;
  int rc = tw_init(&t, path, cancel, st);
  t.mnt = mnt;
  if (rc == 0) rc = rm_at(&t, dfd, name, 0);
  tw_done(&t);
  close(dfd);
  return rc;
}

int fs_tree_mkdir_p(const char *path, size_t dirlen, size_t *made, fs_status *st) {
  if (made) *made = 0;
  char *p = strndup(path, dirlen);
  if (!p) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  for (size_t i = 1; i <= dirlen; i++) {
    if (i < dirlen && p[i] != '/') continue;
    p[i] = 0;
    if (mkdir(p, 0755) == 0) {
      if (made && !*made) *made = i;
    } else {
      int e = errno;
      struct stat sb;
      if (e != EEXIST || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        if (e == EEXIST) e = ENOTDIR;
        p[i] = i < dirlen ? '/' : 0;
        fs_status_os(st, "make directory", path, e);
        free(p);
        return -1;
      }
    }
    if (i < dirlen) p[i] = '/';
  }
  free(p);
  return 0;
}

void fs_tree_unmake(const char *path, size_t dirlen, size_t made) {
  if (!made) return;
  char *p = strndup(path, dirlen);
  if (!p) return;
  /* deepest first; a directory someone filled meanwhile stays, and so do
   * its parents */
  for (size_t i = dirlen; i >= made; i--) {
    if (i < dirlen && p[i] != '/') continue;
    p[i] = 0;
    if (rmdir(p) != 0) break;
  }
  free(p);
}

void fs_tree_status_move(fs_status *st, const char *src, const char *dst, int err) {
  char *ctx = NULL;
  if (asprintf(&ctx, "move %s to", src) < 0) ctx = NULL;
  fs_status_os(st, ctx ? ctx : "move", dst, err);
  free(ctx);
}

/* Owner, mode and times of sb onto the fd (owner best effort: not root). */
static int cp_meta_fd(tw *t, int fd, const struct stat *sb) {
  if (fchown(fd, sb->st_uid, sb->st_gid) != 0) { /* best effort */
  }
  struct timespec ts[2] = {sb->st_atim, sb->st_mtim};
  if (fchmod(fd, sb->st_mode & 07777) != 0 || futimens(fd, ts) != 0) return tw_fail(t, "copy", errno);
  return 0;
}

static int cp_data(tw *t, int sfd, int dfd) {
  int use_cfr = 1;
  for (;;) {
    if (tw_canceled(t)) return -1;
    ssize_t n;
    if (use_cfr) {
      n = copy_file_range(sfd, NULL, dfd, NULL, 8u << 20, 0);
      if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        use_cfr = 0;
        continue;
      }
    } else {
      if (!t->buf && !(t->buf = malloc(TREE_COPY_BUF))) {
        fs_status_set(t->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
        return -1;
      }
      n = read(sfd, t->buf, TREE_COPY_BUF);
      for (ssize_t off = 0; n > 0 && off < n;) {
        ssize_t w = write(dfd, t->buf + off, (size_t)(n - off));
        if (w < 0) {
          if (errno == EINTR) continue;
          return tw_fail(t, "copy", errno);
        }
        off += w;
      }
    }
    if (n == 0) return 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      return tw_fail(t, "copy", errno);
    }
  }
}

static int cp_mount(tw *t) {
  fs_status_set(t->st, RPC_INVALID_ARGUMENT, "cannot move a mount point across filesystems: %s", t->p);
  return -1;
}

/* The entry was swapped for another kind between its stat and its open. */
static int cp_changed(tw *t) {
  fs_status_set(t->st, RPC_ABORTED, "file changed during move: %s", t->p);
  return -1;
}

/* Copy sname in sdfd to the new dname in ddfd (t->p: the source path).
 * Every open is O_NOFOLLOW | O_NONBLOCK and judged by the fstat of what it
 * opened: an entry swapped for a FIFO or a device after its stat must
 * never block a pool thread in open or read. */
static int cp_at(tw *t, int sdfd, const char *sname, int ddfd, const char *dname, int depth) {
  if (tw_canceled(t)) return -1;
  struct stat sb;
  uint64_t mnt;
  if (tree_stat(sdfd, sname, &sb, &mnt) != 0) return tw_fail(t, "copy", errno);
  /* a mount inside the tree (or the source itself mounted, a file bind
   * mount too) could not be removed after the copy: refuse while the
   * source is untouched */
  if (mnt != t->mnt) return cp_mount(t);
  int e;
  if (S_ISREG(sb.st_mode)) {
    int sfd = openat(sdfd, sname, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (sfd < 0) return errno == ELOOP || errno == ENXIO ? cp_changed(t) : tw_fail(t, "copy", errno);
    if (fstat(sfd, &sb) != 0) {
      e = errno;
      close(sfd);
      return tw_fail(t, "copy", e);
    }
    if (!S_ISREG(sb.st_mode)) {
      close(sfd);
      return cp_changed(t);
    }
    int dfd = openat(ddfd, dname, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (dfd < 0) {
      e = errno;
      close(sfd);
      return tw_fail(t, "copy", e);
    }
    int rc = cp_data(t, sfd, dfd);
    if (rc == 0 && fdatasync(dfd) != 0) rc = tw_fail(t, "sync file", errno);
    if (rc == 0) rc = cp_meta_fd(t, dfd, &sb);
    close(sfd);
    if (close(dfd) != 0 && rc == 0) rc = tw_fail(t, "copy", errno);
    return rc;
  }
  if (S_ISLNK(sb.st_mode)) {
    char target[4097];
    ssize_t n = readlinkat(sdfd, sname, target, sizeof target - 1);
    if (n < 0) return errno == EINVAL ? cp_changed(t) : tw_fail(t, "copy", errno);
    target[n] = 0;
    if (symlinkat(target, ddfd, dname) != 0) return tw_fail(t, "copy", errno);
    if (fchownat(ddfd, dname, sb.st_uid, sb.st_gid, AT_SYMLINK_NOFOLLOW) != 0) { /* best effort */
    }
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    utimensat(ddfd, dname, ts, AT_SYMLINK_NOFOLLOW);
    return 0;
  }
  if (!S_ISDIR(sb.st_mode)) { /* FIFO, device, socket: recreated, never opened */
    if (mknodat(ddfd, dname, sb.st_mode, sb.st_rdev) != 0) return tw_fail(t, "copy", errno);
    if (fchownat(ddfd, dname, sb.st_uid, sb.st_gid, AT_SYMLINK_NOFOLLOW) != 0) { /* best effort */
    }
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    if (fchmodat(ddfd, dname, sb.st_mode & 07777, 0) != 0 ||
        utimensat(ddfd, dname, ts, AT_SYMLINK_NOFOLLOW) != 0)
      return tw_fail(t, "copy", errno);
    return 0;
  }
  if (depth >= FS_TREE_MAX_DEPTH) return tw_too_deep(t, "copy");
  int sfd = openat(sdfd, sname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (sfd < 0) return errno == ENOTDIR || errno == ELOOP ? cp_changed(t) : tw_fail(t, "copy", errno);
  /* what was opened decides: a directory mounted over since the stat is
   * still refused */
  if (tree_stat(sfd, "", &sb, &mnt) != 0) {
    e = errno;
    close(sfd);
    return tw_fail(t, "copy", e);
  }
  if (mnt != t->mnt) {
    close(sfd);
    return cp_mount(t);
  }
  if (mkdirat(ddfd, dname, 0700) != 0) {
    e = errno;
    close(sfd);
    return tw_fail(t, "copy", e);
  }
  int dfd = openat(ddfd, dname, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    e = errno;
    close(sfd);
    return tw_fail(t, "copy", e);
  }
  DIR *d = fdopendir(sfd);
  if (!d) {
    e = errno;
    close(sfd);
    close(dfd);
    return tw_fail(t, "copy", e);
  }
  int rc = 0;
  struct dirent *de;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    if (is_dot(de->d_name)) continue;
    size_t old = tw_push(t, de->d_name);
    if (old == (size_t)-1) {
      rc = -1;
      break;
    }
    rc = cp_at(t, dirfd(d), de->d_name, dfd, de->d_name, depth + 1);
    tw_pop(t, old);
  }
  closedir(d);
  if (rc == 0) rc = cp_meta_fd(t, dfd, &sb);
  close(dfd);
  return rc;
}

static void tree_temp_name(char *out, size_t n) {
  uint64_t r = 0;
  if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
  }
  snprintf(out, n, "%s%016llx", TREE_TEMP_PREFIX, (unsigned long long)r);
}

int fs_tree_move_xdev(const char *src, const char *dst, const atomic_int *cancel, fs_status *st) {
  const char *sname, *dname;
  uint64_t smnt, dmnt;
  int sdfd = open_parent(src, &sname, st, &smnt);
  if (sdfd < 0) return -1;
  int ddfd = open_parent(dst, &dname, st, &dmnt);
  if (ddfd < 0) {
    close(sdfd);
    return -1;
  }
  char tmp[64];
  tw t;
  int rc = tw_init(&t, src, cancel, st);
  t.mnt = smnt;
  if (rc == 0) {
    tree_temp_name(tmp, sizeof tmp);
    rc = cp_at(&t, sdfd, sname, ddfd, tmp, 0);
    if (rc == 0 && renameat(ddfd, tmp, ddfd, dname) != 0) {
      fs_tree_status_move(st, src, dst, errno);
      rc = -1;
    }
    if (rc != 0) { /* leave no copy behind (its own errors do not matter) */
      fs_status keep = {RPC_OK, NULL};
      tw c;
      if (tw_init(&c, dst, NULL, &keep) == 0) {
        c.mnt = dmnt;
        rm_at(&c, ddfd, tmp, 0);
      }
      tw_done(&c);
      fs_status_clear(&keep);
    } else {
      rc = rm_at(&t, sdfd, sname, 0); /* the copy is in place: drop the source */
    }
  }
  tw_done(&t);
  close(sdfd);
  close(ddfd);
  return rc;
}
