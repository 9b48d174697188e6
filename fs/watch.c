/* fs/watch — WatchDir (api.md §9): a server stream of inotify events.
 *
 * One inotify instance per stream, so closing its fd (in the pool: the
 * kernel waits for an RCU grace period there) drops every watch the stream
 * made — nothing can leak past the stream.  Setup runs in the pool: stat the
 * root (missing → not_found "path not found: <p>", not a directory →
 * invalid_argument "path is not a directory: <p>"), inotify_init1, watch the
 * root and, with `recursive`, every directory below it (symlinks not
 * followed, at most WD_MAX_WATCHES).  Then `start` is sent and the fd is
 * read on the loop (uv_poll, nonblocking reads).
 *
 * Events go through a FIFO of items: the loop appends what it reads, a pool
 * job (one at a time per stream, in order) resolves each item's watch to
 * its relative name, stats the entry (CREATE, WRITE, CHMOD, RENAME-to) and,
 * with `recursive`, watches directories created or moved in (a created one
 * is also scanned: what it already holds is reported as CREATE, so
 * `mkdir -p a/b/c` is seen whole; an entry created at that very instant may
 * be reported twice).  A directory renamed inside the tree keeps its
 * watches under the new name; one moved out loses them.  The watch → name
 * map belongs to whichever job runs, so no lock is needed.
 *
 * Mapping: IN_CREATE → CREATE, IN_MODIFY → WRITE (consecutive writes to
 * one entry not yet handed to a job are coalesced), IN_ATTRIB → CHMOD,
 * IN_DELETE → REMOVE, IN_MOVED_FROM → RENAME without entry, IN_MOVED_TO →
 * RENAME with entry.  The root itself: deleted → REMOVE "." then the stream
 * ends OK; renamed → RENAME "." then the stream ends OK (its path no longer
 * names it); unmounted → ends OK.  An entry gone before its stat is sent
 * without entry.
 *
 * Bounds: at most WD_QUEUE_MAX events and WD_QUEUE_BYTES bytes wait per
 * stream — bytes of memory (the item, its name, its full path and those
 * of the CREATEs a scan found), so a long root path cannot make a queue of
 * 4096 events hold 24 MiB.  When the queue has no room for another read and the client
 * keeps up (the pool job is what is behind), reading pauses and the events
 * wait in the kernel's queue; when the client is what is behind, events
 * past the bound are dropped and one `overflow` event takes their place
 * once the queue is down to half, then events resume.  IN_Q_OVERFLOW (the
 * kernel's own queue) becomes `overflow` too (folded into a pending one).
 * Sending stops once the call holds WD_OUTQ_MAX unsent bytes (or the
 * daemon-wide budget is past its half) and the transport has no room
 * (rpc_out_room), and resumes when it has, so a client that does not read
 * costs at most the queue plus WD_OUTQ_MAX and an event per stream.  `keepalive` after keepalive_ms (CONCH_FS_WATCH_KEEPALIVE_MS,
 * default 30000, 0 = never) with nothing sent and nothing queued.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "agent/log.h"
#include "fs/handlers.h"
#include "fs/path.h"
#include "proto/agent.pb-c.h"

#define WD_QUEUE_MAX 4096
#define WD_QUEUE_BYTES (256u * 1024)
#define WD_OUTQ_MAX (64u * 1024) /* unsent bytes before asking the transport for room */
#define WD_MAX_WATCHES 65536
#define WD_BATCH 512        /* items per pool job */
#define WD_SCAN_MAX 1024    /* synthetic CREATEs per pool job */
#define WD_READS 16         /* reads of the inotify fd per wake-up */
#define WD_READ_BUF (16u * 1024)
#define WD_READ_EVENTS (WD_READ_BUF / sizeof(struct inotify_event)) /* most one read gives */
#define WD_KEEPALIVE_MS 30000
/* Names a scan reported, remembered for WD_SEEN_WINDOW items so that the
 * kernel's own CREATE for them (queued between the watch and the scan's
 * read) is not reported a second time; at most WD_SEEN_MAX. */
#define WD_SEEN_MAX 256
#define WD_SEEN_WINDOW 20480

#define WD_MASK                                                                                  \
  (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | \
   IN_MOVE_SELF | IN_EXCL_UNLINK | IN_ONLYDIR)

enum { WI_FS, WI_OVERFLOW, WI_SKIP, WI_END };

