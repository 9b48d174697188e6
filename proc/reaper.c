/* reaper — the one waitpid() owner; see reaper.h.
 *
 * State: module-static (one reaper per process).  Owners live in an open-addressing hash table keyed by pid
 * (linear probing, backward-shift deletion, so no tombstones), grown by
 * doubling with a full rehash when it is half full, up to REAPER_MAX_WATCH
 * entries (then reaper_watch() fails with -ENOMEM).
 *
 * A status is dispatched after its entry is removed, so a callback may call
 * reaper_watch()/reaper_unwatch() freely.
 */
#include "proc/reaper.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/log.h"

#define REAPER_MIN_CAP 64u
/* Reaps per loop turn: a fork bomb's orphans exit as fast as the reaper
 * takes them, so an unbounded wait4 loop never returned to the rest of the
 * loop (/health starved for 13 s in the microVM); the rest are reaped on the
 * next turn (an idle handle), after the loop's I/O.  Zombies left meanwhile
 * count against the workload's pids.max, which slows the bomb down. */
#define REAPER_BATCH 64
#define REAPER_MAX_WATCH (1u << 20)

struct reaper_slot {
  pid_t pid; /* 0 = empty */
  reaper_cb cb;
  void *arg;
};

struct reaper {
  int sigfd;      /* signalfd of SIGCHLD, blocked in every thread */
  uv_poll_t sig;  /* on sigfd */
  uv_idle_t more; /* a batch was full: go on next turn */
  int started;
  int held; /* reaper_hold: an upgrade's owners are not back yet */
  struct reaper_slot *slots;
  size_t cap; /* power of two */
  size_t used;
  unsigned long orphans;
  list_node inflight; /* reaper_inflight: spawns under way in the thread pool, newest first */
};

static struct reaper reaper;

static size_t reaper_hash(pid_t pid, size_t cap) {
  uint32_t h = (uint32_t)pid * 2654435761u; /* Knuth multiplicative */
  return (size_t)h & (cap - 1);
}

static struct reaper_slot *reaper_find(pid_t pid) {
  if (!reaper.cap) return NULL;
  for (size_t i = reaper_hash(pid, reaper.cap);; i = (i + 1) & (reaper.cap - 1)) {
    if (reaper.slots[i].pid == pid) return &reaper.slots[i];
    if (reaper.slots[i].pid == 0) return NULL;
  }
}

static void reaper_insert_slot(struct reaper_slot *slots, size_t cap, struct reaper_slot s) {
  size_t i = reaper_hash(s.pid, cap);
  while (slots[i].pid != 0) i = (i + 1) & (cap - 1);
  slots[i] = s;
}

static int reaper_grow(void) {
  size_t ncap = reaper.cap ? reaper.cap * 2 : REAPER_MIN_CAP;
  struct reaper_slot *n = calloc(ncap, sizeof *n);
  if (!n) return -ENOMEM;
  for (size_t i = 0; i < reaper.cap; i++)
    if (reaper.slots[i].pid) reaper_insert_slot(n, ncap, reaper.slots[i]);
  free(reaper.slots);
  reaper.slots = n;
  reaper.cap = ncap;
  return 0;
}

/* Remove slot i with backward-shift deletion (keeps probe chains intact). */
static void reaper_remove_at(size_t i) {
  size_t mask = reaper.cap - 1;
  reaper.slots[i].pid = 0;
  reaper.used--;
  for (size_t j = (i + 1) & mask; reaper.slots[j].pid; j = (j + 1) & mask) {
    size_t home = reaper_hash(reaper.slots[j].pid, reaper.cap);
    /* can slot j move into the hole at i?  yes unless home lies in (i, j] */
    int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!in_range) {
      reaper.slots[i] = reaper.slots[j];
      reaper.slots[j].pid = 0;
      i = j;
    }
  }
}

int reaper_watch(pid_t pid, reaper_cb cb, void *arg) {
  if (pid <= 0 || !cb) return -EINVAL;
  struct reaper_slot *s = reaper_find(pid);
  if (s) { /* a stale owner of a reused pid cannot exist; replace */
    s->cb = cb;
    s->arg = arg;
    return 0;
  }
  if ((reaper.used + 1) * 2 > reaper.cap) {
    if (reaper.used + 1 > REAPER_MAX_WATCH) return -ENOMEM;
    int r = reaper_grow();
    if (r) return r;
  }
  reaper_insert_slot(reaper.slots, reaper.cap, (struct reaper_slot){pid, cb, arg});
  reaper.used++;
  return 0;
}

