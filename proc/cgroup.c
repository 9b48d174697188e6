/* cgroup — finding or mounting the cgroup2 hierarchy, the daemon's base
 * cgroup below its own, and their removal at shutdown; see cgroup.h and,
 * for the other parts, cgroup_int.h. */
#include "proc/cgroup_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "proto/text.h"

#define CG_PID1_MOUNT "/run/conch/cgroup"

int proc_cg_enabled(void) { return cg_state != NULL; }

/* ---- finding the hierarchy ---- */

static char *cg_read_small(const char *path, size_t *n) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NULL;
  size_t cap = 16384, len = 0;
  char *b = malloc(cap + 1);
  while (b) {
    ssize_t k = read(fd, b + len, cap - len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break;
    len += (size_t)k;
    if (len == cap) {
      if (cap >= (1u << 22)) break; /* bounded: 4 MiB of mountinfo */
      char *q = realloc(b, cap * 2 + 1);
      if (!q) break;
      b = q;
      cap *= 2;
    }
  }
  close(fd);
  if (b) b[len] = 0;
  *n = len;
  return b;
}

/* mountinfo's octal escapes (\040 for a space) in place */
static void cg_unescape(char *s) { s[text_octal_unescape(s, s, strlen(s))] = 0; }

/* The first cgroup2 mount: its mount point and root; 0 or -1. */
static int cg_find_mount(char *mnt, size_t mn, char *root, size_t rn) {
  size_t n;
  char *mi = cg_read_small("/proc/self/mountinfo", &n);
  if (!mi) return -1;
  int found = -1;
  for (char *line = mi, *next; line && *line && found != 0; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    char *sep = strstr(line, " - ");
    if (!sep || strncmp(sep + 3, "cgroup2 ", 8) != 0) continue;
    /* id parent maj:min root mountpoint ... */
    char *f[5];
    char *save = NULL, *tok = strtok_r(line, " ", &save);
    int k = 0;
    for (; tok && k < 5; tok = strtok_r(NULL, " ", &save)) f[k++] = tok;
    if (k < 5) continue;
    cg_unescape(f[3]);
    cg_unescape(f[4]);
    if (strlen(f[3]) >= rn || strlen(f[4]) >= mn) continue;
    strcpy(root, f[3]);
    strcpy(mnt, f[4]);
    found = 0;
  }
  free(mi);
  return found;
}

/* The daemon's cgroup v2 path ("0::<path>"); 0 or -1. */
static int cg_own_path(char *out, size_t on) {
  size_t n;
  char *s = cg_read_small("/proc/self/cgroup", &n);
  if (!s) return -1;
  int r = -1;
  for (char *line = s, *next; line && *line; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = 0;
    if (strncmp(line, "0::", 3) == 0 && strlen(line + 3) < on) {
      strcpy(out, line + 3);
      r = 0;
      break;
    }
  }
  free(s);
  return r;
}

static int cg_mkdir_p(const char *path) {
  char b[256];
  if (strlen(path) >= sizeof b) return -1;
  strcpy(b, path);
  for (char *p = b + 1; *p; p++)
    if (*p == '/') {
      *p = 0;
      if (mkdir(b, 0755) != 0 && errno != EEXIST) return -1;
      *p = '/';
    }
  return mkdir(b, 0755) == 0 || errno == EEXIST ? 0 : -1;
}