typedef struct wd_item {
  struct wd_item *next;
  int kind;      /* WI_*; the job turns WI_FS into WI_SKIP / WI_END */
  int type;      /* Pb__EventType */
  uint32_t mask, cookie;
  int wd;
  int end_after; /* the root went away: end the stream after this event */
  int ovf_after; /* the scan budget ran out: an overflow after the extras */
  int has_entry;
  int handed;    /* given to a job (loop-side flag) */
  size_t cost;   /* bytes it counts in the queue's bound (loop-side) */
  fs_entry e;         /* e.path = full (the logical path) */
  char *full;         /* malloc'd root + "/" + rel */
  const char *rel;    /* inside full, or "." */
  struct wd_item *extra; /* synthetic CREATEs found by a scan, in order */
  size_t namelen;
  char name[];        /* the inotify name ("" for the watch itself) */
} wd_item;

typedef struct wd_slot {
  int wd; /* 0 = empty */
  char *rel; /* "" for the root */
} wd_slot;

typedef struct fs_watch {
  rpc_call *call; /* NULL once the call ended */
  char *root;
  size_t rootlen;
  int recursive;
  int fd;
  atomic_int cancel;
  fs_status st;
  /* job-owned (setup and item jobs) */
  wd_slot *map;
  size_t map_cap, map_used;
  int root_wd;
  int from_pending;
  uint32_t from_cookie;
  char *from_rel;
  size_t scan_left;
  struct { char *rel; uint64_t until; } seen[WD_SEEN_MAX];
  size_t nseen;
  uint64_t items_seen;
  /* loop-owned */
  uv_poll_t poll;
  uv_timer_t ka;
  int handles;       /* initialised handles not yet closed */
  int polling;
  int busy;          /* a pool job is queued or running */
  int started;       /* the start event went out */
  int closing;
  int ending;        /* WI_END queued: ignore what follows */
  int ovf_pending;   /* events were dropped: an overflow is owed */
  int drain_armed;
  int read_paused;   /* the queue is full and the client keeps up: the kernel holds the events */
  wd_item *head, *raw, *tail; /* head: oldest unsent; raw: first not yet given to a job */
  size_t count, bytes;
  wd_item *job_first;
  size_t job_n;
  uint64_t last_send;
  uint64_t ka_ms;
} fs_watch;

static void watch_pump(fs_watch *w);
static void watch_send(fs_watch *w);

/* ---- the watch map (pool jobs only) ---- */

static size_t map_hash(int wd, size_t cap) { return ((uint32_t)wd * 2654435761u) & (cap - 1); }

static wd_slot *map_find(fs_watch *w, int wd) {
  if (!w->map_cap) return NULL;
  for (size_t i = map_hash(wd, w->map_cap);; i = (i + 1) & (w->map_cap - 1)) {
    if (w->map[i].wd == wd) return &w->map[i];
    if (w->map[i].wd == 0) return NULL;
  }
}

static void map_place(wd_slot *v, size_t cap, wd_slot s) {
  size_t i = map_hash(s.wd, cap);
  while (v[i].wd) i = (i + 1) & (cap - 1);
  v[i] = s;
}

/* Set wd's name (taking rel); -1 when out of memory (rel freed). */
static int map_put(fs_watch *w, int wd, char *rel) {
  wd_slot *s = map_find(w, wd);
  if (s) { /* the same directory again (inotify gives one wd per inode) */
    free(s->rel);
    s->rel = rel;
    return 0;
  }
  if ((w->map_used + 1) * 2 > w->map_cap) {
    size_t nc = w->map_cap ? w->map_cap * 2 : 64;
    wd_slot *nv = calloc(nc, sizeof *nv);
    if (!nv) {
      free(rel);
      return -1;
    }
    for (size_t i = 0; i < w->map_cap; i++)
      if (w->map[i].wd) map_place(nv, nc, w->map[i]);
    free(w->map);
    w->map = nv;
    w->map_cap = nc;
  }
  map_place(w->map, w->map_cap, (wd_slot){wd, rel});
  w->map_used++;
  return 0;
}

static void map_del(fs_watch *w, int wd) {
  wd_slot *s = map_find(w, wd);
  if (!s) return;
  size_t i = (size_t)(s - w->map), mask = w->map_cap - 1;
  free(s->rel);
  s->wd = 0;
  s->rel = NULL;
  w->map_used--;
  for (size_t j = (i + 1) & mask; w->map[j].wd; j = (j + 1) & mask) {
    size_t home = map_hash(w->map[j].wd, w->map_cap);
    int in_range = (i <= j) ? (home > i && home <= j) : (home > i || home <= j);
    if (!in_range) {
      w->map[i] = w->map[j];
      w->map[j].wd = 0;
      w->map[j].rel = NULL;
      i = j;
    }
  }
}

/* 1 when rel is prefix itself or below it. */
static int rel_under(const char *rel, const char *prefix, size_t pl) {
  return strncmp(rel, prefix, pl) == 0 && (rel[pl] == 0 || rel[pl] == '/');
}

