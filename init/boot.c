/* boot — PID 1 boot steps 2–11; see boot.h. */
#include "init/boot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "init/bootutil.h"
#include "init/entrypoint.h"
#include "init/modules.h"
#include "init/volumes.h"


/* ------------------------------------------------------------ helpers */

static int mkdir_p(const char *path, mode_t mode) {
  char tmp[512];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp) return -ENAMETOOLONG;
  for (char *p = tmp + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -errno;
      *p = '/';
    }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -errno;
  return 0;
}

static int is_mounted(const char *mountpoint) {
  size_t n;
  char *mi = boot_read_file("/proc/self/mountinfo", &n);
  if (!mi) return 0;
  int r = boot_mountinfo_has(mi, n, mountpoint);
  free(mi);
  return r;
}

static int do_mount(const char *src, const char *dst, const char *type, unsigned long flags,
                    const char *data) {
  if (mount(src, dst, type, flags, data) == 0) return 0;
  int e = errno;
  LOG_WARN("mount %s on %s (%s) failed: %s", src ? src : "-", dst, type ? type : "bind", strerror(e));
  return -e;
}

/* ------------------------------------------------------------ steps */

static void step_dirs(void) {
  static const char *const dirs[] = {"/proc", "/sys", "/dev", "/dev/pts", "/run", "/var",
                                     "/var/log", "/var/log/conch-init", "/mnt", "/mnt/conch",
                                     "/mnt/conch/upper", "/mnt/conch/work", "/mnt/conch/merge",
                                     "/mnt/disk", "/etc"};
  for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
    int e = mkdir_p(dirs[i], 0755);
    if (e) LOG_WARN("mkdir %s failed: %s", dirs[i], strerror(-e));
    else if (chmod(dirs[i], 0755) != 0) LOG_WARN("chmod %s failed: %s", dirs[i], strerror(errno));
  }
  int e = mkdir_p("/tmp", 01777);
  if (e) LOG_WARN("mkdir /tmp failed: %s", strerror(-e));
  else if (chmod("/tmp", 01777) != 0) LOG_WARN("chmod /tmp failed: %s", strerror(errno));
}

static void step_devnodes(void) {
  static const struct { const char *path; unsigned maj, min; mode_t mode; } nodes[] = {
      {"/dev/null", 1, 3, 0666},   {"/dev/zero", 1, 5, 0666}, {"/dev/full", 1, 7, 0666},
      {"/dev/random", 1, 8, 0666}, {"/dev/urandom", 1, 9, 0666}, {"/dev/tty", 5, 0, 0666},
      {"/dev/console", 5, 1, 0600},
  };
  for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
    if (mknod(nodes[i].path, S_IFCHR | nodes[i].mode, makedev(nodes[i].maj, nodes[i].min)) != 0) {
      if (errno != EEXIST) LOG_WARN("mknod %s failed: %s", nodes[i].path, strerror(errno));
      continue;
    }
    if (chmod(nodes[i].path, nodes[i].mode) != 0)
      LOG_WARN("chmod %s failed: %s", nodes[i].path, strerror(errno));
  }
}

static void step_mounts(void) {
  static const struct { const char *type, *dst, *data; unsigned long flags; } m[] = {
      {"proc", "/proc", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC},
      {"sysfs", "/sys", NULL, MS_NOSUID | MS_NODEV | MS_NOEXEC},
      {"tmpfs", "/tmp", "mode=1777", MS_NOSUID | MS_NODEV},
      {"devtmpfs", "/dev", "mode=0755", MS_NOSUID},
  };
  for (size_t i = 0; i < sizeof m / sizeof m[0]; i++) {
    if (is_mounted(m[i].dst)) {
      LOG_INFO("%s already mounted on %s, kept", m[i].type, m[i].dst);
      continue;
    }
    do_mount(m[i].type, m[i].dst, m[i].type, m[i].flags, m[i].data);
  }
}

