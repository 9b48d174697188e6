/* cgroup — see cgroup.h. */
#include "proc/cgroup.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/log.h"
#include "proto/text.h"

#define CG_PID1_MOUNT "/run/conch/cgroup"

struct proc_cg {
  struct proc_cg *next, *prev; /* every live one (shutdown) */
  char name[32];               /* "p<seq>", below the base */
  int fd;                      /* the directory, -1 until created */
  int created, released, removed;
  uv_timer_t deadline;
  uv_fs_event_t ev;
  uv_work_t rm; /* the first rmdir, in the pool (cgroupfs takes a global lock) */
  int rm_err;
  int timer_on, ev_on; /* handle initialised (closed on finish) */
  int handles;
};

struct proc_cgroups {
  uv_loop_t *loop;
  int parent_fd;       /* the daemon's own cgroup */
  int base_fd;         /* <parent>/<base_name> */
  char base_name[48];
  char base_path[1100]; /* as /proc/PID/cgroup shows it */
  char name_buf[1140];  /* proc_cg_name's answer */
  uint64_t seq;
  struct proc_cg *all;
};

/* The hierarchy, once proc_cg_init found one (loop thread only). */
static struct proc_cgroups *cg_state;

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
      if (g->base_fd >= 0) return 0;
      int e = errno;
      unlinkat(g->parent_fd, g->base_name, AT_REMOVEDIR);
      return -e;
    }
    if (errno != EEXIST) return -errno;
  }
  return -EEXIST;
}