/* A directory moved inside the tree: its watches take the new name. */
static void map_rename(fs_watch *w, const char *from, const char *to) {
  size_t fl = strlen(from), tl = strlen(to);
  for (size_t i = 0; i < w->map_cap; i++) {
    wd_slot *s = &w->map[i];
    if (!s->wd || !rel_under(s->rel, from, fl)) continue;
    size_t rest = strlen(s->rel + fl);
    char *n = malloc(tl + rest + 1);
    if (!n) continue;
    memcpy(n, to, tl);
    memcpy(n + tl, s->rel + fl, rest + 1);
    free(s->rel);
    s->rel = n;
  }
}

/* A directory moved out of the tree: stop watching it and below. */
static void map_drop_under(fs_watch *w, const char *from) {
  size_t fl = strlen(from);
  for (int again = 1; again;) {
    again = 0;
    for (size_t i = 0; i < w->map_cap; i++) {
      wd_slot *s = &w->map[i];
      if (!s->wd || !rel_under(s->rel, from, fl)) continue;
      inotify_rm_watch(w->fd, s->wd);
      map_del(w, s->wd); /* moves slots around: scan again */
      again = 1;
      break;
    }
  }
}

/* root + "/" + rel (rel "" → root). */
static char *join_full(const fs_watch *w, const char *rel) {
  size_t rl = strlen(rel);
  char *f = malloc(w->rootlen + 1 + rl + 1);
  if (!f) return NULL;
  memcpy(f, w->root, w->rootlen);
  size_t n = w->rootlen;
  if (rl) {
    if (!(n == 1 && f[0] == '/')) f[n++] = '/';
    memcpy(f + n, rel, rl);
    n += rl;
  }
  f[n] = 0;
  return f;
}

/* rel of a child: dir "" → name, else dir/name. */
static char *join_rel(const char *dir, const char *name, size_t nl) {
  size_t dl = strlen(dir);
  char *r = malloc(dl + 1 + nl + 1);
  if (!r) return NULL;
  size_t n = 0;
  if (dl) {
    memcpy(r, dir, dl);
    r[dl] = '/';
    n = dl + 1;
  }
  memcpy(r + n, name, nl);
  r[n + nl] = 0;
  return r;
}

static void seen_add(fs_watch *w, const char *rel) {
  if (w->nseen == WD_SEEN_MAX) return; /* reported twice at worst */
  char *r = strdup(rel);
  if (!r) return;
  w->seen[w->nseen].rel = r;
  w->seen[w->nseen].until = w->items_seen + WD_SEEN_WINDOW;
  w->nseen++;
}

/* 1 when rel was reported by a scan (and forget it); expired ones go. */
static int seen_take(fs_watch *w, const char *rel) {
  int hit = 0;
  for (size_t i = 0; i < w->nseen;) {
    if (!hit && strcmp(w->seen[i].rel, rel) == 0) hit = 1;
    else if (w->seen[i].until >= w->items_seen) {
      i++;
      continue;
    }
    free(w->seen[i].rel);
    w->seen[i] = w->seen[--w->nseen];
  }
  return hit;
}

static int watch_canceled(fs_watch *w) { return atomic_load_explicit(&w->cancel, memory_order_relaxed); }

/* Watch directory `rel` and (recursive) everything below it; with `out`,
 * append a synthetic CREATE for each entry found (a new directory's
 * contents).  Returns 0, or -1 with st set (setup only cares). */