static void step_writable(boot_state *b) {
  snprintf(b->upper, sizeof b->upper, "/mnt/conch/upper");
  snprintf(b->work, sizeof b->work, "/mnt/conch/work");
  const char *dev = b->cmd.have_disk ? b->cmd.disk : "/dev/vda";
  if (strcmp(dev, "none") == 0) {
    LOG_INFO("writable layer: RAM (conch.disk=none)");
    return;
  }
  if (!b->cmd.have_disk && access(dev, F_OK) != 0) {
    if (mknod(dev, S_IFBLK | 0600, makedev(253, 0)) != 0 && errno != EEXIST)
      LOG_WARN("mknod %s failed: %s", dev, strerror(errno));
    else
      chmod(dev, 0600);
  }
  if (mount(dev, "/mnt/disk", "ext4", 0, NULL) != 0) {
    LOG_INFO("writable layer: RAM (%s not mountable as ext4: %s)", dev, strerror(errno));
    return;
  }
  int e1 = mkdir_p("/mnt/disk/upper", 0755), e2 = mkdir_p("/mnt/disk/work", 0755);
  if (e1 || e2) {
    LOG_WARN("writable layer: cannot create upper/work on %s; using RAM", dev);
    return;
  }
  snprintf(b->upper, sizeof b->upper, "/mnt/disk/upper");
  snprintf(b->work, sizeof b->work, "/mnt/disk/work");
  LOG_INFO("writable layer: %s (ext4)", dev);
}

void boot_early(boot_state *b, int argc, char **argv) {
  memset(b, 0, sizeof *b);
  /* step 2 */
  setenv("PATH", "/sbin:/bin:/usr/sbin:/usr/bin", 1);
  /* step 3 */
  if (access("/proc/self/mountinfo", R_OK) != 0) {
    mkdir_p("/proc", 0755);
    do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
  }
  /* step 4: argv first, then /proc/cmdline */
  init_cmdline_reset(&b->cmd);
  for (int i = 1; i < argc; i++) init_cmdline_word(&b->cmd, argv[i], strlen(argv[i]));
  size_t n;
  char *cl = boot_read_file("/proc/cmdline", &n);
  if (cl) {
    init_cmdline_parse(&b->cmd, cl, n);
    free(cl);
  } else {
    LOG_WARN("cannot read /proc/cmdline: %s", strerror(errno));
  }
  if (b->cmd.have_sandbox_id) snprintf(conch.sandbox_id, sizeof conch.sandbox_id, "%s", b->cmd.sandbox_id);
  if (b->cmd.have_log_port && b->cmd.log_port) { /* api.md §9 "Operators": kept until vsock is up */
    char spec[64];
    snprintf(spec, sizeof spec, "vsock:%u:%u", b->cmd.have_log_cid ? b->cmd.log_cid : 2, b->cmd.log_port);
    log_stream_set(spec);
  }
  LOG_INFO("boot: sandbox_id=%s sharefs=%s layers=%s disk=%s", b->cmd.have_sandbox_id ? b->cmd.sandbox_id : "-",
           b->cmd.sharefs_virtiofs ? "virtiofs" : "none", b->cmd.have_layers ? "cmdline" : "pmem",
           b->cmd.have_disk ? b->cmd.disk : "/dev/vda");
  step_dirs();    /* step 5 */
  step_devnodes(); /* step 6 */
  step_mounts();  /* step 7 */
  modules_load(b->cmd.have_modules ? b->cmd.modules : NULL, "/etc/conch/modules", NULL); /* §9 */
  step_writable(b); /* step 8 */
}

static int pmem_names(char ***names, size_t *n) {
  DIR *d = opendir("/dev");
  *names = NULL;
  *n = 0;
  if (!d) return -1;
  size_t cap = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (strncmp(de->d_name, "pmem", 4) != 0) continue;
    if (*n == cap) {
      if (cap >= 4096) break; /* bound: more than enough pmem devices */
      size_t nc = cap ? cap * 2 : 16;
      char **nn = realloc(*names, nc * sizeof *nn);
      if (!nn) break;
      *names = nn;
      cap = nc;
    }
    char *s = strdup(de->d_name);
    if (!s) break;
    (*names)[(*n)++] = s;
  }
  closedir(d);
  return 0;
}