/* Make the base below parent_fd; 0 or -errno. */
static int cg_make_base(struct proc_cgroups *g) {
  for (int i = 0; i < 8; i++) {
    unsigned rnd = (unsigned)(uv_hrtime() ^ ((uint64_t)i << 20) ^ (uint64_t)getpid() * 2654435761u);
    snprintf(g->base_name, sizeof g->base_name, "conch-%d-%08x", (int)getpid(), rnd);
    if (mkdirat(g->parent_fd, g->base_name, 0755) == 0) {
      g->base_fd = openat(g->parent_fd, g->base_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (g->base_fd < 0) {
        int e = errno;
        unlinkat(g->parent_fd, g->base_name, AT_REMOVEDIR);
        return -e;
      }
      /* held for the agent's life (across upgrades: the same open file):
       * another agent's sweep (cg_sweep) passes it by.  A sweep may have
       * removed it between the mkdir and the lock: then another name. */
      if (flock(g->base_fd, LOCK_EX) == 0 && faccessat(g->base_fd, "cgroup.procs", F_OK, 0) == 0) return 0;
      close(g->base_fd);
      g->base_fd = -1;
      continue;
    }
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}

/* Remove the directory dirfd/name if it and every cgroup below it are
 * empty (rmdir refuses a populated one); 0 when it is gone. */
static int cg_rmdir_empty(int at, const char *name) {
  if (unlinkat(at, name, AT_REMOVEDIR) == 0) return 0;
  if (errno != EBUSY && errno != ENOTEMPTY) return -1;
  int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return -1;
  }
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (de->d_type == DT_DIR && de->d_name[0] != '.') cg_rmdir_empty(dirfd(d), de->d_name);
  closedir(d);
  return unlinkat(at, name, AT_REMOVEDIR);
}

/* 1 when pid is a live conch-init here: its argv[0] says so (an upgrade
 * in place keeps it; /proc/PID/exe may not be readable, a memfd's after
 * an upgrade). */
static int cg_pid_is_agent(long pid) {
  char p[64], arg0[512];
  snprintf(p, sizeof p, "/proc/%ld/cmdline", pid);
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, arg0, sizeof arg0 - 1);
  close(fd);
  if (n <= 0) return 0;
  arg0[n] = 0; /* argv[0] ends at its NUL */
  return strstr(arg0, "conch-init") != NULL;
}

/* At start: the bases (conch-<pid>-<hex>) of agents that no longer exist,
 * left beside ours by an agent killed without its shutdown (SIGKILL, a
 * namespace torn down), and empty, are removed with what is below them.
 * A live agent holds an flock on its base, so a locked one is never
 * touched; a base of an older agent (no lock) is left while its pid is a
 * conch-init here, and while it changed in the last CG_SWEEP_IDLE_S when
 * its pid is alive at all (an agent of another pid namespace, a reused
 * pid).  Bases that still hold processes stay. */
#define CG_SWEEP_IDLE_S 600
static void cg_sweep(struct proc_cgroups *g) {
  int fd = openat(g->parent_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return;
  }
  unsigned removed = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    long pid;
    unsigned hex;
    char tail;
    if (de->d_type != DT_DIR || sscanf(de->d_name, "conch-%ld-%8x%c", &pid, &hex, &tail) != 2 ||
        strcmp(de->d_name, g->base_name) == 0)
      continue;
    int bfd = openat(g->parent_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (bfd < 0) continue;
    struct stat st;
    char p[64];
    snprintf(p, sizeof p, "/proc/%ld", pid);
    int alive = pid > 0 && access(p, F_OK) == 0;
    int keep = flock(bfd, LOCK_EX | LOCK_NB) != 0 || (alive && cg_pid_is_agent(pid)) ||
               (alive && (fstat(bfd, &st) != 0 || time(NULL) - st.st_mtime < CG_SWEEP_IDLE_S));
    if (!keep && cg_rmdir_empty(g->parent_fd, de->d_name) == 0) removed++;
    close(bfd); /* the lock with it */
  }
  closedir(d);
  if (removed) LOG_INFO("removed %u empty cgroups of agents that no longer exist", removed);
}