static int watch_tree(fs_watch *w, const char *rel, wd_item ***out, wd_item *owner, int depth) {
  char *full = join_full(w, rel);
  if (!full) goto nomem;
  if (w->map_used >= WD_MAX_WATCHES) {
    free(full);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: more than %d directories",
                  w->root, WD_MAX_WATCHES);
    return -1;
  }
  int wd = inotify_add_watch(w->fd, full, WD_MASK | (depth ? IN_DONT_FOLLOW : 0));
  if (wd < 0) {
    int e = errno;
    if (e == ENOSPC) {
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: inotify watch limit reached",
                    full);
    } else if (depth == 0) {
      fs_status_os(&w->st, "watch directory", full, e);
    } else { /* below the root: vanished or unreadable, skip it */
      free(full);
      return 0;
    }
    free(full);
    return -1;
  }
  char *r = strdup(rel);
  if (!r || map_put(w, wd, r) != 0) {
    free(full);
    goto nomem;
  }
  if (depth == 0 && !*rel) w->root_wd = wd;
  if (!w->recursive && depth == 0 && !*rel) {
    free(full);
    return 0;
  }
  DIR *d = opendir(full);
  free(full);
  if (!d) return 0;
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    const char *n = de->d_name;
    if (n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2]))) continue;
    if (watch_canceled(w)) break;
    char *crel = join_rel(rel, n, strlen(n));
    if (!crel) break;
    char *cfull = join_full(w, crel);
    struct stat sb;
    int ok = cfull && lstat(cfull, &sb) == 0;
    if (ok && out) {
      if (w->scan_left == 0) {
        owner->ovf_after = 1;
      } else {
        wd_item *x = calloc(1, sizeof *x);
        if (x) {
          w->scan_left--;
          x->kind = WI_FS;
          x->type = PB__EVENT_TYPE__EVENT_TYPE_CREATE;
          x->full = cfull;
          cfull = NULL;
          x->rel = x->full + (strlen(x->full) - strlen(crel));
          struct stat fb;
          if (stat(x->full, &fb) != 0) fb = sb; /* a link to nowhere: itself */
          fs_entry_fill(&x->e, &fb);
          x->e.path = x->full;
          x->e.name = fs_path_base(x->full);
          x->has_entry = 1;
          seen_add(w, x->rel);
          **out = x;
          *out = &x->next;
        }
      }
    }
    free(cfull);
    if (ok && S_ISDIR(sb.st_mode) && w->recursive) rc = watch_tree(w, crel, out, owner, depth + 1);
    free(crel);
  }
  closedir(d);
  return rc;
nomem:
  fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
  return -1;
}

static void watch_setup_work(void *data) {
  fs_watch *w = data;
  struct stat sb;
  if (stat(w->root, &sb) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&w->st, RPC_NOT_FOUND, "path not found: %s", w->root);
    else
      fs_status_os(&w->st, "stat path", w->root, e);
    return;
  }
  if (!S_ISDIR(sb.st_mode)) {
    fs_status_set(&w->st, RPC_INVALID_ARGUMENT, "path is not a directory: %s", w->root);
    return;
  }
  w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (w->fd < 0) {
    int e = errno;
    if (e == EMFILE || e == ENFILE || e == ENOMEM)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: too many inotify instances",
                    w->root);
    else
      fs_status_os(&w->st, "watch directory", w->root, e);
    return;
  }
  fs_status_clear(&w->st);
  watch_tree(w, "", NULL, NULL, 0);
}

/* Resolve, stat and (recursive) follow one item; pool thread. */
static void watch_item_work(fs_watch *w, wd_item *it) {
  if (it->kind != WI_FS) return;
  if (w->from_pending && !((it->mask & IN_MOVED_TO) && it->cookie == w->from_cookie)) {
    map_drop_under(w, w->from_rel); /* that directory left the tree */
    free(w->from_rel);
    w->from_rel = NULL;
    w->from_pending = 0;
  }
  wd_slot *s = map_find(w, it->wd);
  if (!s) {
    it->kind = WI_SKIP; /* a watch already dropped */
    return;
  }
  uint32_t m = it->mask;
  if (m & IN_IGNORED) {
    int is_root = it->wd == w->root_wd;
    map_del(w, it->wd);
    it->kind = is_root ? WI_END : WI_SKIP;
    return;
  }
  if (m & (IN_DELETE_SELF | IN_MOVE_SELF)) {
    if (it->wd != w->root_wd) {
      it->kind = WI_SKIP; /* the parent's event tells */
      return;
    }
    it->rel = ".";
    it->type = (m & IN_DELETE_SELF) ? PB__EVENT_TYPE__EVENT_TYPE_REMOVE : PB__EVENT_TYPE__EVENT_TYPE_RENAME;
    if (m & IN_MOVE_SELF) it->end_after = 1; /* (DELETE_SELF: IN_IGNORED follows) */
    return;
  }
  if (!it->namelen) {
    it->kind = WI_SKIP; /* IN_UNMOUNT and the like: IN_IGNORED follows */
    return;
  }
  char *rel = join_rel(s->rel, it->name, strlen(it->name));
  it->full = rel ? join_full(w, rel) : NULL;
  if (!it->full) {
    free(rel);
    it->kind = WI_SKIP;
    return;
  }
  it->rel = it->full + (strlen(it->full) - strlen(rel));
  if (w->nseen && (m & (IN_CREATE | IN_DELETE | IN_MOVED_FROM)) && seen_take(w, it->rel) &&
      (m & IN_CREATE)) {
    it->kind = WI_SKIP; /* a scan reported it already */
    free(rel);
    return;
  }
  int want_entry = 1;
  if (m & IN_CREATE) it->type = PB__EVENT_TYPE__EVENT_TYPE_CREATE;
  else if (m & IN_MODIFY) it->type = PB__EVENT_TYPE__EVENT_TYPE_WRITE;
  else if (m & IN_ATTRIB) it->type = PB__EVENT_TYPE__EVENT_TYPE_CHMOD;
  else if (m & IN_DELETE) it->type = PB__EVENT_TYPE__EVENT_TYPE_REMOVE, want_entry = 0;
  else if (m & IN_MOVED_FROM) it->type = PB__EVENT_TYPE__EVENT_TYPE_RENAME, want_entry = 0;
  else if (m & IN_MOVED_TO) it->type = PB__EVENT_TYPE__EVENT_TYPE_RENAME;
  else it->kind = WI_SKIP;
  if (want_entry && it->kind == WI_FS) {
    struct stat sb;
    if (stat(it->full, &sb) == 0 || lstat(it->full, &sb) == 0) {
      fs_entry_fill(&it->e, &sb);
      it->e.path = it->full;
      it->e.name = fs_path_base(it->full);
      it->has_entry = 1;
    }
  }
  if (w->recursive && (m & IN_ISDIR) && it->kind == WI_FS) {
    if (m & IN_MOVED_FROM) {
      w->from_pending = 1;
      w->from_cookie = it->cookie;
      w->from_rel = rel;
      rel = NULL;
    } else if ((m & IN_MOVED_TO) && w->from_pending && it->cookie == w->from_cookie) {
      map_rename(w, w->from_rel, rel); /* moved inside the tree */
      free(w->from_rel);
      w->from_rel = NULL;
      w->from_pending = 0;
    } else if (m & (IN_CREATE | IN_MOVED_TO)) {
      wd_item **out = &it->extra;
      /* past a limit the subtree goes unwatched: say events were lost */
      if (watch_tree(w, rel, (m & IN_CREATE) ? &out : NULL, it, 1) != 0) it->ovf_after = 1;
      fs_status_clear(&w->st);
    }
  }
  free(rel);
}

