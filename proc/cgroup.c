/* cgroup — see cgroup.h. */
#include "proc/cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/list.h"
#include "core/log.h"
#include "server/rpc.h"
#include "proto/handover.pb-c.h"
#include "proto/text.h"

#define CG_PID1_MOUNT "/run/conch/cgroup"

struct proc_cg {
  list_node link;              /* in all: every live one (shutdown), newest first */
  char name[32];               /* "p<seq>", below the base */
  int fd;                      /* the directory, -1 until created */
  int created, released, removed, finished;
  proc_cg_limits limits;
  uv_timer_t deadline;
  uv_fs_event_t ev;
  int rm_err; /* the pool job's first rmdir (usage read there too: cgroupfs takes a global lock) */
  proc_cg_usage usage; /* read by that job */
  proc_cg_exit_cb on_exit;
  proc_cg_empty_cb on_empty; /* set while lingering */
  void *arg;
  int timer_on, ev_on; /* handle initialised (closed on finish) */
  int handles;
  int pins; /* pool readers: the descriptor stays open */
};

struct proc_cgroups {
  uv_loop_t *loop;
  int parent_fd;       /* the daemon's own cgroup */
  int base_fd;         /* <parent>/<base_name> */
  char base_name[48];
  char base_path[1100]; /* as /proc/PID/cgroup shows it */
  char name_buf[1140];  /* proc_cg_name's answer */
  uint64_t seq;
  list_node all;
  int envelope;         /* cpu, memory, pids enabled below the base */
  char why[256];        /* no envelope: why */
  uint64_t mem_max, pids_max; /* the workload's, as applied */
  /* The next command's cgroup, made ahead in the pool: with the
   * controllers, mkdir builds a memory cgroup (tests/bench/vm-envelope.sh:
   * StartProcess p50 +6.7 % with the mkdir on the start's path); without
   * them too (mkdir + open, ~50 µs of the round trip, profile.md). */
  struct proc_cg *spare;
  int spare_busy; /* its mkdir is out in the pool */
  int spare_stale; /* a kill of the whole base ran while it was made: dropped when it is */
  unsigned jobs;   /* pool jobs out (spare mkdir, accounting + rmdir): an upgrade waits for them */
};

#define CG_CONTROLLERS "+cpu +memory +pids"
#define CG_WORKLOAD_WEIGHT "10" /* the daemon: 100 (a nice-0 task in the root, or its leaf) */
#define CG_AGENT_WEIGHT "1000"  /* a standalone daemon's own leaf */

/* The hierarchy, once proc_cg_init found one (loop thread only). */
static struct proc_cgroups *cg_state;

int proc_cg_enabled(void) { return cg_state != NULL; }
int proc_cg_envelope(void) { return cg_state && cg_state->envelope; }
const char *proc_cg_why(void) {
  return cg_state ? cg_state->why : "no cgroup v2 hierarchy (commands are tracked by process group)";
}
uint64_t proc_cg_workload_memory_max(void) { return proc_cg_envelope() ? __atomic_load_n(&cg_state->mem_max, __ATOMIC_RELAXED) : 0; }
uint64_t proc_cg_workload_pids_max(void) { return proc_cg_envelope() ? __atomic_load_n(&cg_state->pids_max, __ATOMIC_RELAXED) : 0; }

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