int proc_cg_init(uv_loop_t *loop, int pid1) {
  if (cg_state) return 0;
  struct proc_cgroups *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->loop = loop;
  g->parent_fd = g->base_fd = -1;
  char mnt[512], root[512], own[1024], dir[2048];
  const char *how = "mounted";
  int have = cg_find_mount(mnt, sizeof mnt, root, sizeof root) == 0;
  if (pid1 && !have) {
    /* boot root, before the chroot: the descriptors opened here outlive it */
    if (cg_mkdir_p(CG_PID1_MOUNT) == 0 &&
        mount("cgroup2", CG_PID1_MOUNT, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) {
      snprintf(mnt, sizeof mnt, "%s", CG_PID1_MOUNT);
      snprintf(root, sizeof root, "/");
      have = 1;
      how = "mounted on " CG_PID1_MOUNT;
      LOG_INFO("cgroup2 mounted on %s", CG_PID1_MOUNT);
    } else {
      LOG_WARN("cannot mount cgroup2 on %s: %s", CG_PID1_MOUNT, strerror(errno));
    }
  }
  char tmp[] = "/tmp/.conch-cgroup-XXXXXX";
  int detach = 0;
  if (!have && !pid1 && geteuid() == 0 && mkdtemp(tmp)) {
    /* private and invisible: detached right after the open below */
    if (mount("cgroup2", tmp, "cgroup2", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0) {
      snprintf(mnt, sizeof mnt, "%s", tmp);
      snprintf(root, sizeof root, "/");
      have = detach = 1;
      how = "private mount";
    } else {
      rmdir(tmp);
    }
  }
  if (!have) {
    LOG_INFO("no cgroup v2 hierarchy: commands are tracked by process group");
    free(g);
    return -1;
  }
  /* read after the mount: /proc/self/cgroup has no "0::" line until a
   * cgroup2 hierarchy was mounted once (a fresh kernel's PID 1) */
  if (cg_own_path(own, sizeof own) != 0) {
    LOG_INFO("no cgroup v2 membership (/proc/self/cgroup): commands are tracked by process group");
    if (detach) {
      umount2(tmp, MNT_DETACH);
      rmdir(tmp);
    }
    free(g);
    return -1;
  }
  /* own is relative to the cgroup namespace's root; root is the mount's */
  size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
  if (rl && (strncmp(own, root, rl) != 0 || (own[rl] && own[rl] != '/'))) {
    LOG_INFO("cgroup2 mount %s does not show our cgroup %s: commands are tracked by process group", mnt, own);
    if (detach) {
      umount2(tmp, MNT_DETACH);
      rmdir(tmp);
    }
    goto fail;
  }
  snprintf(dir, sizeof dir, "%s%s", mnt, own + rl);
  g->parent_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (detach) {
    umount2(tmp, MNT_DETACH);
    rmdir(tmp);
  }
  if (g->parent_fd < 0) {
    LOG_INFO("cannot open our cgroup %s (%s): commands are tracked by process group", dir, strerror(errno));
    goto fail;
  }
  int e = cg_make_base(g);
  if (e) {
    LOG_INFO("cannot create a cgroup below %s (%s): commands are tracked by process group", dir, strerror(-e));
    goto fail;
  }
  snprintf(g->base_path, sizeof g->base_path, "%s/%s", strcmp(own, "/") == 0 ? "" : own, g->base_name);
  cg_sweep(g);
  cg_state = g;
  LOG_INFO("process cgroups: %s (%s; cgroup.kill %s)", g->base_path, how,
           faccessat(g->base_fd, "cgroup.kill", W_OK, 0) == 0 ? "available" : "missing: cgroup.procs walked");
  cg_envelope_setup(g, pid1);
  return 0;
fail:
  if (g->parent_fd >= 0) close(g->parent_fd);
  free(g);
  return -1;
}

/* Write pid into the cgroup.procs open at *(int *)arg. */
static int cg_move_one(pid_t pid, void *arg) {
  char b[24];
  int n = snprintf(b, sizeof b, "%d", (int)pid);
  return write(*(int *)arg, b, (size_t)n) == n ? 0 : -1;
}

void proc_cg_shutdown(void) {
  struct proc_cgroups *g = cg_state;
  if (!g) return;
  /* leftovers live on (as without cgroups), in the daemon's own cgroup:
   * nothing of ours stays behind in the hierarchy */
  int to = openat(g->parent_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
  struct proc_cg *cg;
  list_each(cg, &g->all, link) {
    if (!cg->created || unlinkat(g->base_fd, cg->name, AT_REMOVEDIR) == 0 || errno != EBUSY) continue;
    int fd = openat(g->base_fd, cg->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (to >= 0 && fd >= 0) cg_each(fd, cg_move_one, &to);
    if (fd >= 0) close(fd);
    unlinkat(g->base_fd, cg->name, AT_REMOVEDIR);
  }
  if (to >= 0) close(to);
  if (unlinkat(g->parent_fd, g->base_name, AT_REMOVEDIR) != 0)
    LOG_INFO("cgroup %s kept: %s", g->base_path, strerror(errno));
}
