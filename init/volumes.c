/* volumes — virtiofs volumes; see volumes.h. */
#include "init/volumes.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "proto/json.h"

#define VOLUME_SRC_DIR "/run/conch/volume"

int volumes_clean(const char *in, char *out, size_t outlen) {
  size_t n = strlen(in);
  if (outlen < 2) return -1;
  if (n == 0) {
    snprintf(out, outlen, ".");
    return 0;
  }
  int rooted = in[0] == '/';
  size_t w = 0;      /* write index */
  size_t dotdot = 0; /* index below which ".." cannot backtrack */
  size_t r = 0;
  if (rooted) {
    out[w++] = '/';
    r = 1;
    dotdot = 1;
  }
  while (r < n) {
    if (in[r] == '/') {
      r++;
    } else if (in[r] == '.' && (r + 1 == n || in[r + 1] == '/')) {
      r++;
    } else if (in[r] == '.' && in[r + 1] == '.' && (r + 2 == n || in[r + 2] == '/')) {
      r += 2;
      if (w > dotdot) {
        w--;
        while (w > dotdot && out[w] != '/') w--;
      } else if (!rooted) {
        if (w > 0) {
          if (w + 1 >= outlen) return -1;
          out[w++] = '/';
        }
        if (w + 2 >= outlen) return -1;
        out[w++] = '.';
        out[w++] = '.';
        dotdot = w;
      }
    } else {
      if ((rooted && w != 1) || (!rooted && w != 0)) {
        if (w + 1 >= outlen) return -1;
        out[w++] = '/';
      }
      for (; r < n && in[r] != '/'; r++) {
        if (w + 1 >= outlen) return -1;
        out[w++] = in[r];
      }
    }
  }
  if (w == 0) out[w++] = '.';
  out[w] = 0;
  return 0;
}

int volumes_path_allowed(const char *p) {
  static const char *const banned[] = {"/proc", "/sys", "/dev", "/run"};
  if (p[0] != '/' || strcmp(p, "/") == 0) return 0;
  for (size_t i = 0; i < 4; i++) {
    size_t l = strlen(banned[i]);
    if (strncmp(p, banned[i], l) == 0 && (p[l] == 0 || p[l] == '/')) return 0;
  }
  return 1;
}

static int parse_index(const json_value *v, unsigned *out) {
  if (!v || v->type == JSON_NULL) {
    *out = 0;
    return 0;
  }
  if (v->type != JSON_NUMBER) return -1;
  const char *p = v->str;
  if (!*p || strlen(p) > 9) return -1;
  unsigned acc = 0;
  for (; *p; p++) {
    if (*p < '0' || *p > '9') return -1;
    acc = acc * 10 + (unsigned)(*p - '0');
  }
  *out = acc;
  return 0;
}

int volumes_parse(const char *buf, size_t n, volume *out, size_t max, char *err, size_t errlen) {
  char jerr[128] = "";
  json_value *root = json_parse(buf, n, jerr, sizeof jerr);
  if (!root) {
    snprintf(err, errlen, "volume config is not valid JSON: %s", jerr);
    return -1;
  }
  int count = -1;
  const json_value *m;
  if (root->type != JSON_OBJECT) {
    snprintf(err, errlen, "volume config is not a JSON object");
    goto out;
  }
  m = json_get(root, "mounts");
  if (m && m->type != JSON_NULL && m->type != JSON_ARRAY) {
    snprintf(err, errlen, "volume config: mounts is not an array");
    goto out;
  }
  size_t nm = (m && m->type == JSON_ARRAY) ? m->n : 0;
  if (nm > max) {
    snprintf(err, errlen, "volume config: more than %zu mounts", max);
    goto out;
  }
  for (size_t i = 0; i < nm; i++) {
    const json_value *e = &m->items[i];
    if (e->type != JSON_OBJECT) {
      snprintf(err, errlen, "volume config: mount %zu is not an object", i);
      goto out;
    }
    const json_value *path = json_get(e, "path"), *ro = json_get(e, "readonly");
    if (parse_index(json_get(e, "index"), &out[i].index) != 0) {
      snprintf(err, errlen, "volume config: mount %zu has an invalid index", i);
      goto out;
    }
    if (path && path->type != JSON_NULL && path->type != JSON_STRING) {
      snprintf(err, errlen, "volume config: mount %zu path is not a string", i);
      goto out;
    }
    if (ro && ro->type != JSON_NULL && ro->type != JSON_TRUE && ro->type != JSON_FALSE) {
      snprintf(err, errlen, "volume config: mount %zu readonly is not a boolean", i);
      goto out;
    }
    out[i].readonly = ro && ro->type == JSON_TRUE;
    const char *ps = (path && path->type == JSON_STRING) ? path->str : "";
    size_t pl = (path && path->type == JSON_STRING) ? path->len : 0;
    if (memchr(ps, 0, pl) || volumes_clean(ps, out[i].path, sizeof out[i].path) != 0 ||
        !volumes_path_allowed(out[i].path)) {
      snprintf(err, errlen, "Invalid volume mount config");
      goto out;
    }
  }
  count = (int)nm;
out:
  json_free(root);
  return count;
}