/* One value into a cgroup file below dirfd; 0 or -errno. */
static int cg_write(int dirfd, const char *file, const char *val) {
  int fd = openat(dirfd, file, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  size_t n = strlen(val);
  ssize_t k = write(fd, val, n);
  int e = k == (ssize_t)n ? 0 : k < 0 ? -errno : -EIO;
  close(fd);
  return e;
}

static int cg_write_u64(int dirfd, const char *file, uint64_t v) {
  char b[24];
  snprintf(b, sizeof b, "%llu", (unsigned long long)v);
  return cg_write(dirfd, file, b);
}

/* A small cgroup file (≤ 4 KiB: cpu.stat, memory.events, a controllers
 * list) into b as a string; its length or -1. */
static ssize_t cg_read_file(int dirfd, const char *file, char *b, size_t n) {
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

uint64_t proc_cg_workload_memory_current(void) {
  char b[64];
  if (!proc_cg_envelope() || cg_read_file(cg_state->base_fd, "memory.current", b, sizeof b) < 0) return 0;
  return strtoull(b, NULL, 10);
}

/* "key value" lines (cpu.stat, memory.events, meminfo): the value of key. */
static int cg_key_u64(const char *text, const char *key, uint64_t *v) {
  size_t kl = strlen(key);
  for (const char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
    if (strncmp(l, key, kl) == 0 && (l[kl] == ' ' || l[kl] == ':')) {
      *v = strtoull(l + kl + 1 + strspn(l + kl + 1, " "), NULL, 10);
      return 0;
    }
  return -1;
}

/* A word list (cgroup.controllers) holds word. */
static int cg_has_word(const char *list, const char *word) {
  size_t wl = strlen(word);
  for (const char *p = list; (p = strstr(p, word)) != NULL; p += wl)
    if ((p == list || p[-1] == ' ') && (p[wl] == 0 || p[wl] == ' ' || p[wl] == '\n')) return 1;
  return 0;
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

/* ---- the workload envelope ---- */

uint64_t proc_cg_mem_total(void) {
  char b[4096];
  uint64_t kb = 0;
  if (cg_read_file(AT_FDCWD, "/proc/meminfo", b, sizeof b) < 0 || cg_key_u64(b, "MemTotal", &kb) != 0) return 0;
  return kb * 1024;
}

/* api.md §9: MemTotal − reserve, reserve = MemTotal/8 within [32, 256] MiB
 * — kept free on top of what the kernel and the boot image already hold
 * (MemTotal − MemAvailable now, ~40 MiB on a 512 MiB guest of Debian's
 * kernel).  Measured in the microVM: with the plain formula a fork bomb
 * filled the workload to within 17 MiB of the machine, and the agent's own
 * allocations stalled in reclaim (/health 3.8–13 s, once the global OOM
 * killer); 35 MiB lower, /health stayed under 10 ms. */
static uint64_t cg_default_memory_max(void) {
  char b[4096];
  uint64_t total_kb = 0, avail_kb = 0;
  if (cg_read_file(AT_FDCWD, "/proc/meminfo", b, sizeof b) < 0 || cg_key_u64(b, "MemTotal", &total_kb) != 0)
    return 0;
  if (cg_key_u64(b, "MemAvailable", &avail_kb) != 0 || avail_kb > total_kb) avail_kb = total_kb;
  uint64_t total = total_kb * 1024, held = (total_kb - avail_kb) * 1024, reserve = total / 8;
  if (reserve < (32u << 20)) reserve = 32u << 20;
  if (reserve > (256u << 20)) reserve = 256u << 20;
  uint64_t keep = reserve + held;
  uint64_t max = total > keep + (16u << 20) ? total - keep : 16u << 20;
  return max - max % 4096; /* what memory.max reads back: whole pages */
}

/* api.md §9: threads-max − 256, at least 64. */
static uint64_t cg_default_pids_max(void) {
  char b[64];
  uint64_t tm = 0;
  if (cg_read_file(AT_FDCWD, "/proc/sys/kernel/threads-max", b, sizeof b) > 0) tm = strtoull(b, NULL, 10);
  return tm > 256 + 64 ? tm - 256 : 64;
}

/* Standalone: leave the daemon's own cgroup (which may then enable
 * controllers: a cgroup with processes cannot) for a leaf beside the base;
 * only when the daemon is alone there (a delegated service cgroup). */
static int cg_leave_own(struct proc_cgroups *g) {
  char b[64], me[24];
  snprintf(me, sizeof me, "%d\n", (int)getpid());
  if (cg_read_file(g->parent_fd, "cgroup.procs", b, sizeof b) < 0 || strcmp(b, me) != 0) return -EBUSY;
  char leaf[48];
  snprintf(leaf, sizeof leaf, "conch-agent-%d", (int)getpid());
  if (mkdirat(g->parent_fd, leaf, 0755) != 0 && errno != EEXIST) return -errno;
  int fd = openat(g->parent_fd, leaf, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -errno;
  int e = cg_write(fd, "cgroup.procs", "0");
  if (e == 0) e = cg_write(g->parent_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  if (e == 0) cg_write(fd, "cpu.weight", CG_AGENT_WEIGHT);
  close(fd);
  return e;
}

/* Loop, at init: make the base the workload cgroup, or say in g->why why not. */
static void cg_envelope_setup(struct proc_cgroups *g, int pid1) {
  char b[512], missing[32] = "";
  const char *off = getenv("CONCH_ENVELOPE"); /* 0: none (benchmarks: tests/bench/vm-envelope.sh) */
  if (off && strcmp(off, "0") == 0) {
    snprintf(g->why, sizeof g->why, "the workload envelope is turned off (CONCH_ENVELOPE=0)");
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  if (cg_read_file(g->parent_fd, "cgroup.controllers", b, sizeof b) < 0) b[0] = 0;
  static const char *const need[] = {"cpu", "memory", "pids"};
  for (int i = 0; i < 3; i++)
    if (!cg_has_word(b, need[i]))
      snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "", need[i]);
  if (missing[0]) {
    snprintf(g->why, sizeof g->why, "the cgroup v2 controllers %s are not available (bound to cgroup v1, or not in this kernel)",
             missing);
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  int e = cg_write(g->parent_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  if (e == -EBUSY && !pid1) {
    e = cg_leave_own(g);
    if (e == -EBUSY) {
      snprintf(g->why, sizeof g->why, "the daemon's cgroup holds other processes, so it cannot enable controllers");
      LOG_WARN("no workload envelope: %s", g->why);
      return;
    }
  }
  const char *step = "enable cpu, memory and pids for the daemon's cgroup";
  if (e == 0) {
    step = "enable cpu, memory and pids below the base";
    e = cg_write(g->base_fd, "cgroup.subtree_control", CG_CONTROLLERS);
  }
  uint64_t mem = cg_default_memory_max(), pids = cg_default_pids_max();
  if (e == 0 && mem == 0) {
    step = "read MemTotal from /proc/meminfo";
    e = -EIO;
  }
  if (e == 0) {
    step = "set the workload's memory.max";
    e = cg_write_u64(g->base_fd, "memory.max", mem);
  }
  if (e == 0) {
    step = "set the workload's pids.max";
    e = cg_write_u64(g->base_fd, "pids.max", pids);
  }
  if (e == 0) {
    step = "set the workload's cpu.weight";
    e = cg_write(g->base_fd, "cpu.weight", CG_WORKLOAD_WEIGHT);
  }
  if (e) {
    snprintf(g->why, sizeof g->why, "cannot %s: %s", step, strerror(-e));
    LOG_WARN("no workload envelope: %s", g->why);
    return;
  }
  g->mem_max = mem;
  g->pids_max = pids;
  g->envelope = 1;
  LOG_INFO("workload envelope %s: memory.max=%llu pids.max=%llu cpu.weight=%s", g->base_path,
           (unsigned long long)mem, (unsigned long long)pids, CG_WORKLOAD_WEIGHT);
}

int proc_cg_workload_set(uint64_t memory_max, uint64_t pids_max) {
  struct proc_cgroups *g = cg_state;
  if (!g || !g->envelope) return -ENOSYS;
  int e = 0;
  memory_max -= memory_max % 4096; /* whole pages, as memory.max reads back */
  if (memory_max && (e = cg_write_u64(g->base_fd, "memory.max", memory_max)) == 0)
    __atomic_store_n(&g->mem_max, memory_max, __ATOMIC_RELAXED);
  if (e == 0 && pids_max && (e = cg_write_u64(g->base_fd, "pids.max", pids_max)) == 0)
    __atomic_store_n(&g->pids_max, pids_max, __ATOMIC_RELAXED);
  return e;
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

/* ---- one command's cgroup ---- */

static struct proc_cg *cg_alloc(struct proc_cgroups *g) {
  struct proc_cg *cg = calloc(1, sizeof *cg);
  if (!cg) return NULL;
  cg->fd = -1;
  snprintf(cg->name, sizeof cg->name, "p%llu", (unsigned long long)++g->seq);
  list_insert_head(&g->all, &cg->link);
  return cg;
}

static void cg_spare_run(void *data) {
  struct proc_cg *cg = data;
  if (mkdirat(cg_state->base_fd, cg->name, 0755) == 0 || errno == EEXIST) {
    cg->created = 1;
    cg->fd = openat(cg_state->base_fd, cg->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  }
}

static void cg_spare_done(void *data, int canceled) {
  struct proc_cgroups *g = cg_state;
  struct proc_cg *cg = data;
  g->spare_busy = 0;
  g->jobs--;
  if (canceled || cg->fd < 0 || g->spare_stale) { /* made on the start's path instead */
    g->spare = NULL;
    g->spare_stale = 0;
    proc_cg_release(cg);
  }
}

void proc_cg_spare_discard(void) {
  struct proc_cgroups *g = cg_state;
  if (!g || !g->spare) return;
  if (g->spare_busy) {
    g->spare_stale = 1;
    return;
  }
  proc_cg_release(g->spare);
  g->spare = NULL;
  proc_cg_refill();
}

/* Make the next spare unless one is there or on its way. */
void proc_cg_refill(void) {
  struct proc_cgroups *g = cg_state;
  if (!g || g->spare || g->spare_busy) return;
  struct proc_cg *cg = cg_alloc(g);
  if (!cg) return;
  g->spare = cg;
  g->spare_busy = 1;
  g->jobs++;
  if (!rpc_work_submit(NULL, cg_spare_run, cg_spare_done, cg)) {
    g->jobs--;
    g->spare = NULL;
    g->spare_busy = 0;
    proc_cg_release(cg);
  }
}

struct proc_cg *proc_cg_new(const proc_cg_limits *limits) {
  struct proc_cgroups *g = cg_state;
  if (!g) return NULL;
  struct proc_cg *cg = NULL;
  if (g->spare && !g->spare_busy) { /* made and opened: proc_cg_create only applies limits */
    cg = g->spare;
    g->spare = NULL;
  } else {
    cg = cg_alloc(g);
  }
  if (cg && limits) cg->limits = *limits;
  return cg;
}

int proc_cg_create(struct proc_cg *cg, const char **what) {
  struct proc_cgroups *g = cg_state;
  *what = "mkdir";
  if (cg->fd < 0) { /* not a spare */
    if (mkdirat(g->base_fd, cg->name, 0755) != 0 && errno != EEXIST) return -errno;
    cg->created = 1;
    cg->fd = openat(g->base_fd, cg->name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cg->fd < 0) return -errno;
  }
  const proc_cg_limits *l = &cg->limits;
  int e = 0;
  if (l->memory_max && (e = cg_write_u64(cg->fd, "memory.max", l->memory_max)) != 0) *what = "memory.max";
  if (!e && l->pids_max && (e = cg_write_u64(cg->fd, "pids.max", l->pids_max)) != 0) *what = "pids.max";
  if (!e && l->cpu_millis) {
    char b[48];
    snprintf(b, sizeof b, "%llu 100000", (unsigned long long)l->cpu_millis * 100);
    if ((e = cg_write(cg->fd, "cpu.max", b)) != 0) *what = "cpu.max";
  }
  return e;
}

int proc_cg_fd(const struct proc_cg *cg) { return cg ? cg->fd : -1; }

const char *proc_cg_name(const struct proc_cg *cg) {
  struct proc_cgroups *g = cg_state;
  snprintf(g->name_buf, sizeof g->name_buf, "%s/%s", g->base_path, cg->name);
  return g->name_buf;
}

void proc_cg_read_usage(const struct proc_cg *cg, proc_cg_usage *u) {
  memset(u, 0, sizeof *u);
  if (!cg || cg->fd < 0) return;
  char b[1024];
  /* cpu.stat is a core file: there without any controller */
  if (cg_read_file(cg->fd, "cpu.stat", b, sizeof b) > 0 && cg_key_u64(b, "user_usec", &u->user_usec) == 0 &&
      cg_key_u64(b, "system_usec", &u->system_usec) == 0)
    u->have_cpu = 1;
  if (!cg_state->envelope) return;
  if (cg_read_file(cg->fd, "memory.peak", b, sizeof b) > 0) { /* Linux ≥ 5.19 */
    u->memory_peak = strtoull(b, NULL, 10);
    u->have_memory = 1;
  }
  uint64_t kills = 0;
  if (cg_read_file(cg->fd, "memory.events", b, sizeof b) > 0 && cg_key_u64(b, "oom_kill", &kills) == 0)
    u->oom_killed = kills > 0;
}

/* Each pid of cgroup.procs gets fn; the count it accepted, or -errno.  The
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
static int cg_count_one(pid_t pid, void *arg) { return 0; }

static int cg_signal_each(int dirfd, int sig) { return cg_each(dirfd, cg_kill_one, &sig); }

/* Write pid into the cgroup.procs open at *(int *)arg. */
static int cg_move_one(pid_t pid, void *arg) {
  char b[24];
  int n = snprintf(b, sizeof b, "%d", (int)pid);
  return write(*(int *)arg, b, (size_t)n) == n ? 0 : -1;
}

int proc_cg_signal(struct proc_cg *cg, int sig) {
  if (!cg || cg->fd < 0) return -ESRCH;
  if (sig == SIGKILL) {
    int e = cg_write(cg->fd, "cgroup.kill", "1");
    if (e != -ENOENT) return e;
    /* kernel before 5.14: walk cgroup.procs */
  }
  int n = cg_signal_each(cg->fd, sig);
  return n < 0 ? n : n == 0 ? -ESRCH : 0;
}

int proc_cg_signal_all(int sig) {
  struct proc_cgroups *g = cg_state;
  if (!g) return -ENOSYS;
  if (sig == SIGKILL) {
    int e = cg_write(g->base_fd, "cgroup.kill", "1"); /* the whole workload, new forks included */
    if (e != -ENOENT) return e;
  }
  int dfd = openat(g->base_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
  if (!d) {
    int e = -errno;
    if (dfd >= 0) close(dfd);
    return e;
  }
  int n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (de->d_name[0] != 'p' || de->d_type != DT_DIR) continue;
    int fd = openat(g->base_fd, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) continue;
    int k = cg_signal_each(fd, sig);
    if (k > 0) n += k;
    close(fd);
  }
  closedir(d);
  return n;
}

static void cg_maybe_free(struct proc_cg *cg) {
  if (!cg->finished || cg->handles || cg->pins) return;
  if (cg->fd >= 0) close(cg->fd);
  free(cg);
}

void proc_cg_pin(struct proc_cg *cg) { cg->pins++; }

void proc_cg_unpin(struct proc_cg *cg) {
  cg->pins--;
  cg_maybe_free(cg);
}

static void cg_on_close(uv_handle_t *h) {
  struct proc_cg *cg = h->data;
  cg->handles--;
  cg_maybe_free(cg);
}

/* The directory is gone (or given up on): drop everything; a lingering
 * owner hears it. */
static void cg_finish(struct proc_cg *cg) {
  list_remove(&cg->link);
  cg->finished = 1;
  if (cg->timer_on) {
    cg->handles++;
    uv_close((uv_handle_t *)&cg->deadline, cg_on_close);
  }
  if (cg->ev_on) {
    cg->handles++;
    uv_close((uv_handle_t *)&cg->ev, cg_on_close);
  }
  proc_cg_empty_cb on_empty = cg->on_empty;
  cg->on_empty = NULL;
  if (on_empty) on_empty(cg->arg);
  cg_maybe_free(cg);
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

/* cgroup.events says "populated 1" (or cannot be read: assume so). */
static int cg_populated(const struct proc_cg *cg) {
  char b[256];
  if (cg->fd < 0 || cg_read_file(cg->fd, "cgroup.events", b, sizeof b) < 0) return 1;
  return strstr(b, "populated 0") == NULL;
}

/* Pool: the accounting first (the files go with the directory), then the
 * first rmdir; a busy cgroup's processes are counted. */
static void cg_rm_run(void *data) {
  struct proc_cg *cg = data;
  if (cg->on_exit) proc_cg_read_usage(cg, &cg->usage);
  cg->rm_err = unlinkat(cg_state->base_fd, cg->name, AT_REMOVEDIR) == 0 ? 0 : errno;
  if (cg->rm_err == EBUSY && cg->on_exit) {
    int n = cg_each(cg->fd, cg_count_one, NULL);
    cg->usage.nprocs = n > 0 ? n : 0;
  }
}

static void cg_rm_done(void *data, int canceled) {
  struct proc_cg *cg = data;
  cg_state->jobs--;
  proc_cg_exit_cb on_exit = cg->on_exit;
  cg->on_exit = NULL;
  if (!canceled && cg->rm_err != EBUSY) {
    if (cg->rm_err && cg->rm_err != ENOENT)
      LOG_WARN("cannot remove cgroup %s: %s", proc_cg_name(cg), strerror(cg->rm_err));
    cg->removed = 1;
    cg->on_empty = NULL;
    if (on_exit) on_exit(cg->arg, &cg->usage, 0);
    cg_finish(cg);
    return;
  }
  if (on_exit) on_exit(cg->arg, &cg->usage, 1);
  cg_linger(cg); /* leftovers (`srv &`) */
}

void proc_cg_exited(struct proc_cg *cg, uint64_t deadline_ms, proc_cg_exit_cb on_exit,
                    proc_cg_empty_cb on_empty, void *arg) {
  if (!cg || cg->released) return;
  struct proc_cgroups *g = cg_state;
  cg->released = 1;
  cg->on_exit = on_exit;
  cg->on_empty = on_empty;
  cg->arg = arg;
  if (!cg->created) {
    cg->removed = 1;
    cg->on_empty = NULL;
    if (on_exit) on_exit(arg, &cg->usage, 0);
    cg_finish(cg);
    return;
  }
  if (deadline_ms > 0 && uv_timer_init(g->loop, &cg->deadline) == 0) {
    cg->timer_on = 1;
    cg->deadline.data = cg;
    uv_timer_start(&cg->deadline, cg_on_deadline, deadline_ms, 0);
  }
  if (on_exit && !cg_populated(cg)) {
    /* the common end: nothing left, so the usage is a few small reads and
     * the end event need not wait for the pool (only the rmdir goes there) */
    proc_cg_read_usage(cg, &cg->usage);
    cg->on_exit = NULL;
    cg->on_empty = NULL;
    on_exit(arg, &cg->usage, 0);
  }
  g->jobs++;
  if (!rpc_work_submit(NULL, cg_rm_run, cg_rm_done, cg)) {
    g->jobs--;
    on_exit = cg->on_exit;
    cg->on_exit = NULL;
    if (on_exit) on_exit(arg, &cg->usage, 1);
    cg_linger(cg);
  }
}

void proc_cg_release(struct proc_cg *cg) { proc_cg_exited(cg, 0, NULL, NULL, NULL); }

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

/* ---- upgrade in place (proc/handover.c) ---- */

int proc_cg_busy(void) { return cg_state && cg_state->jobs > 0; }

void proc_cg_save(Conch__Handover__Cgroups *m) {
  struct proc_cgroups *g = cg_state;
  if (!g) return;
  m->enabled = 1;
  m->parent_fd = g->parent_fd;
  m->base_fd = g->base_fd;
  m->base_name = g->base_name;
  m->base_path = g->base_path;
  m->seq = g->seq;
  m->envelope = g->envelope;
  m->why = g->why;
  m->mem_max = g->mem_max;
  m->pids_max = g->pids_max;
  if (g->spare && !g->spare_busy && g->spare->fd >= 0) {
    m->spare = g->spare->name;
    m->spare_fd = g->spare->fd;
  }
}

int proc_cg_restore(uv_loop_t *loop, const Conch__Handover__Cgroups *m) {
  if (!m || !m->enabled || cg_state) return 0;
  struct proc_cgroups *g = calloc(1, sizeof *g);
  if (!g) return -1;
  g->loop = loop;
  g->parent_fd = m->parent_fd;
  g->base_fd = m->base_fd;
  snprintf(g->base_name, sizeof g->base_name, "%s", m->base_name);
  snprintf(g->base_path, sizeof g->base_path, "%s", m->base_path);
  g->seq = m->seq;
  g->envelope = m->envelope;
  snprintf(g->why, sizeof g->why, "%s", m->why);
  g->mem_max = m->mem_max;
  g->pids_max = m->pids_max;
  cg_state = g;
  if (m->spare && m->spare[0] && m->spare_fd >= 0) {
    struct proc_cg *cg = proc_cg_adopt(m->spare, m->spare_fd, NULL);
    if (!cg) return -1;
    g->spare = cg;
  }
  return 0;
}

void proc_cg_save_one(const struct proc_cg *cg, Conch__Handover__Proc *m) {
  m->cgroup = (char *)cg->name;
  m->cgroup_fd = cg->fd;
  m->memory_max = cg->limits.memory_max;
  m->pids_max = cg->limits.pids_max;
  m->cpu_millis = cg->limits.cpu_millis;
  if (cg->timer_on && uv_is_active((const uv_handle_t *)&cg->deadline))
    m->cg_deadline_left_ms = uv_timer_get_due_in(&cg->deadline) + 1;
}

struct proc_cg *proc_cg_adopt(const char *name, int fd, const proc_cg_limits *limits) {
  struct proc_cgroups *g = cg_state;
  if (!g || strlen(name) >= sizeof ((struct proc_cg *)0)->name) return NULL;
  struct proc_cg *cg = calloc(1, sizeof *cg);
  if (!cg) return NULL;
  snprintf(cg->name, sizeof cg->name, "%s", name);
  cg->fd = fd;
  cg->created = 1;
  if (limits) cg->limits = *limits;
  list_insert_head(&g->all, &cg->link);
  return cg;
}

void proc_cg_adopt_lingering(struct proc_cg *cg, uint64_t deadline_ms, proc_cg_empty_cb on_empty, void *arg) {
  struct proc_cgroups *g = cg_state;
  cg->released = 1;
  cg->on_empty = on_empty;
  cg->arg = arg;
  if (deadline_ms > 0 && uv_timer_init(g->loop, &cg->deadline) == 0) {
    cg->timer_on = 1;
    cg->deadline.data = cg;
    uv_timer_start(&cg->deadline, cg_on_deadline, deadline_ms, 0);
  }
  cg_linger(cg);
}