static size_t pmem_select(unsigned *idx, size_t max) {
  char **names;
  size_t n;
  if (pmem_names(&names, &n) != 0) return 0;
  size_t cnt = layers_pmem_select((const char *const *)names, n, idx, max);
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return cnt;
}

/* NVDIMM regions the kernel knows (virtio-pmem devices, real NVDIMMs):
 * each gives a /dev/pmemN once nd_pmem has probed it, asynchronously. */
static size_t nd_regions(void) {
  DIR *d = opendir("/sys/bus/nd/devices");
  if (!d) return 0;
  size_t n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (strncmp(de->d_name, "region", 6) == 0 && de->d_name[6] >= '0' && de->d_name[6] <= '9') n++;
  closedir(d);
  return n;
}

int boot_need_pmem_wait(const boot_state *b) {
  if (b->cmd.have_layers) return 0;
  unsigned idx[LAYERS_MAX];
  size_t have = pmem_select(idx, LAYERS_MAX);
  /* with nd_pmem just loaded (boot.md §9) pmem1 may come after pmem0:
   * mounting then would lose a layer, so wait for every region's device */
  return have == 0 || have < nd_regions();
}

static void mount_layer(boot_state *b, const char *dev, const char *mp) {
  int e = mkdir_p(mp, 0755);
  if (e) {
    LOG_WARN("layer %s: mkdir %s: %s", dev, mp, strerror(-e));
    return;
  }
  if (do_mount(dev, mp, "erofs", MS_RDONLY, NULL) != 0) return;
  snprintf(b->lower[b->nlower++], BOOT_PATH_MAX, "%s", mp);
  LOG_INFO("read-only layer %s mounted on %s", dev, mp);
}

void boot_layers(boot_state *b) {
  char mp[BOOT_PATH_MAX], dev[BOOT_PATH_MAX];
  b->nlower = 0;
  if (b->cmd.have_layers) {
    for (size_t i = 0; i < b->cmd.nlayers && b->nlower < LAYERS_MAX; i++) {
      snprintf(mp, sizeof mp, "/mnt/conch/layer%zu", i);
      mount_layer(b, b->cmd.layers[i], mp);
    }
  } else {
    unsigned idx[LAYERS_MAX];
    size_t n = pmem_select(idx, LAYERS_MAX);
    for (size_t i = 0; i < n; i++) {
      snprintf(dev, sizeof dev, "/dev/pmem%u", idx[i]);
      snprintf(mp, sizeof mp, "/mnt/conch/pmem%u", idx[i]);
      mount_layer(b, dev, mp);
    }
  }
  if (b->nlower == 0) {
    LOG_WARN("no read-only layer mounted; no overlay");
    return;
  }
  const char *lower[LAYERS_MAX];
  for (size_t i = 0; i < b->nlower; i++) lower[i] = b->lower[i];
  char opts[4096];
  if (layers_overlay_opts(opts, sizeof opts, lower, b->nlower, b->upper, b->work) != 0) {
    LOG_WARN("overlay options do not fit one page; no overlay");
    return;
  }
  if (do_mount("overlay", BOOT_MERGE, "overlay", 0, opts) == 0)
    LOG_INFO("overlay mounted on %s layers=%zu", BOOT_MERGE, b->nlower);
}

static int fix_passwd(void) {
  const char *path = BOOT_MERGE "/etc/passwd";
  size_t n;
  char *in = boot_read_file(path, &n);
  if (!in) {
    if (errno != ENOENT) LOG_WARN("read %s: %s", path, strerror(errno));
    return 0;
  }
  char *out;
  size_t outn;
  int r = boot_passwd_fix(in, n, &out, &outn);
  free(in);
  if (r <= 0) return r;
  struct stat st;
  if (stat(path, &st) != 0) st.st_mode = 0644, st.st_uid = 0, st.st_gid = 0;
  const char *tmp = BOOT_MERGE "/etc/.passwd.conch-init";
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  int ok = fd >= 0;
  size_t off = 0;
  while (ok && off < outn) {
    ssize_t w = write(fd, out + off, outn - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) ok = 0;
    else off += (size_t)w;
  }
  if (ok && (fchown(fd, st.st_uid, st.st_gid) != 0 || fchmod(fd, st.st_mode & 07777) != 0)) ok = 0;
  if (fd >= 0 && close(fd) != 0) ok = 0;
  if (ok && rename(tmp, path) != 0) ok = 0;
  if (!ok) {
    LOG_WARN("rewrite %s: %s", path, strerror(errno));
    unlink(tmp);
  } else {
    LOG_INFO("passwd: root home set to /root");
  }
  free(out);
  return ok ? 1 : -1;
}


