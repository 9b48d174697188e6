/* cgroup_file — the hierarchy's state and the cgroupfs file access every
 * part of proc/cgroup*.c uses; see cgroup_int.h. */
#include "proc/cgroup_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct proc_cgroups *cg_state;

int cg_write(int dirfd, const char *file, const char *val) {
  int fd = openat(dirfd, file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t n = strlen(val);
  ssize_t k = write(fd, val, n);
  int e = k == (ssize_t)n ? 0 : k < 0 ? -errno : -EIO;
  close(fd);
  return e;
}

int cg_write_u64(int dirfd, const char *file, uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  return cg_write(dirfd, file, b);
}

ssize_t cg_read_file(int dirfd, const char *file, char *b, size_t n) {
  int fd = openat(dirfd, file, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t k;
  do k = read(fd, b, n - 1);
  while (k < 0 && errno == EINTR);
  close(fd);
  if (k < 0) return -1;
  b[k] = 0;
  return k;
}

int cg_key_u64(const char *text, const char *key, uint64_t *v) {
  size_t kl = strlen(key);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, key, kl) == 0 && (l[kl] == ' ' || l[kl] == ':')) {
      *v = strtoull(l + kl + 1 + strspn(l + kl + 1, " "), NULL, 10);
      return 0;
    }
  return -1;
}

/* The file is read in pieces: a tree of any size costs one pass, no buffer
 * that grows with it.  (A pid that exits and is reused between the read
 * and the kill would be hit: cgroup.kill has no such race, so SIGKILL
 * never comes here while the kernel has it.) */
int cg_each(int dirfd, int (*fn)(pid_t pid, void *arg), void *arg) {
  int fd = openat(dirfd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  char buf[4096];
  size_t keep = 0;
  int n = 0;
  for (;;) {
    ssize_t k = read(fd, buf + keep, sizeof buf - 1 - keep);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    size_t len = keep + (size_t)k;
    buf[len] = 0;
    char *p = buf, *nl;
    while ((nl = memchr(p, '\n', (size_t)(buf + len - p)))) {
      long pid = strtol(p, NULL, 10);
      if (pid > 0 && fn((pid_t)pid, arg) == 0) n++;
      p = nl + 1;
    }
    keep = (size_t)(buf + len - p);
    memmove(buf, p, keep);
  }
  close(fd);
  return n;
}
