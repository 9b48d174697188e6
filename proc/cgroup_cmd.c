/* cgroup_cmd — one command's cgroup: made, limited, signalled, its usage
 * read, and removed at its end (at once, or once it empties); see cgroup.h
 * and cgroup_int.h. */
#include "proc/cgroup_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/log.h"
#include "server/rpc.h"

struct proc_cg *cg_alloc(struct proc_cgroups *g) {
  struct proc_cg *cg = calloc(1, sizeof *cg);
  if (!cg) return NULL;
  cg->fd = -1;
  snprintf(cg->name, sizeof cg->name, "p%llu", (unsigned long long)++g->seq);
  list_insert_head(&g->all, &cg->link);
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

static int cg_kill_one(pid_t pid, void *arg) { return kill(pid, *(int *)arg); }
static int cg_count_one(pid_t pid, void *arg) { return 0; }

static int cg_signal_each(int dirfd, int sig) { return cg_each(dirfd, cg_kill_one, &sig); }

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

void cg_deadline_arm(struct proc_cg *cg, uint64_t ms) {
  if (uv_timer_init(cg_state->loop, &cg->deadline) != 0) return;
  cg->timer_on = 1;
  cg->deadline.data = cg;
  uv_timer_start(&cg->deadline, cg_on_deadline, ms, 0);
}

/* Still populated: watch cgroup.events ("populated 0" when it empties). */
void cg_linger(struct proc_cg *cg) {
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
  if (deadline_ms > 0) cg_deadline_arm(cg, deadline_ms);
  if (on_exit && !cg_populated(cg)) {
    /* the common end: nothing left, so the usage is a few small reads and
     * the end event need not wait for the pool (only the rmdir goes there) */
    proc_cg_read_usage(cg, &cg->usage);
    cg->on_exit = NULL;
    cg->on_empty = NULL;
    on_exit(arg, &cg->usage, 0);
  }
  cg_state->jobs++;
  if (!rpc_work_submit(NULL, cg_rm_run, cg_rm_done, cg)) {
    cg_state->jobs--;
    on_exit = cg->on_exit;
    cg->on_exit = NULL;
    if (on_exit) on_exit(arg, &cg->usage, 1);
    cg_linger(cg);
  }
}

void proc_cg_release(struct proc_cg *cg) { proc_cg_exited(cg, 0, NULL, NULL, NULL); }

