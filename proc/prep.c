/* prep — see prep.h. */
#include "proc/prep.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

const char *proc_errstr(int e, char *buf, size_t n) {
  char tmp[128];
  const char *s = strerror_r(e, tmp, sizeof tmp);
  snprintf(buf, n, "%s", s);
  if (buf[0]) buf[0] = (char)tolower((unsigned char)buf[0]);
  return buf;
}

static const struct {
  const char *cmd, *ext;
} proc_ext_table[] = {
    {"python", ".py"}, {"python3", ".py"}, {"python2", ".py"}, {"node", ".js"},
    {"nodejs", ".js"}, {"bash", ".sh"},    {"sh", ".sh"},      {"zsh", ".sh"},
    {"fish", ".sh"},   {"lua", ".lua"},    {"ruby", ".rb"},    {"rb", ".rb"},
};

const char *proc_script_ext(const char *cmd) {
  for (size_t i = 0; i < sizeof proc_ext_table / sizeof proc_ext_table[0]; i++)
    if (strcmp(cmd, proc_ext_table[i].cmd) == 0) return proc_ext_table[i].ext;
  return ".py";
}

int proc_path_clean(const char *path, const char *base, char *out, size_t n) {
  char tmp[8192];
  int w;
  if (path[0] == '/')
    w = snprintf(tmp, sizeof tmp, "%s", path);
  else
    w = snprintf(tmp, sizeof tmp, "%s/%s", base, path);
  if (w < 0 || (size_t)w >= sizeof tmp || n < 2) return -1;
  size_t o = 0; /* out holds "/" + components joined by "/" */
  out[o++] = '/';
  const char *p = tmp;
  while (*p) {
    while (*p == '/') p++;
    const char *s = p;
    while (*p && *p != '/') p++;
    size_t len = (size_t)(p - s);
    if (len == 0 || (len == 1 && s[0] == '.')) continue;
    if (len == 2 && s[0] == '.' && s[1] == '.') {
      if (o > 1) { /* drop the last component */
        while (o > 1 && out[o - 1] != '/') o--;
        if (o > 1) o--;
      }
      continue;
    }
    if (o > 1) {
      if (o + 1 >= n) return -1;
      out[o++] = '/';
    }
    if (o + len >= n) return -1;
    memcpy(out + o, s, len);
    o += len;
  }
  out[o] = 0;
  return 0;
}

static int proc_mkdir_rec(char *path, char *err, size_t errn) {
  struct stat st;
  char eb[96];
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return 0;
    snprintf(err, errn, "mkdir %s: %s", path, proc_errstr(ENOTDIR, eb, sizeof eb));
    return -1;
  }
  char *slash = strrchr(path, '/');
  if (slash && slash != path) {
    *slash = 0;
    int r = proc_mkdir_rec(path, err, errn);
    *slash = '/';
    if (r) return r;
  }
  if (mkdir(path, 0755) == 0) return 0;
  int e = errno;
  if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0; /* raced */
  snprintf(err, errn, "mkdir %s: %s", path, proc_errstr(e, eb, sizeof eb));
  return -1;
}

int proc_mkdir_p(const char *dir, char *err, size_t errn) {
  char *p = strdup(dir);
  if (!p) {
    snprintf(err, errn, "mkdir %s: cannot allocate memory", dir);
    return -1;
  }
  int r = proc_mkdir_rec(p, err, errn);
  free(p);
  return r;
}

