/* volumes — virtiofs volumes of boot.md §5 (only with conch.sharefs=virtiofs).
 *
 * /run/conch/volume/config.json:
 *   {"version":1,"mounts":[{"index":0,"path":"/workspace","readonly":false}]}
 * Unknown fields are ignored; a wrong type or a non-integer/negative index
 * is a parse error.  Each path is cleaned like Go's path.Clean and must be
 * absolute, not "/", and not /proc, /sys, /dev, /run or below them
 * ("Invalid volume mount config").  Mounting: mkdir -p merge<path> one
 * component at a time without following symlinks (a symlink in the sandbox
 * root cannot redirect a volume outside it), bind <src>/<index> onto it,
 * remount read-only when asked.  Any failure unmounts what this module
 * mounted, in reverse order, and reports the reason.
 */
#ifndef CONCH_INIT_VOLUMES_H
#define CONCH_INIT_VOLUMES_H

#include <stddef.h>

#define VOLUMES_MAX 64
#define VOLUMES_PATH_MAX 1024
#define VOLUMES_CONFIG_MAX (1024 * 1024)

typedef struct volume {
  unsigned index;
  char path[VOLUMES_PATH_MAX]; /* cleaned */
  int readonly;
} volume;

/* The mount primitives (real ones by default; tests substitute). */
typedef struct volumes_ops {
  int (*mount)(const char *src, const char *dst, const char *type, unsigned long flags,
               const char *data); /* 0 or -errno */
  int (*umount)(const char *dst); /* 0 or -errno */
} volumes_ops;

/* Go path.Clean into out (outlen >= 2).  Returns 0, -1 when too long. */
int volumes_clean(const char *in, char *out, size_t outlen);
/* 1 if a cleaned path is acceptable as a mount point. */
int volumes_path_allowed(const char *cleaned);
/* Parse config.json.  Returns the number of mounts (0..max) or -1 with a
 * reason in err (parse error, too many mounts, or an invalid path:
 * "Invalid volume mount config"). */
int volumes_parse(const char *buf, size_t n, volume *out, size_t max, char *err, size_t errlen);

/* mkdir -p root<path> without following symlinks.  0 or -errno. */
int volumes_mkdir_in(const char *root, const char *path);

/* Mount vols under merge from src_dir/<index>.  ops NULL = real mounts.
 * Returns 0, or -1 after rolling back, with the reason in err. */
int volumes_mount_all(const char *merge, const char *src_dir, const volume *vols, size_t n,
                      const volumes_ops *ops, char *err, size_t errlen);

/* The whole of §5: mkdir /run/conch/volume, mount virtiofs "conchfs",
 * read config.json, volumes_mount_all.  On failure everything mounted here
 * (including the virtiofs mount) is unmounted.  0 or -1 (err). */
int volumes_setup(const char *merge, char *err, size_t errlen);

#endif