static void watch_items_work(void *data) {
  fs_watch *w = data;
  w->scan_left = WD_SCAN_MAX;
  wd_item *it = w->job_first;
  for (size_t i = 0; i < w->job_n; i++) {
    w->items_seen++;
    watch_item_work(w, it);
    if (i + 1 < w->job_n) it = it->next; /* the last one's next is the loop's */
  }
}

/* ---- loop side ---- */

static void item_free(wd_item *it) {
  for (wd_item *x = it->extra, *n; x; x = n) {
    n = x->next;
    free(x->full);
    free(x);
  }
  free(it->full);
  free(it);
}

static void watch_free(fs_watch *w) {
  for (wd_item *it = w->head, *n; it; it = n) {
    n = it->next;
    item_free(it);
  }
  for (size_t i = 0; i < w->map_cap; i++) free(w->map[i].rel);
  for (size_t i = 0; i < w->nseen; i++) free(w->seen[i].rel);
  free(w->map);
  free(w->from_rel);
  free(w->root);
  fs_status_clear(&w->st);
  free(w);
}

/* A pool job for w (one at a time, w->busy); out of memory: done(w, 1) at once. */
static void watch_submit(fs_watch *w, void (*run)(void *), void (*done)(void *, int)) {
  if (!rpc_work_submit(w->call, run, done, w)) done(w, 1);
}

static void watch_close_work(void *data) {
  fs_watch *w = data;
  if (w->fd >= 0) close(w->fd); /* drops every watch; may wait for RCU */
  w->fd = -1;
}

static void watch_closed(void *data, int canceled) {
  fs_watch *w = data;
  if (w->fd >= 0) close(w->fd); /* the job could not run */
  watch_free(w);
}

/* Free once nothing is in flight: handles closed, no job; the fd goes in
 * the pool. */
static void watch_maybe_free(fs_watch *w) {
  if (!w->closing || w->busy || w->handles) return;
  w->busy = 1;
  watch_submit(w, watch_close_work, watch_closed);
}

static void watch_on_handle_closed(uv_handle_t *h) {
  fs_watch *w = h->data;
  w->handles--;
  watch_maybe_free(w);
}

/* Stop everything (the call is already finished or canceled). */
static void watch_teardown(fs_watch *w) {
  if (w->closing) return;
  w->closing = 1;
  w->call = NULL;
  atomic_store(&w->cancel, 1);
  if (w->polling) uv_poll_stop(&w->poll);
  w->polling = 0;
  if (w->started) uv_close((uv_handle_t *)&w->poll, watch_on_handle_closed);
  uv_close((uv_handle_t *)&w->ka, watch_on_handle_closed);
  watch_maybe_free(w);
}

static void watch_finish(fs_watch *w, rpc_code code, const char *msg) {
  rpc_call *c = w->call;
  w->call = NULL;
  rpc_set_user(c, NULL);
  rpc_finish(c, code, msg);
  watch_teardown(w);
}