static void proc_random_name(char *out, size_t n) {
  static const char alpha[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char rnd[32];
  if (n > sizeof rnd) n = sizeof rnd;
  if (getrandom(rnd, n, 0) != (ssize_t)n) { /* never expected; still vary */
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    for (size_t i = 0; i < n; i++) rnd[i] = (unsigned char)(ts.tv_nsec >> (i % 24)) ^ (unsigned char)i;
  }
  for (size_t i = 0; i < n; i++) out[i] = alpha[rnd[i] % (sizeof alpha - 1)];
}

int proc_script_write(const char *dir, const char *ext, const char *content, size_t len,
                      char *path_out, size_t path_n, int *dfd_out, char *err, size_t errn) {
  char eb[96];
  const char *sep = (dir[0] && dir[strlen(dir) - 1] == '/') ? "" : "/";
  size_t name_off = strlen(dir) + strlen(sep);
  /* held until the script is removed: a cwd renamed meanwhile takes the
   * script with it, and the removal still finds it */
  int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
  if (dfd < 0) {
    snprintf(err, errn, "open %s: %s", dir, proc_errstr(errno, eb, sizeof eb));
    return -1;
  }
  int fd = -1;
  for (int attempt = 0; attempt < 16; attempt++) {
    char rnd[13];
    proc_random_name(rnd, 12);
    rnd[12] = 0;
    int w = snprintf(path_out, path_n, "%s%sconch-script-%s%s", dir, sep, rnd, ext);
    if (w < 0 || (size_t)w >= path_n) {
      snprintf(err, errn, "open %s%sconch-script-*%s: %s", dir, sep, ext,
               proc_errstr(ENAMETOOLONG, eb, sizeof eb));
      close(dfd);
      return -1;
    }
    fd = openat(dfd, path_out + name_off, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0 || errno != EEXIST) break;
  }
  if (fd < 0) {
    snprintf(err, errn, "open %s: %s", path_out, proc_errstr(errno, eb, sizeof eb));
    close(dfd);
    return -1;
  }
  size_t off = 0;
  while (off < len) {
    ssize_t k = write(fd, content + off, len - off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      int e = k < 0 ? errno : EIO;
      snprintf(err, errn, "write %s: %s", path_out, proc_errstr(e, eb, sizeof eb));
      close(fd);
      unlinkat(dfd, path_out + name_off, 0);
      close(dfd);
      return -1;
    }
    off += (size_t)k;
  }
  if (fchmod(fd, 0644) != 0 || close(fd) != 0) {
    snprintf(err, errn, "close %s: %s", path_out, proc_errstr(errno, eb, sizeof eb));
    unlinkat(dfd, path_out + name_off, 0);
    close(dfd);
    return -1;
  }
  *dfd_out = dfd;
  return 0;
}

int proc_script_unlink(int dfd, const char *path) {
  const char *slash = strrchr(path, '/');
  int r = unlinkat(dfd, slash ? slash + 1 : path, 0) == 0 || errno == ENOENT ? 0 : -errno;
  close(dfd);
  return r;
}

static int proc_is_executable(const char *path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  if (S_ISDIR(st.st_mode)) return 0;
  return (st.st_mode & 0111) != 0;
}

int proc_lookup(const char *cmd, const char *path_env, const char *cwd, char *out, size_t n,
                char *err, size_t errn) {
  if (strchr(cmd, '/')) {
    if ((size_t)snprintf(out, n, "%s", cmd) >= n) goto notfound;
    return 0;
  }
  if (!path_env) path_env = "";
  const char *p = path_env;
  while (*path_env) {
    const char *e = strchr(p, ':');
    size_t dl = e ? (size_t)(e - p) : strlen(p);
    char cand[4096], check[8192];
    int w;
    if (dl == 0)
      w = snprintf(cand, sizeof cand, "./%s", cmd);
    else
      w = snprintf(cand, sizeof cand, "%.*s/%s", (int)dl, p, cmd);
    if (w > 0 && (size_t)w < sizeof cand) {
      const char *probe = cand;
      if (cand[0] != '/') {
        w = snprintf(check, sizeof check, "%s/%s", cwd, cand);
        probe = (w > 0 && (size_t)w < sizeof check) ? check : NULL;
      }
      if (probe && proc_is_executable(probe)) {
        if ((size_t)snprintf(out, n, "%s", cand) >= n) goto notfound;
        return 0;
      }
    }
    if (!e) break;
    p = e + 1;
  }
notfound:
  snprintf(err, errn, "exec: \"%s\": executable file not found in $PATH", cmd);
  return -1;
}
