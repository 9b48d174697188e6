/* fs/atomic — see atomic.h. */
#include "fs/atomic.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fs/path.h"

#define AT_TEMP_PREFIX ".conch-upload-"

void fs_atomic_init(fs_atomic *a, const char *target, const atomic_int *canceled) {
  memset(a, 0, sizeof *a);
  a->target = target;
  a->canceled = canceled;
  a->fd = a->dfd = -1;
}

void fs_atomic_abort(fs_atomic *a) {
  if (a->fd >= 0) close(a->fd);
  a->fd = -1;
  if (a->tmp) unlinkat(a->dfd, a->tmp, 0);
  free(a->tmp);
  a->tmp = NULL;
  if (a->dfd >= 0) close(a->dfd);
  a->dfd = -1;
}

static int at_canceled(fs_atomic *a, fs_status *st) {
  if (!a->canceled || !atomic_load(a->canceled)) return 0;
  fs_status_set(st, RPC_CANCELED, "upload canceled");
  return 1;
}

static int at_mkdir_p(const char *dir, fs_status *st) {
  size_t len = strlen(dir);
  char *p = strdup(dir);
  if (!p) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  for (size_t i = 1; i <= len; i++) {
    if (i < len && p[i] != '/') continue;
    p[i] = 0;
    if (mkdir(p, 0755) != 0) {
      int e = errno;
      struct stat sb;
      if (e != EEXIST || stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        if (e == EEXIST) e = ENOTDIR;
        fs_status_os(st, "create directory", dir, e);
        free(p);
        return -1;
      }
    }
    if (i < len) p[i] = '/';
  }
  free(p);
  return 0;
}

static void at_random_hex(const fs_atomic *a, char out[17]) {
  uint64_t r = 0;
#ifdef GRND_INSECURE
  if (getrandom(&r, sizeof r, GRND_INSECURE) != (ssize_t)sizeof r)
#endif
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      r ^= (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^
           (uint64_t)(uintptr_t)a ^ ((uint64_t)getpid() << 32);
    }
  snprintf(out, 17, "%016llx", (unsigned long long)r);
}

/* A fresh ".conch-upload-<random>" into a->tmp; 0 or -1 (status set). */
static int at_temp_name(fs_atomic *a, fs_status *st) {
  if (!a->tmp && !(a->tmp = malloc(sizeof AT_TEMP_PREFIX + 16))) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  char hex[17];
  at_random_hex(a, hex);
  snprintf(a->tmp, sizeof AT_TEMP_PREFIX + 16, "%s%s", AT_TEMP_PREFIX, hex);
  return 0;
}

int fs_atomic_open(fs_atomic *a, fs_status *st) {
  /* the caller may have answered the client already: then create nothing */
  if (at_canceled(a, st)) return -1;
  size_t dl = fs_path_dir_len(a->target);
  char *dir = strndup(a->target, dl);
  int ret = -1;
  if (!dir) {
    fs_status_set(st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  if (dl > 1 && at_mkdir_p(dir, st) < 0) goto out;
  a->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (a->dfd < 0) {
    fs_status_os(st, "create file", a->target, errno);
    goto out;
  }
  const char *base = fs_path_base(a->target);
  struct stat sb;
  if (fstatat(a->dfd, base, &sb, 0) == 0 && S_ISDIR(sb.st_mode)) {
    fs_status_set(st, RPC_INVALID_ARGUMENT, "path is a directory: %s", a->target);
    goto fail;
  }
  if (at_canceled(a, st)) goto fail;
  /* unnamed: nothing to strand whatever happens to the directory */
  a->fd = openat(a->dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  int e = a->fd < 0 ? errno : 0;
  if (e && e != EOPNOTSUPP && e != EISDIR && e != EINVAL) {
    fs_status_os(st, "create file", a->target, e);
    goto fail;
  }
  /* a filesystem without O_TMPFILE: a named one, removed through dfd */
  for (int tries = 0; a->fd < 0; tries++) {
    if (at_temp_name(a, st) < 0) goto fail;
    a->fd = openat(a->dfd, a->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
    if (a->fd < 0 && (errno != EEXIST || tries >= 16)) {
      fs_status_os(st, "create file", a->target, errno);
      free(a->tmp); /* not ours */
      a->tmp = NULL;
      goto fail;
    }
  }
  ret = 0;
  goto out;
fail:
  fs_atomic_abort(a);
out:
  free(dir);
  return ret;
}

int fs_atomic_write(fs_atomic *a, const void *data, size_t len, fs_status *st) {
  const unsigned char *p = data;
  while (len) {
    ssize_t w = write(a->fd, p, len);
    if (w < 0) {
      if (errno == EINTR) continue;
      fs_status_os(st, "write file", a->target, errno);
      fs_atomic_abort(a);
      return -1;
    }
    p += w;
    len -= (size_t)w;
  }
  return 0;
}

/* Give the unnamed temp file its ".conch-upload-*" name in dfd. */
static int at_link_temp(fs_atomic *a, fs_status *st) {
  char proc[32];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", a->fd);
  for (int tries = 0;; tries++) {
    if (at_temp_name(a, st) < 0) return -1;
    /* AT_EMPTY_PATH wants CAP_DAC_READ_SEARCH; /proc/self/fd does not */
    int r = linkat(a->fd, "", a->dfd, a->tmp, AT_EMPTY_PATH);
    if (r != 0 && (errno == EPERM || errno == ENOENT))
      r = linkat(AT_FDCWD, proc, a->dfd, a->tmp, AT_SYMLINK_FOLLOW);
    if (r == 0) return 0;
    if (errno != EEXIST || tries >= 16) {
      fs_status_os(st, "create file", a->target, errno);
      free(a->tmp);
      a->tmp = NULL;
      return -1;
    }
  }
}

int fs_atomic_commit(fs_atomic *a, fs_status *st) {
  const char *base = fs_path_base(a->target);
  if (fdatasync(a->fd) != 0) {
    fs_status_os(st, "sync file", a->target, errno);
    goto fail;
  }
  struct stat sb;
  a->replaced = fstatat(a->dfd, base, &sb, 0) == 0;
  if (a->replaced) {
    /* DECISION (api.md): an existing target keeps its mode — and owner.
     * The owner first: a chown clears the setuid and setgid bits. */
    if (fchown(a->fd, sb.st_uid, sb.st_gid) != 0) { /* best effort */
    }
    if (fchmod(a->fd, sb.st_mode & 07777) != 0) {
      fs_status_os(st, "chmod file", a->target, errno);
      goto fail;
    }
  } else if (fchmod(a->fd, 0644) != 0) {
    fs_status_os(st, "chmod file", a->target, errno);
    goto fail;
  }
  if (at_canceled(a, st)) goto fail; /* the client is gone: leave the target alone */
  if (!a->tmp && at_link_temp(a, st) < 0) goto fail;
  int fd = a->fd;
  a->fd = -1;
  if (close(fd) != 0) {
    fs_status_os(st, "write file", a->target, errno);
    goto fail;
  }
  if (renameat(a->dfd, a->tmp, a->dfd, base) != 0) {
    fs_status_os(st, "rename file", a->target, errno);
    goto fail;
  }
  free(a->tmp);
  a->tmp = NULL;
  close(a->dfd);
  a->dfd = -1;
  return 0;
fail:
  fs_atomic_abort(a);
  return -1;
}