int volumes_mkdir_in(const char *root, const char *path) {
  int dfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return -errno;
  char comp[VOLUMES_PATH_MAX];
  const char *p = path;
  int rc = 0;
  while (*p) {
    while (*p == '/') p++;
    if (!*p) break;
    size_t l = strcspn(p, "/");
    if (l >= sizeof comp) {
      rc = -ENAMETOOLONG;
      break;
    }
    memcpy(comp, p, l);
    comp[l] = 0;
    p += l;
    if (strcmp(comp, ".") == 0 || strcmp(comp, "..") == 0) {
      rc = -EINVAL;
      break;
    }
    if (mkdirat(dfd, comp, 0755) != 0 && errno != EEXIST) {
      rc = -errno;
      break;
    }
    int nfd = openat(dfd, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (nfd < 0) {
      rc = errno == ENOTDIR ? -ENOTDIR : -errno; /* a symlink gives ENOTDIR/ELOOP */
      break;
    }
    close(dfd);
    dfd = nfd;
  }
  close(dfd);
  return rc;
}

static int real_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                      const char *data) {
  return mount(src, dst, type, flags, data) == 0 ? 0 : -errno;
}

static int real_umount(const char *dst) { return umount2(dst, MNT_DETACH) == 0 ? 0 : -errno; }

static const volumes_ops real_ops = {real_mount, real_umount};

int volumes_mount_all(const char *merge, const char *src_dir, const volume *vols, size_t n,
                      const volumes_ops *ops, char *err, size_t errlen) {
  if (!ops) ops = &real_ops;
  /* at most two mounts per volume are stacked on one target; remember each
   * target once, in mount order */
  const char **done = calloc(n ? n : 1, sizeof *done);
  char (*tgt)[VOLUMES_PATH_MAX + 512] = calloc(n ? n : 1, sizeof *tgt);
  if (!done || !tgt) {
    free(done);
    free(tgt);
    snprintf(err, errlen, "volumes: out of memory");
    return -1;
  }
  size_t ndone = 0;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    char src[VOLUMES_PATH_MAX];
    snprintf(tgt[i], sizeof tgt[i], "%s%s", merge, vols[i].path);
    snprintf(src, sizeof src, "%s/%u", src_dir, vols[i].index);
    int e = volumes_mkdir_in(merge, vols[i].path);
    if (e) {
      snprintf(err, errlen, "volume %s: mkdir: %s", vols[i].path, strerror(-e));
      rc = -1;
      break;
    }
    e = ops->mount(src, tgt[i], NULL, MS_BIND, NULL);
    if (e) {
      snprintf(err, errlen, "volume %s: bind %s: %s", vols[i].path, src, strerror(-e));
      rc = -1;
      break;
    }
    done[ndone++] = tgt[i];
    if (vols[i].readonly) {
      e = ops->mount(NULL, tgt[i], NULL, MS_BIND | MS_REMOUNT | MS_RDONLY, NULL);
      if (e) {
        snprintf(err, errlen, "volume %s: remount read-only: %s", vols[i].path, strerror(-e));
        rc = -1;
        break;
      }
    }
    LOG_INFO("volume mounted path=%s index=%u readonly=%d", vols[i].path, vols[i].index,
             vols[i].readonly);
  }
  if (rc != 0)
    for (size_t k = ndone; k-- > 0;) {
      int e = ops->umount(done[k]);
      if (e) LOG_WARN("volume rollback: umount %s: %s", done[k], strerror(-e));
    }
  free(done);
  free(tgt);
  return rc;
}

static int mkdir_p(const char *path, mode_t mode) {
  char tmp[VOLUMES_PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -errno;
      *p = '/';
    }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -errno;
  return 0;
}

int volumes_setup(const char *merge, char *err, size_t errlen) {
  int e = mkdir_p(VOLUME_SRC_DIR, 0755);
  if (e) {
    snprintf(err, errlen, "mkdir %s: %s", VOLUME_SRC_DIR, strerror(-e));
    return -1;
  }
  if (mount("conchfs", VOLUME_SRC_DIR, "virtiofs", 0, NULL) != 0) {
    snprintf(err, errlen, "mount virtiofs conchfs on %s: %s", VOLUME_SRC_DIR, strerror(errno));
    return -1;
  }
  char *buf = NULL;
  int rc = -1;
  int fd = open(VOLUME_SRC_DIR "/config.json", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    snprintf(err, errlen, "open %s/config.json: %s", VOLUME_SRC_DIR, strerror(errno));
    goto out;
  }
  buf = malloc(VOLUMES_CONFIG_MAX);
  size_t n = 0;
  while (buf && n < VOLUMES_CONFIG_MAX) {
    ssize_t r = read(fd, buf + n, VOLUMES_CONFIG_MAX - n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      if (r < 0) n = VOLUMES_CONFIG_MAX + 1;
      break;
    }
    n += (size_t)r;
  }
  close(fd);
  if (!buf || n >= VOLUMES_CONFIG_MAX) {
    snprintf(err, errlen, "read %s/config.json: %s", VOLUME_SRC_DIR,
             !buf ? "out of memory" : "read error or larger than 1 MiB");
    goto out;
  }
  volume *vols = calloc(VOLUMES_MAX, sizeof *vols);
  if (!vols) {
    snprintf(err, errlen, "volumes: out of memory");
    goto out;
  }
  int nv = volumes_parse(buf, n, vols, VOLUMES_MAX, err, errlen);
  if (nv >= 0) rc = volumes_mount_all(merge, VOLUME_SRC_DIR, vols, (size_t)nv, NULL, err, errlen);
  free(vols);
out:
  free(buf);
  if (rc != 0 && umount2(VOLUME_SRC_DIR, MNT_DETACH) != 0)
    LOG_WARN("volume rollback: umount %s: %s", VOLUME_SRC_DIR, strerror(errno));
  return rc;
}