/* Send one event; 0, or -1 when the call ended (finished here). */
static int watch_send_msg(fs_watch *w, Pb__WatchDirEvent *ev) {
  if (rpc_send(w->call, &ev->base) != 0) {
    if (w->call) watch_finish(w, RPC_RESOURCE_EXHAUSTED, "out of memory sending watch event");
    return -1;
  }
  w->last_send = uv_now(fs_loop);
  return w->call ? 0 : -1;
}

static int watch_send_fs(fs_watch *w, const wd_item *it) {
  Pb__WatchDirEvent ev = PB__WATCH_DIR_EVENT__INIT;
  Pb__FilesystemEvent fe = PB__FILESYSTEM_EVENT__INIT;
  Pb__FileEntry en = PB__FILE_ENTRY__INIT;
  fe.name = (char *)it->rel;
  fe.type = it->type;
  if (it->has_entry) {
    en.name = (char *)it->e.name;
    en.path = it->e.path;
    en.type = it->e.is_dir ? "directory" : "file";
    en.size = it->e.size;
    en.permissions = (char *)it->e.perms;
    en.modified_time = (char *)it->e.mtime;
    en.is_directory = it->e.is_dir ? 1 : 0;
    fe.entry = &en;
  }
  ev.event_case = PB__WATCH_DIR_EVENT__EVENT_FILESYSTEM;
  ev.filesystem = &fe;
  return watch_send_msg(w, &ev);
}

static int watch_send_overflow(fs_watch *w) {
  Pb__WatchDirEvent ev = PB__WATCH_DIR_EVENT__INIT;
  Pb__WatchDirOverflow o = PB__WATCH_DIR_OVERFLOW__INIT;
  ev.event_case = PB__WATCH_DIR_EVENT__EVENT_OVERFLOW;
  ev.overflow = &o;
  return watch_send_msg(w, &ev);
}

static wd_item *item_new(size_t namelen) {
  wd_item *it = calloc(1, sizeof *it + namelen + 1);
  if (it) it->namelen = namelen;
  return it;
}

/* Memory an item holds once its job made it: the item, its name and its
 * full path (root + "/" + name, before the job knows the subdirectory). */
static size_t item_cost(const fs_watch *w, size_t namelen) {
  return sizeof(wd_item) + namelen + 1 + w->rootlen + 2 + namelen;
}

static void queue_append(fs_watch *w, wd_item *it) {
  if (w->tail) w->tail->next = it;
  else w->head = it;
  w->tail = it;
  if (!w->raw) w->raw = it;
  w->count++;
  it->cost = item_cost(w, it->namelen);
  w->bytes += it->cost;
}

/* The owed overflow, once the queue is down to half (so that a slow
 * reader gets one overflow per stall, not one per freed slot). */
static void watch_owe_overflow(fs_watch *w) {
  if (!w->ovf_pending || w->count > WD_QUEUE_MAX / 2) return;
  wd_item *o = item_new(0);
  if (!o) return;
  o->kind = WI_OVERFLOW;
  queue_append(w, o);
  w->ovf_pending = 0;
}

/* One inotify event from the loop's read. */
static void watch_push(fs_watch *w, const struct inotify_event *ev) {
  if (w->ending) return;
  if (ev->mask & IN_Q_OVERFLOW) {
    w->ovf_pending = 1; /* folds into one already owed */
    watch_owe_overflow(w);
    return;
  }
  size_t nl = ev->len ? strnlen(ev->name, ev->len) : 0;
  /* a write to the entry whose write event still waits (not yet handed
   * to a job): one is enough */
  wd_item *t = w->tail;
  if ((ev->mask & IN_MODIFY) && t && !t->handed && t->kind == WI_FS && t->mask == ev->mask &&
      t->wd == ev->wd && t->namelen == nl && memcmp(t->name, ev->name, nl) == 0)
    return;
  /* the root's own end is never dropped: the stream must end */
  int vital = ev->wd == w->root_wd && (ev->mask & (IN_IGNORED | IN_DELETE_SELF | IN_MOVE_SELF));
  if (!vital) {
    watch_owe_overflow(w);
    if (w->ovf_pending || w->count + 1 > WD_QUEUE_MAX || w->bytes + item_cost(w, nl) > WD_QUEUE_BYTES) {
      w->ovf_pending = 1; /* dropped */
      return;
    }
  }
  wd_item *it = item_new(nl);
  if (!it) {
    w->ovf_pending = 1;
    return;
  }
  it->kind = WI_FS;
  it->mask = ev->mask;
  it->cookie = ev->cookie;
  it->wd = ev->wd;
  memcpy(it->name, ev->name, nl);
  queue_append(w, it);
}