void reaper_unwatch(pid_t pid) {
  struct reaper_slot *s = reaper_find(pid);
  if (s) reaper_remove_at((size_t)(s - reaper.slots));
}

/* An in-flight slot holds pid: keep its status there.  Linear in the spawns
 * under way (each a PREP record), only for pids without an owner. */
static int reaper_keep_inflight(pid_t pid, int st, const struct rusage *ru) {
  reaper_inflight *s;
  list_each(s, &reaper.inflight, link)
    if (__atomic_load_n(&s->pid, __ATOMIC_ACQUIRE) == pid && !s->reaped) {
      s->reaped = 1;
      s->status = st;
      s->ru = *ru;
      return 1;
    }
  return 0;
}

void reaper_inflight_add(reaper_inflight *s) {
  s->pid = 0;
  s->reaped = s->status = 0;
  list_insert_head(&reaper.inflight, &s->link);
}

int reaper_inflight_claim(reaper_inflight *s, reaper_cb cb, void *arg, int *status) {
  list_remove(&s->link);
  pid_t pid = __atomic_load_n(&s->pid, __ATOMIC_ACQUIRE);
  if (s->reaped) {
    *status = s->status;
    return 1;
  }
  return pid > 0 ? reaper_watch(pid, cb, arg) : 0;
}

static void reaper_on_more(uv_idle_t *h) { reaper_reap(); }

void reaper_hold(int on) {
  reaper.held = on;
  if (!on) reaper_reap();
}

void reaper_reap(void) {
  if (reaper.held) return; /* the zombies wait: their statuses are not lost */
  for (int n = 0;; n++) {
    if (n == REAPER_BATCH) {
      if (reaper.started && !uv_is_active((uv_handle_t *)&reaper.more)) uv_idle_start(&reaper.more, reaper_on_more);
      return;
    }
    int st = 0;
    struct rusage ru;
    memset(&ru, 0, sizeof ru);
    pid_t pid = wait4(-1, &st, WNOHANG, &ru);
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) { /* 0: children left, none exited; -1: ECHILD, no children at all */
      if (reaper.started) uv_idle_stop(&reaper.more);
      return;
    }
    struct reaper_slot *s = reaper_find(pid);
    if (s) {
      reaper_cb cb = s->cb;
      void *arg = s->arg;
      reaper_remove_at((size_t)(s - reaper.slots));
      cb(pid, st, &ru, arg);
    } else if (reaper_keep_inflight(pid, st, &ru)) {
      /* a pool-spawned child that exited before its owner watched it */
    } else {
      reaper.orphans++;
      LOG_DEBUG("reaped orphan pid=%d status=0x%x orphans=%lu", (int)pid, st, reaper.orphans);
    }
  }
}

static void reaper_on_sigchld(uv_poll_t *h, int status, int events) {
  struct signalfd_siginfo si[8]; /* coalesced: the contents do not matter, wait4 finds them all */
  while (read(reaper.sigfd, si, sizeof si) > 0) {
  }
  reaper_reap();
}

static void reaper_on_closed(uv_handle_t *h) { close(reaper.sigfd); }

/* SIGCHLD through a signalfd on the loop, not a handler: the kernel sends
 * it to the thread that cloned the child (a pool thread), whose handler
 * then had to wake the loop through libuv's signal pipe — one thread hop
 * more on every command's end (docs/internals/profile.md).  Blocked here,
 * before any thread exists, so that every thread inherits the mask; the
 * children unblock everything before exec. */
int reaper_init(uv_loop_t *loop) {
  if (reaper.started) return 0;
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int r = pthread_sigmask(SIG_BLOCK, &chld, NULL);
  if (r) return -r;
  reaper.sigfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  if (reaper.sigfd < 0) return -errno;
  r = uv_poll_init(loop, &reaper.sig, reaper.sigfd);
  if (r) {
    close(reaper.sigfd);
    return r;
  }
  r = uv_poll_start(&reaper.sig, UV_READABLE, reaper_on_sigchld);
  if (r) {
    uv_close((uv_handle_t *)&reaper.sig, reaper_on_closed); /* the fd goes once libuv let go of it */
    return r;
  }
  /* The reaper alone never keeps the loop alive. */
  uv_unref((uv_handle_t *)&reaper.sig);
  uv_idle_init(loop, &reaper.more);
  uv_unref((uv_handle_t *)&reaper.more);
  reaper.started = 1;
  /* Children that exited before the handler existed. */
  reaper_reap();
  return 0;
}

unsigned long reaper_orphans_reaped(void) { return reaper.orphans; }