int proc_cg_init(uv_loop_t *loop, int pid1) {
  if (cg_state) return 0;
  struct proc_cgroups *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->loop = loop;
  g->parent_fd = g->base_fd = -1;
  char mnt[512], root[512], own[1024], dir[2048];
  const char *how = "mounted";
  if (cg_own_path(own, sizeof own) != 0) {
    LOG_INFO("no cgroup v2 membership (/proc/self/cgroup): commands are tracked by process group");
    free(g);
    return -1;
  }
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
  /* own is relative to the cgroup namespace's root; root is the mount's */
  size_t rl = strcmp(root, "/") == 0 ? 0 : strlen(root);
  if (rl && (strncmp(own, root, rl) != 0 || (own[rl] && own[rl] != '/'))) {
    LOG_INFO("cgroup2 mount %s does not show our cgroup %s: commands are tracked by process group", mnt, own);
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
  cg_state = g;
  LOG_INFO("process cgroups: %s (%s; cgroup.kill %s)", g->base_path, how,
           faccessat(g->base_fd, "cgroup.kill", W_OK, 0) == 0 ? "available" : "missing: cgroup.procs walked");
  return 0;
fail:
  if (g->parent_fd >= 0) close(g->parent_fd);
  free(g);
  return -1;
}

/* ---- one command's cgroup ---- */

struct proc_cg *proc_cg_new(void) {
  struct proc_cgroups *g = cg_state;
  if (!g) return NULL;
  struct proc_cg *cg = calloc(1, sizeof *cg);
  if (!cg) return NULL;
  cg->fd = -1;
  snprintf(cg->name, sizeof cg->name, "p%llu", (unsigned long long)++g->seq);
  cg->next = g->all;
  if (g->all) g->all->prev = cg;
  g->all = cg;
  return cg;
}

int proc_cg_create(struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  if (mkdirat(g->base_fd, cg->name, 0755) != 0 && errno != EEXIST) return -errno;
  cg->created = 1;
  cg->fd = openat(g->base_fd, cg->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return cg->fd < 0 ? -errno : 0;
}

int proc_cg_fd(const struct proc_cg *cg) { return cg ? cg->fd : -1; }

const char *proc_cg_name(const struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  snprintf(g->name_buf, sizeof g->name_buf, "%s/%s", g->base_path, cg->name);
  return g->name_buf;
}

/* Each pid of cgroup.procs gets sig; the count signalled, or -errno.  The
 * file is read in pieces: a tree of any size costs one pass, no buffer
 * that grows with it.  (A pid that exits and is reused between the read
 * and the kill would be hit: cgroup.kill has no such race, so SIGKILL
 * never comes here while the kernel has it.) */
static int cg_each(int dirfd, int (*fn)(pid_t pid, void *arg), void *arg) {
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

static int cg_kill_one(pid_t pid, void *arg) { return kill(pid, *(int *)arg); }

static int cg_signal_each(struct proc_cg *cg, int sig) { return cg_each(cg->fd, cg_kill_one, &sig); }

/* Write pid into the cgroup.procs open at *(int *)arg. */
static int cg_move_one(pid_t pid, void *arg) {
  char b[24];
  int n = snprintf(b, sizeof b, "%d", (int)pid);
  return write(*(int *)arg, b, (size_t)n) == n ? 0 : -1;
}

int proc_cg_signal(struct proc_cg *cg, int sig) {
  if (!cg || cg->fd < 0) return -ESRCH;
  if (sig == SIGKILL) {
    int fd = openat(cg->fd, "cgroup.kill", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
      ssize_t k = write(fd, "1", 1);
      int e = errno;
      close(fd);
      if (k == 1) return 0;
      return -e;
    }
    if (errno != ENOENT) return -errno;
    /* kernel before 5.14: walk cgroup.procs */
  }
  int n = cg_signal_each(cg, sig);
  return n < 0 ? n : n == 0 ? -ESRCH : 0;
}

static void cg_on_close(uv_handle_t *h) {
  struct proc_cg *cg = h->data;
  if (--cg->handles == 0) free(cg);
}

/* The directory is gone (or given up on): drop everything. */
static void cg_finish(struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  if (cg->fd >= 0) close(cg->fd);
  cg->fd = -1;
  if (cg->prev) cg->prev->next = cg->next; else g->all = cg->next;
  if (cg->next) cg->next->prev = cg->prev;
  cg->next = cg->prev = NULL;
  if (cg->timer_on) {
    cg->handles++;
    uv_close((uv_handle_t *)&cg->deadline, cg_on_close);
  }
  if (cg->ev_on) {
    cg->handles++;
    uv_close((uv_handle_t *)&cg->ev, cg_on_close);
  }
  if (!cg->handles) free(cg);
}

/* rmdir; 1 when the directory is gone (or cannot ever go), 0 while busy. */
static int cg_try_remove(struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  if (!cg->created || unlinkat(g->base_fd, cg->name, AT_REMOVEDIR) == 0 || errno == ENOENT) return 1;
  if (errno == EBUSY) return 0; /* still populated (or sub-cgroups of the command's own) */
  LOG_WARN("cannot remove cgroup %s: %s", proc_cg_name(cg), strerror(errno));
  return 1;
}

static void cg_on_events(uv_fs_event_t *h, const char *file, int events, int status) {
  struct proc_cg *cg = h->data;
  if (!cg->removed && cg_try_remove(cg)) {
    cg->removed = 1;
    LOG_DEBUG("cgroup %s emptied and removed", proc_cg_name(cg));
    cg_finish(cg);
  }
}

static void cg_on_deadline(uv_timer_t *t) {
  struct proc_cg *cg = t->data;
  int r = proc_cg_signal(cg, SIGKILL);
  LOG_INFO("deadline: killing what is left in cgroup %s kill=%d", proc_cg_name(cg), r);
}

/* Still populated: watch cgroup.events ("populated 0" when it empties). */
static void cg_linger(struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  char path[128];
  snprintf(path, sizeof path, "/proc/self/fd/%d/%s/cgroup.events", g->base_fd, cg->name);
  if (uv_fs_event_init(g->loop, &cg->ev) == 0) {
    cg->ev_on = 1;
    cg->ev.data = cg;
    int r = uv_fs_event_start(&cg->ev, cg_on_events, path, 0);
    if (r != 0) LOG_WARN("cannot watch %s: %s (removed at shutdown)", path, uv_strerror(r));
  }
  if (cg_try_remove(cg)) { /* emptied before the watch began */
    cg->removed = 1;
    cg_finish(cg);
  }
}

static void cg_rm_run(uv_work_t *w) {
  struct proc_cg *cg = w->data;
  cg->rm_err = unlinkat(cg_state->base_fd, cg->name, AT_REMOVEDIR) == 0 ? 0 : errno;
}

static void cg_rm_done(uv_work_t *w, int status) {
  struct proc_cg *cg = w->data;
  if (status == 0 && cg->rm_err != EBUSY) {
    if (cg->rm_err && cg->rm_err != ENOENT)
      LOG_WARN("cannot remove cgroup %s: %s", proc_cg_name(cg), strerror(cg->rm_err));
    cg->removed = 1;
    cg_finish(cg);
    return;
  }
  cg_linger(cg); /* leftovers (`srv &`) */
}

void proc_cg_release(struct proc_cg *cg, uint64_t deadline_ms) {
  if (!cg || cg->released) return;
  struct proc_cgroups *g = cg_state;
  cg->released = 1;
  if (!cg->created) {
    cg->removed = 1;
    cg_finish(cg);
    return;
  }
  if (deadline_ms > 0 && uv_timer_init(g->loop, &cg->deadline) == 0) {
    cg->timer_on = 1;
    cg->deadline.data = cg;
    uv_timer_start(&cg->deadline, cg_on_deadline, deadline_ms, 0);
  }
  cg->rm.data = cg;
  if (uv_queue_work(g->loop, &cg->rm, cg_rm_run, cg_rm_done) != 0) cg_linger(cg);
}

void proc_cg_shutdown(void) {
  struct proc_cgroups *g = cg_state;
  if (!g) return;
  /* leftovers live on (as without cgroups), in the daemon's own cgroup:
   * nothing of ours stays behind in the hierarchy */
  int to = openat(g->parent_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
  for (struct proc_cg *cg = g->all; cg; cg = cg->next) {
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