/* A read of rdsize bytes holds at most rdsize / 16 events, each costing
 * at most item_cost(w, 0) per 16 bytes read (an event without a name);
 * reads are sized so that one fits in half the queue's bytes. */
static size_t watch_read_size(const fs_watch *w) {
  size_t b = WD_QUEUE_BYTES / 2 * sizeof(struct inotify_event) / item_cost(w, 0);
  size_t min = sizeof(struct inotify_event) + NAME_MAX + 1; /* one event always fits */
  return b < min ? min : b > WD_READ_BUF ? WD_READ_BUF : b;
}

/* Room for a whole read in the queue. */
static int watch_read_room(const fs_watch *w) {
  return w->count + WD_READ_EVENTS <= WD_QUEUE_MAX && w->bytes <= WD_QUEUE_BYTES / 2;
}

static void watch_on_poll(uv_poll_t *h, int status, int events) {
  fs_watch *w = h->data;
  if (!w->call || w->closing) return;
  if (status < 0) {
    watch_finish(w, RPC_INTERNAL, "watch directory: inotify read failed");
    return;
  }
  char *buf = malloc(WD_READ_BUF);
  if (!buf) return;
  size_t rdsize = watch_read_size(w);
  for (int r = 0; r < WD_READS; r++) {
    /* No room for a whole read: while the client keeps up the daemon is
     * the one behind, so leave the events in the kernel's queue (bounded;
     * past it IN_Q_OVERFLOW) until the pool job catches up; a client that
     * does not read makes us read and drop instead (one overflow). */
    if (!watch_read_room(w) && !w->drain_armed) {
      uv_poll_stop(&w->poll);
      w->polling = 0;
      w->read_paused = 1;
      break;
    }
    ssize_t n = read(w->fd, buf, rdsize);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= n;) {
      const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
      watch_push(w, ev);
      off += (ssize_t)(sizeof *ev + ev->len);
    }
  }
  free(buf);
  watch_pump(w);
}

static void watch_items_done(void *data, int canceled) {
  fs_watch *w = data;
  w->busy = 0;
  if (w->closing) {
    watch_maybe_free(w);
    return;
  }
  if (canceled) {
    watch_finish(w, RPC_INTERNAL, "watch directory: pool job canceled");
    return;
  }
  /* the job's items are ready; count the extras the scans found, and
   * what each holds now that its path is known */
  wd_item *it = w->job_first;
  for (size_t i = 0; i < w->job_n; i++) {
    size_t cost = sizeof *it + it->namelen + 1 + (it->full ? strlen(it->full) + 1 : 0);
    for (wd_item *x = it->extra; x; x = x->next) {
      w->count++;
      cost += sizeof *x + strlen(x->full) + 1;
    }
    w->bytes += cost - it->cost;
    it->cost = cost;
    if (i + 1 < w->job_n) it = it->next;
  }
  w->raw = it->next;
  w->job_first = NULL;
  w->job_n = 0;
  watch_send(w);
  if (w->call) watch_pump(w);
}

/* Hand the raw items to a job, unless one runs. */
static void watch_pump(fs_watch *w) {
  if (w->busy || !w->raw || w->closing) return;
  w->job_first = w->raw;
  w->job_n = 0;
  for (wd_item *x = w->raw; x && w->job_n < WD_BATCH; x = x->next) {
    x->handed = 1;
    w->job_n++;
  }
  w->busy = 1;
  watch_submit(w, watch_items_work, watch_items_done);
}

static void watch_on_drain(rpc_call *c) {
  fs_watch *w = rpc_user(c);
  if (!w || !w->call) return;
  w->drain_armed = 0;
  watch_send(w);
  if (w->call) watch_pump(w);
}

/* Send ready items in order while the client keeps up. */
static void watch_send(fs_watch *w) {
  while (w->call && w->head && w->head != w->raw) {
    if (w->drain_armed) return; /* watch_on_drain comes */
    if ((rpc_outq_bytes(w->call) > WD_OUTQ_MAX || rpc_budget_over()) &&
        !rpc_out_room(w->call, WD_OUTQ_MAX, watch_on_drain)) {
      w->drain_armed = 1;
      return;
    }
    wd_item *it = w->head;
    int rc = 0, end = 0;
    if (it->kind == WI_OVERFLOW) {
      rc = watch_send_overflow(w);
    } else if (it->kind == WI_FS) {
      rc = watch_send_fs(w, it);
      for (wd_item *x = it->extra; x && rc == 0; x = x->next) {
        rc = watch_send_fs(w, x);
        w->count--;
      }
      if (rc == 0 && it->ovf_after) rc = watch_send_overflow(w);
      end = it->end_after;
    } else if (it->kind == WI_END) {
      end = 1;
    }
    if (rc != 0) return; /* the call ended */
    w->head = it->next;
    if (!w->head) w->tail = NULL;
    w->count--;
    w->bytes -= it->cost;
    item_free(it);
    if (end) {
      w->ending = 1;
      LOG_DEBUG("watch ended: directory gone root=%s", w->root);
      watch_finish(w, RPC_OK, NULL);
      return;
    }
  }
  watch_owe_overflow(w);
  if (w->read_paused && w->call && watch_read_room(w)) {
    w->read_paused = 0;
    w->polling = 1;
    uv_poll_start(&w->poll, UV_READABLE, watch_on_poll);
  }
}