/* The log directory is the agent's: a real directory (not a link the
 * image put there), root's, 0700.  0 or -errno. */
static int own_log_dir(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  int e = fchown(fd, 0, 0) != 0 || fchmod(fd, 0700) != 0 ? -errno : 0;
  close(fd);
  return e;
}

int boot_prepare_root(boot_state *b, int (*bind_before_chroot)(void *arg, char *err, size_t errlen),
                      void *arg, char *err, size_t errlen) {
  /* step 10 */
  struct stat st;
  b->merge_ready = stat(BOOT_MERGE "/usr", &st) == 0;
  if (!b->merge_ready) {
    LOG_WARN("Overlay rootfs not found");
    return bind_before_chroot ? bind_before_chroot(arg, err, errlen) : 0;
  }
  /* step 11 */
  int e = mkdir_p(BOOT_MERGE "/root", 0700);
  if (e) LOG_WARN("mkdir %s/root: %s", BOOT_MERGE, strerror(-e));
  fix_passwd();
  static const char *const binds[] = {"/proc", "/sys", "/dev", "/tmp"};
  for (size_t i = 0; i < 4; i++) {
    char dst[BOOT_PATH_MAX];
    snprintf(dst, sizeof dst, "%s%s", BOOT_MERGE, binds[i]);
    if ((e = mkdir_p(dst, 0755)) != 0) LOG_WARN("mkdir %s: %s", dst, strerror(-e));
    do_mount(binds[i], dst, NULL, MS_BIND, NULL);
  }
  if (b->cmd.sharefs_virtiofs) {
    char verr[512];
    if (volumes_setup(BOOT_MERGE, verr, sizeof verr) != 0) {
      snprintf(err, errlen, "volumes: %s", verr);
      return -1;
    }
  }
  const char *pts = BOOT_MERGE "/dev/pts";
  if ((e = mkdir_p(pts, 0755)) != 0) LOG_WARN("mkdir %s: %s", pts, strerror(-e));
  if (!is_mounted(pts))
    do_mount("devpts", pts, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620,gid=5");
  const char *logdir = BOOT_MERGE "/var/log/conch-init";
  /* the agent's own: its lines name other users' commands (api.md §9 "Operators") */
  if ((e = mkdir_p(logdir, 0700)) != 0) LOG_WARN("mkdir %s: %s", logdir, strerror(-e));
  else if ((e = own_log_dir(logdir)) != 0) LOG_WARN("log directory %s: %s", logdir, strerror(-e));
  else if ((e = log_open_file(BOOT_MERGE "/var/log/conch-init/conch-init.log")) != 0)
    LOG_WARN("open log file: %s", strerror(-e));
  if (bind_before_chroot && bind_before_chroot(arg, err, errlen) != 0) return -1;
  if (chroot(BOOT_MERGE) != 0) {
    snprintf(err, errlen, "chroot %s: %s", BOOT_MERGE, strerror(errno));
    return -1;
  }
  if (chdir("/") != 0) {
    snprintf(err, errlen, "chdir /: %s", strerror(errno));
    return -1;
  }
  b->chrooted = 1;
  /* the same file, now by its path inside the root (rotation renames it) */
  if (log_file_fd() >= 0 && (e = log_open_file("/var/log/conch-init/conch-init.log")) != 0)
    LOG_WARN("reopen log file: %s", strerror(-e));
  b->have_entrypoint = entrypoint_usable(ENTRYPOINT_PATH);
  b->services_required = b->have_entrypoint && access(ENTRYPOINT_ENVD_FEATURE, F_OK) == 0;
  LOG_INFO("sandbox root ready entrypoint=%s services_required=%d",
           b->have_entrypoint ? ENTRYPOINT_PATH : "none", b->services_required);
  return 0;
}