static void watch_on_ka(uv_timer_t *t) {
  fs_watch *w = t->data;
  if (!w->call || w->closing) return;
  uint64_t now = uv_now(fs_loop);
  if (rpc_outq_bytes(w->call) > 0 || w->head) w->last_send = now; /* still traffic */
  uint64_t idle = now - w->last_send;
  if (idle >= w->ka_ms) {
    Pb__WatchDirEvent ev = PB__WATCH_DIR_EVENT__INIT;
    Pb__WatchDirKeepAlive k = PB__WATCH_DIR_KEEP_ALIVE__INIT;
    ev.event_case = PB__WATCH_DIR_EVENT__EVENT_KEEPALIVE;
    ev.keepalive = &k;
    if (watch_send_msg(w, &ev) != 0) return;
    idle = 0;
  }
  uv_timer_start(&w->ka, watch_on_ka, w->ka_ms - idle, 0);
}

static void watch_setup_done(void *data, int canceled) {
  fs_watch *w = data;
  w->busy = 0;
  if (w->closing) {
    watch_maybe_free(w);
    return;
  }
  if (canceled || w->st.code != RPC_OK) {
    if (canceled) fs_status_set(&w->st, RPC_INTERNAL, "watch directory: pool job canceled");
    rpc_code code = w->st.code;
    char *msg = w->st.msg;
    w->st.msg = NULL;
    watch_finish(w, code, msg);
    free(msg);
    return;
  }
  if (uv_poll_init(fs_loop, &w->poll, w->fd) != 0) {
    watch_finish(w, RPC_INTERNAL, "watch directory: cannot poll inotify");
    return;
  }
  w->poll.data = w;
  w->handles++;
  w->started = 1;
  LOG_DEBUG("watch started root=%s recursive=%d watches=%zu", w->root, w->recursive, w->map_used);
  Pb__WatchDirEvent ev = PB__WATCH_DIR_EVENT__INIT;
  Pb__WatchDirStart s = PB__WATCH_DIR_START__INIT;
  ev.event_case = PB__WATCH_DIR_EVENT__EVENT_START;
  ev.start = &s;
  if (watch_send_msg(w, &ev) != 0) return;
  w->polling = 1;
  uv_poll_start(&w->poll, UV_READABLE, watch_on_poll);
  if (w->ka_ms) uv_timer_start(&w->ka, watch_on_ka, w->ka_ms, 0);
}

static uint64_t watch_ka_ms(void) {
  const char *v = getenv("CONCH_FS_WATCH_KEEPALIVE_MS");
  if (!v || !*v) return WD_KEEPALIVE_MS;
  char *end;
  unsigned long long x = strtoull(v, &end, 10);
  return *end ? WD_KEEPALIVE_MS : (uint64_t)x;
}

void fs_watch_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__WatchDirRequest *req = (const Pb__WatchDirRequest *)msg;
  char err[160];
  if (fs_check_call_path(c, req->path, "watch directory", err, sizeof err) < 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  fs_watch *w = calloc(1, sizeof *w);
  if (w) w->root = strdup(req->path);
  if (!w || !w->root) {
    free(w);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  w->rootlen = strlen(w->root);
  w->recursive = req->recursive ? 1 : 0;
  w->fd = -1;
  w->root_wd = -1;
  w->call = c;
  w->ka_ms = watch_ka_ms();
  atomic_init(&w->cancel, 0);
  uv_timer_init(fs_loop, &w->ka);
  w->ka.data = w;
  w->handles = 1;
  w->last_send = uv_now(fs_loop);
  rpc_set_user(c, w);
  w->busy = 1;
  watch_submit(w, watch_setup_work, watch_setup_done);
}

void fs_watch_on_cancel(rpc_call *c, rpc_code why) {
  fs_watch *w = rpc_user(c);
  if (!w) return;
  LOG_DEBUG("watch canceled root=%s why=%s", w->root, rpc_code_name(why));
  w->call = NULL;
  watch_teardown(w);
}
