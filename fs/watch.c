/* fs/watch — WatchDir (api.md §9): a server stream of inotify events.
 *
 * One inotify instance for the whole agent (the hub), shared by every
 * stream: a client opening many streams takes one instance of root's
 * max_user_instances, not one each.  The hub maps each watch descriptor to
 * the streams that watch it (a reference each: two streams watching one
 * directory share the kernel's watch; the last one to drop it removes it).
 * The hub exists while a stream does; its fd is closed in the pool (the
 * kernel waits for an RCU grace period there).  Its table is the one thing
 * the loop and the pool share, under a mutex: a job adds a watch and its
 * subscription under it, so no event of a new watch is dispatched before
 * the stream is known; the loop reads the fd and hands each event to the
 * subscribed streams' queues under it.
 *
 * Setup runs in the pool: open the root (O_DIRECTORY; missing → not_found
 * "path not found: <p>", not a directory → invalid_argument "path is not a
 * directory: <p>"), watch it and, with `recursive`, every directory below.
 * Directories are walked by descriptor only: each child is opened with
 * openat(parent fd, name, O_NOFOLLOW|O_DIRECTORY) and watched as
 * /proc/self/fd/<fd>, so the watch is on the inode opened — a path swapped
 * for a symlink is never followed, whatever the race.  A stream that cannot
 * cover its tree says so: at setup an error (more than WD_MAX_WATCHES
 * directories, deeper than WD_MAX_DEPTH levels, the kernel's watch limit,
 * a directory that cannot be opened), later an `overflow` after the event
 * whose directory could not be covered.  Then `start` is sent.
 *
 * Events go through a FIFO of items per stream: the hub appends what it
 * reads, a pool job (one at a time per stream, in order) resolves each
 * item's watch to its relative name, stats the entry (fstatat from the
 * directory reopened by descriptor from the root: CREATE, WRITE, CHMOD,
 * RENAME-to) and, with `recursive`, watches directories created or moved
 * in (a created one is also scanned: what it already holds is reported as
 * CREATE, so `mkdir -p a/b/c` is seen whole; an entry created at that very
 * instant may be reported twice).  A directory renamed inside the tree
 * keeps its watches under the new name; one moved out loses them.  A new
 * directory whose parent was renamed before its event was read (so the
 * parent cannot be reopened by the name the tree has) is picked up once
 * that rename is followed (WD_LOST_MAX).  The
 * stream's watched directories form a tree of nodes (parent, name), found
 * by watch descriptor or by (parent, name) in two hash tables, so a rename
 * or a directory moved out costs its own subtree, never the whole tree.
 * The tree belongs to whichever job of the stream runs: no lock.
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
 * 4096 events hold 24 MiB.  The hub's reads are sized so that one fits in
 * half of every stream's queue (the longest root sets it).  When a
 * stream's queue has no room for another read and its client keeps up
 * (the pool job is what is behind), the hub stops reading and the events
 * wait in the kernel's queue; when the client is what is behind, that
 * stream drops events past the bound and one `overflow` event takes their
 * place once its queue is down to half, then events resume — a client
 * that stops reading never holds the hub (its pause is lifted at once).
 * IN_Q_OVERFLOW (the kernel's queue, shared by all streams) becomes
 * `overflow` on every stream (folded into a pending one).  Sending stops
 * once the call holds WD_OUTQ_MAX unsent bytes (or the daemon-wide budget
 * is past its half) and the transport has no room (rpc_out_room), and
 * resumes when it has, so a client that does not read costs at most the
 * queue plus WD_OUTQ_MAX and an event per stream.
 * `keepalive` after keepalive_ms (CONCH_FS_WATCH_KEEPALIVE_MS, default
 * 30000, 0 = never) with nothing sent and nothing queued.
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
/* A walk holds one open directory per level (fd and readdir buffer). */
#define WD_MAX_DEPTH 128
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
/* Directories where a new subdirectory appeared while they could not be
 * reopened (renamed, their events not read yet): retried after the next
 * rename the stream follows; at most WD_LOST_MAX, past it an overflow. */
#define WD_LOST_MAX 16

#define WD_MASK                                                                                  \
  (IN_CREATE | IN_MODIFY | IN_ATTRIB | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO | IN_DELETE_SELF | \
   IN_MOVE_SELF | IN_EXCL_UNLINK | IN_ONLYDIR)
#define WD_OPEN_DIR (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)

enum { WI_FS, WI_OVERFLOW, WI_SKIP, WI_END };

typedef struct wd_item {
  struct wd_item *next;
  int kind;      /* WI_*; the job turns WI_FS into WI_SKIP / WI_END */
  int type;      /* Pb__EventType */
  uint32_t mask, cookie;
  int wd;
  int end_after; /* the root went away: end the stream after this event */
  int ovf_after; /* part of a new directory could not be covered: an overflow after the extras */
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

/* A watched directory of one stream. */
typedef struct wnode {
  struct wnode *parent, *kids, *next_sib, *prev_sib;
  struct wnode *hw, *hn; /* hash chains: by wd, by (parent, name) */
  int wd;
  uint32_t hname;
  char *name; /* "" for the root */
} wnode;

typedef struct fs_watch fs_watch;

/* A watch descriptor of the hub and the streams subscribed to it. */
typedef struct hub_ent {
  struct hub_ent *next;
  int wd;
  unsigned n, cap;
  fs_watch **subs;
} hub_ent;

typedef struct wd_hub {
  int fd;
  uv_poll_t poll;
  uv_mutex_t mu;    /* tab, cap, used, and each stream's root_wd */
  hub_ent **tab;
  size_t cap, used;
  /* loop-owned */
  fs_watch *streams; /* every stream using the hub */
  int refs;          /* = streams in the list */
  int npaused;       /* streams whose full queue asks the reads to pause */
  int polling;
} wd_hub;

struct fs_watch {
  rpc_call *call; /* NULL once the call ended */
  char *root;
  size_t rootlen;
  int recursive;
  atomic_int cancel;
  fs_status st;
  wd_hub *hub;
  fs_watch *hprev, *hnext; /* the hub's list (loop) */
  int root_wd;             /* under hub->mu */
  /* job-owned (setup and item jobs) */
  int rootfd;        /* within a job only: an open fd would hold off DELETE_SELF */
  dev_t root_dev;    /* the root's identity, checked at each reopen */
  ino_t root_ino;
  wnode *rootn;
  wnode **by_wd, **by_name;
  size_t tab_cap, nnodes;
  wnode *cdir_node; /* the directory open at cdir_fd, within a job */
  int cdir_fd;
  int from_pending;
  uint32_t from_cookie;
  wnode *from_node; /* the directory a pending MOVED_FROM took (NULL: not watched) */
  wnode *lost[WD_LOST_MAX];
  size_t nlost;
  size_t scan_left;
  struct { char *rel; uint64_t until; } seen[WD_SEEN_MAX];
  size_t nseen;
  uint64_t items_seen;
  /* loop-owned */
  uv_timer_t ka;
  int handles;       /* initialised handles not yet closed */
  int busy;          /* a pool job is queued or running */
  int started;       /* the start event went out */
  int closing;
  int ending;        /* WI_END queued: ignore what follows */
  int ovf_pending;   /* events were dropped: an overflow is owed */
  int drain_armed;
  int read_paused;   /* counted in hub->npaused: the queue is full and the client keeps up */
  wd_item *head, *raw, *tail; /* head: oldest unsent; raw: first not yet given to a job */
  size_t count, bytes;
  wd_item *job_first;
  size_t job_n;
  uint64_t last_send;
  uint64_t ka_ms;
};

static void watch_pump(fs_watch *w);
static void watch_send(fs_watch *w);
static void watch_push(fs_watch *w, const struct inotify_event *ev);
static void watch_finish(fs_watch *w, rpc_code code, const char *msg);
static size_t watch_read_size(const fs_watch *w);

/* ---- the hub: its table (pool jobs add and drop, the loop dispatches) ---- */

static size_t wd_hash(int wd, size_t cap) { return ((uint32_t)wd * 2654435761u) & (cap - 1); }

static hub_ent **hub_slot(wd_hub *h, int wd) {
  if (!h->cap) return NULL;
  hub_ent **p = &h->tab[wd_hash(wd, h->cap)];
  while (*p && (*p)->wd != wd) p = &(*p)->next;
  return p;
}

/* Subscribe w to wd (once); -1 when out of memory.  Under h->mu. */
static int hub_sub(wd_hub *h, int wd, fs_watch *w) {
  hub_ent **p = hub_slot(h, wd);
  hub_ent *e = p ? *p : NULL;
  if (!e) {
    if (h->used + 1 > h->cap) {
      size_t nc = h->cap ? h->cap * 2 : 64;
      hub_ent **nt = calloc(nc, sizeof *nt);
      if (!nt) return -1;
      for (size_t i = 0; i < h->cap; i++)
        for (hub_ent *x = h->tab[i], *n; x; x = n) {
          n = x->next;
          size_t b = wd_hash(x->wd, nc);
          x->next = nt[b];
          nt[b] = x;
        }
      free(h->tab);
      h->tab = nt;
      h->cap = nc;
    }
    e = calloc(1, sizeof *e);
    if (!e) return -1;
    e->wd = wd;
    size_t b = wd_hash(wd, h->cap);
    e->next = h->tab[b];
    h->tab[b] = e;
    h->used++;
  }
  for (unsigned i = 0; i < e->n; i++)
    if (e->subs[i] == w) return 0;
  if (e->n == e->cap) {
    unsigned nc = e->cap ? e->cap * 2 : 2;
    fs_watch **ns = realloc(e->subs, nc * sizeof *ns);
    if (!ns) return -1;
    e->subs = ns;
    e->cap = nc;
  }
  e->subs[e->n++] = w;
  return 0;
}

/* Forget the entry at p (the kernel's watch is gone or being removed). */
static void hub_unlink(wd_hub *h, hub_ent **p) {
  hub_ent *e = *p;
  *p = e->next;
  h->used--;
  free(e->subs);
  free(e);
}

/* Watch the directory at path for w: the kernel's watch descriptor (the
 * same for every stream watching that inode), or -1 with errno. */
static int hub_add(fs_watch *w, const char *path, int is_root) {
  wd_hub *h = w->hub;
  uv_mutex_lock(&h->mu);
  int wd = inotify_add_watch(h->fd, path, WD_MASK);
  int e = errno;
  if (wd >= 0 && hub_sub(h, wd, w) != 0) {
    hub_ent **p = hub_slot(h, wd);
    if (p && *p && (*p)->n == 0) { /* nobody else had it */
      inotify_rm_watch(h->fd, wd);
      hub_unlink(h, p);
    } else if (!p || !*p) {
      inotify_rm_watch(h->fd, wd);
    }
    wd = -1;
    e = ENOMEM;
  }
  if (wd >= 0 && is_root) w->root_wd = wd;
  uv_mutex_unlock(&h->mu);
  errno = e;
  return wd;
}

/* w stops watching wd; the last stream to do so removes the kernel's watch. */
static void hub_drop(fs_watch *w, int wd) {
  wd_hub *h = w->hub;
  uv_mutex_lock(&h->mu);
  hub_ent **p = hub_slot(h, wd);
  hub_ent *e = p ? *p : NULL;
  if (e) { /* (absent: the kernel removed it already, IN_IGNORED) */
    for (unsigned i = 0; i < e->n; i++)
      if (e->subs[i] == w) {
        e->subs[i] = e->subs[--e->n];
        break;
      }
    if (e->n == 0) {
      inotify_rm_watch(h->fd, wd);
      hub_unlink(h, p);
    }
  }
  uv_mutex_unlock(&h->mu);
}

/* One event read from the hub: to every stream it concerns.  Loop. */
static void hub_dispatch(wd_hub *h, const struct inotify_event *ev) {
  if (ev->mask & IN_Q_OVERFLOW) { /* the shared kernel queue lost events: all streams */
    for (fs_watch *w = h->streams; w; w = w->hnext) watch_push(w, ev);
    return;
  }
  uv_mutex_lock(&h->mu);
  hub_ent **p = hub_slot(h, ev->wd);
  if (p && *p) {
    for (unsigned i = 0; i < (*p)->n; i++) watch_push((*p)->subs[i], ev);
    if (ev->mask & IN_IGNORED) hub_unlink(h, p); /* the kernel dropped the watch */
  }
  uv_mutex_unlock(&h->mu);
}

static void hub_on_poll(uv_poll_t *ph, int status, int events) {
  (void)events;
  wd_hub *h = ph->data;
  if (status < 0) {
    uv_poll_stop(&h->poll);
    h->polling = 0;
    for (fs_watch *w = h->streams, *nx; w; w = nx) {
      nx = w->hnext; /* (w may be freed: out of memory for its clean-up job) */
      if (w->call && !w->closing) watch_finish(w, RPC_INTERNAL, "watch directory: inotify read failed");
    }
    return;
  }
  static char buf[WD_READ_BUF] __attribute__((aligned(__alignof__(struct inotify_event))));
  /* one read fits in half of every stream's queue */
  size_t rdsize = WD_READ_BUF;
  for (fs_watch *w = h->streams; w; w = w->hnext) {
    size_t r = watch_read_size(w);
    if (r < rdsize) rdsize = r;
  }
  for (int r = 0; r < WD_READS; r++) {
    /* A stream whose queue has no room for a whole read while its client
     * keeps up: the daemon is the one behind, so leave the events in the
     * kernel's queue (bounded; past it IN_Q_OVERFLOW) until its job
     * catches up. */
    if (h->npaused) {
      uv_poll_stop(&h->poll);
      h->polling = 0;
      break;
    }
    ssize_t n = read(h->fd, buf, rdsize);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t off = 0; off + (ssize_t)sizeof(struct inotify_event) <= n;) {
      const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
      hub_dispatch(h, ev);
      off += (ssize_t)(sizeof *ev + ev->len);
    }
  }
  for (fs_watch *w = h->streams, *nx; w; w = nx) {
    nx = w->hnext; /* (as above) */
    if (w->call && !w->closing) watch_pump(w);
  }
}

static void hub_pause(fs_watch *w) {
  if (w->read_paused) return;
  w->read_paused = 1;
  w->hub->npaused++;
}

static void hub_unpause(fs_watch *w) {
  if (!w->read_paused) return;
  w->read_paused = 0;
  wd_hub *h = w->hub;
  if (--h->npaused == 0 && !h->polling) {
    h->polling = 1;
    uv_poll_start(&h->poll, UV_READABLE, hub_on_poll);
  }
}

static wd_hub *hub_cur; /* the hub new streams join (loop) */

/* The hub for a new stream w (made on first use); NULL when inotify_init1
 * or memory fails (errno says which). */
static wd_hub *hub_join(fs_watch *w) {
  wd_hub *h = hub_cur;
  if (!h) {
    h = calloc(1, sizeof *h);
    if (!h) return NULL;
    h->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (h->fd < 0) {
      int e = errno;
      free(h);
      errno = e;
      return NULL;
    }
    if (uv_poll_init(fs_loop, &h->poll, h->fd) != 0) {
      close(h->fd);
      free(h);
      errno = ENOMEM;
      return NULL;
    }
    uv_mutex_init(&h->mu);
    h->poll.data = h;
    h->polling = 1;
    uv_poll_start(&h->poll, UV_READABLE, hub_on_poll);
    hub_cur = h;
  }
  h->refs++;
  w->hub = h;
  w->hnext = h->streams;
  if (h->streams) h->streams->hprev = w;
  h->streams = w;
  return h;
}

static void hub_close_work(void *data) {
  wd_hub *h = data;
  close(h->fd); /* may wait for RCU */
  h->fd = -1;
}

static void hub_closed(void *data, int canceled) {
  (void)canceled;
  wd_hub *h = data;
  if (h->fd >= 0) close(h->fd); /* the job could not run */
  for (size_t i = 0; i < h->cap; i++)
    while (h->tab[i]) hub_unlink(h, &h->tab[i]);
  free(h->tab);
  uv_mutex_destroy(&h->mu);
  free(h);
}

static void hub_on_poll_closed(uv_handle_t *hd) {
  wd_hub *h = hd->data;
  if (!rpc_work_submit(NULL, hub_close_work, hub_closed, h)) hub_closed(h, 1);
}

/* w leaves its hub (every watch of w already dropped); the last one closes it. */
static void hub_leave(fs_watch *w) {
  wd_hub *h = w->hub;
  if (!h) return;
  hub_unpause(w);
  if (w->hprev) w->hprev->hnext = w->hnext;
  else h->streams = w->hnext;
  if (w->hnext) w->hnext->hprev = w->hprev;
  w->hub = NULL;
  if (--h->refs) return;
  if (hub_cur == h) hub_cur = NULL;
  if (h->polling) uv_poll_stop(&h->poll);
  h->polling = 0;
  uv_close((uv_handle_t *)&h->poll, hub_on_poll_closed);
}

/* ---- a stream's tree of watched directories (its pool jobs only) ---- */

static uint32_t name_hash(const wnode *parent, const char *name) {
  uint32_t x = 2166136261u ^ (uint32_t)((uintptr_t)parent >> 4);
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) x = (x ^ *p) * 16777619u;
  return x;
}

static wnode *node_by_wd(fs_watch *w, int wd) {
  if (!w->tab_cap) return NULL;
  wnode *n = w->by_wd[wd_hash(wd, w->tab_cap)];
  while (n && n->wd != wd) n = n->hw;
  return n;
}

static wnode *node_child(fs_watch *w, wnode *parent, const char *name) {
  if (!w->tab_cap) return NULL;
  uint32_t hv = name_hash(parent, name);
  wnode *n = w->by_name[hv & (w->tab_cap - 1)];
  while (n && !(n->hname == hv && n->parent == parent && strcmp(n->name, name) == 0)) n = n->hn;
  return n;
}

static void name_insert(fs_watch *w, wnode *n) {
  n->hname = name_hash(n->parent, n->name);
  size_t b = n->hname & (w->tab_cap - 1);
  n->hn = w->by_name[b];
  w->by_name[b] = n;
}

static void name_remove(fs_watch *w, wnode *n) {
  wnode **p = &w->by_name[n->hname & (w->tab_cap - 1)];
  while (*p != n) p = &(*p)->hn;
  *p = n->hn;
}

static void wd_insert(fs_watch *w, wnode *n) {
  size_t b = wd_hash(n->wd, w->tab_cap);
  n->hw = w->by_wd[b];
  w->by_wd[b] = n;
}

static void kid_link(wnode *n) {
  wnode *p = n->parent;
  n->prev_sib = NULL;
  n->next_sib = NULL;
  if (!p) return;
  n->next_sib = p->kids;
  if (p->kids) p->kids->prev_sib = n;
  p->kids = n;
}

static void kid_unlink(wnode *n) {
  if (!n->parent) return;
  if (n->prev_sib) n->prev_sib->next_sib = n->next_sib;
  else n->parent->kids = n->next_sib;
  if (n->next_sib) n->next_sib->prev_sib = n->prev_sib;
  n->prev_sib = n->next_sib = NULL;
}

/* The tree changed: the cached open directory may name another one now. */
static void cdir_forget(fs_watch *w) {
  if (w->cdir_fd >= 0) close(w->cdir_fd);
  w->cdir_fd = -1;
  w->cdir_node = NULL;
}

/* Drop n and everything below it: unsubscribe, unlink, free.  Iterative,
 * linear in the subtree. */
static void node_drop(fs_watch *w, wnode *n) {
  cdir_forget(w);
  kid_unlink(n);
  wnode *x = n;
  for (;;) {
    while (x->kids) x = x->kids;
    wnode *p = x->parent;
    int last = x == n;
    if (!last) {
      p->kids = x->next_sib;
      if (p->kids) p->kids->prev_sib = NULL;
    }
    hub_drop(w, x->wd);
    wnode **q = &w->by_wd[wd_hash(x->wd, w->tab_cap)];
    while (*q != x) q = &(*q)->hw;
    *q = x->hw;
    name_remove(w, x);
    if (w->from_node == x) w->from_node = NULL;
    for (size_t i = 0; i < w->nlost; i++)
      if (w->lost[i] == x) {
        w->lost[i] = w->lost[--w->nlost]; /* gone from the tree: nothing to retry */
        break;
      }
    free(x->name);
    free(x);
    w->nnodes--;
    if (last) break;
    x = p->kids ? p->kids : p;
  }
  if (n == w->rootn) w->rootn = NULL;
}

/* 1 when a is n or below it. */
static int node_within(const wnode *a, const wnode *n) {
  for (; a; a = a->parent)
    if (a == n) return 1;
  return 0;
}

/* A node for wd at (parent, name); NULL when out of memory.  A stale node
 * still at that name (its directory was replaced) is dropped. */
static wnode *node_add(fs_watch *w, wnode *parent, const char *name, int wd) {
  if (w->nnodes + 1 > w->tab_cap) {
    size_t nc = w->tab_cap ? w->tab_cap * 2 : 64;
    wnode **a = calloc(nc, sizeof *a), **b = calloc(nc, sizeof *b);
    if (!a || !b) {
      free(a);
      free(b);
      return NULL;
    }
    for (size_t i = 0; i < w->tab_cap; i++)
      for (wnode *x = w->by_wd[i], *nx; x; x = nx) {
        nx = x->hw;
        size_t k = wd_hash(x->wd, nc);
        x->hw = a[k];
        a[k] = x;
      }
    for (size_t i = 0; i < w->tab_cap; i++)
      for (wnode *x = w->by_name[i], *nx; x; x = nx) {
        nx = x->hn;
        x->hn = b[x->hname & (nc - 1)];
        b[x->hname & (nc - 1)] = x;
      }
    free(w->by_wd);
    free(w->by_name);
    w->by_wd = a;
    w->by_name = b;
    w->tab_cap = nc;
  }
  if (parent) {
    wnode *old = node_child(w, parent, name);
    if (old) node_drop(w, old);
  }
  wnode *n = calloc(1, sizeof *n);
  if (n) n->name = strdup(name);
  if (!n || !n->name) {
    free(n);
    return NULL;
  }
  n->wd = wd;
  n->parent = parent;
  kid_link(n);
  wd_insert(w, n);
  name_insert(w, n);
  w->nnodes++;
  return n;
}

/* n (with its subtree) now is `name` under parent.  -1 (nothing changed)
 * when parent is n or below it, or out of memory. */
static int node_move(fs_watch *w, wnode *n, wnode *parent, const char *name) {
  if (node_within(parent, n)) return -1;
  char *nm = strdup(name);
  if (!nm) return -1;
  wnode *old = node_child(w, parent, name);
  if (old && old != n) {
    if (node_within(n, old)) return -1; /* (a stale tree: leave it) */
    node_drop(w, old); /* replaced by the rename */
  }
  cdir_forget(w);
  name_remove(w, n);
  kid_unlink(n);
  free(n->name);
  n->name = nm;
  n->parent = parent;
  kid_link(n);
  name_insert(w, n);
  return 0;
}

static size_t node_depth(const wnode *n) {
  size_t d = 0;
  for (; n && n->parent; n = n->parent) d++;
  return d;
}

/* The relative name of n ("" for the root), malloc'd. */
static char *node_rel(const wnode *n) {
  size_t len = 0;
  for (const wnode *x = n; x->parent; x = x->parent) len += strlen(x->name) + 1;
  char *r = malloc(len ? len : 1);
  if (!r) return NULL;
  if (!len) {
    r[0] = 0;
    return r;
  }
  size_t at = len - 1;
  r[at] = 0;
  for (const wnode *x = n; x->parent; x = x->parent) {
    size_t l = strlen(x->name);
    at -= l;
    memcpy(r + at, x->name, l);
    if (at) r[--at] = '/';
  }
  return r;
}

/* The root, reopened by its path for this job and accepted only if it is
 * still the directory the stream watches; -1 otherwise. */
static int root_fd(fs_watch *w) {
  if (w->rootfd >= 0) return w->rootfd;
  int fd = open(w->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd >= 0 && (fstat(fd, &sb) != 0 || sb.st_dev != w->root_dev || sb.st_ino != w->root_ino)) {
    close(fd);
    fd = -1;
  }
  return w->rootfd = fd;
}

/* A job ends: it holds no descriptor past it. */
static void job_release(fs_watch *w) {
  cdir_forget(w);
  if (w->rootfd >= 0) close(w->rootfd);
  w->rootfd = -1;
}

/* The directory of n, opened component by component from the root fd
 * (O_NOFOLLOW: a component swapped for a symlink fails, it is never
 * followed).  Cached until the tree changes or the job ends; -1 when it
 * is no longer where the tree says. */
static int node_dirfd(fs_watch *w, wnode *n) {
  if (w->cdir_node == n && w->cdir_fd >= 0) return w->cdir_fd;
  cdir_forget(w);
  if (root_fd(w) < 0) return -1;
  size_t d = node_depth(n);
  int fd;
  if (!d) {
    fd = fcntl(w->rootfd, F_DUPFD_CLOEXEC, 0);
  } else {
    const wnode **v = malloc(d * sizeof *v);
    if (!v) return -1;
    size_t i = 0;
    for (const wnode *x = n; x->parent; x = x->parent) v[i++] = x;
    fd = w->rootfd;
    while (i-- > 0) {
      int nfd = openat(fd, v[i]->name, WD_OPEN_DIR);
      if (fd != w->rootfd) close(fd);
      fd = nfd;
      if (fd < 0) break;
    }
    free(v);
  }
  if (fd < 0) return -1;
  w->cdir_node = n;
  w->cdir_fd = fd;
  return fd;
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

/* A directory that cannot be opened for the walk: gone or not a directory
 * (any more) is nothing to watch; anything else leaves it uncovered. */
static int open_failed(fs_watch *w, const char *rel, int e) {
  if (e == ENOENT || e == ENOTDIR || e == ELOOP) return 0;
  char *full = join_full(w, rel);
  fs_status_os(&w->st, "watch directory", full ? full : w->root, e);
  if (e == EMFILE || e == ENFILE || e == ENOMEM) w->st.code = RPC_RESOURCE_EXHAUSTED;
  free(full);
  return -1;
}

/* A synthetic CREATE for entry `name` (lstat'ed as sb) of the directory
 * open at dfd, whose relative name is crel. */
static void scan_report(fs_watch *w, int dfd, const char *name, const char *crel, const struct stat *sb,
                        wd_item ***out, wd_item *owner) {
  if (w->scan_left == 0) {
    owner->ovf_after = 1;
    return;
  }
  wd_item *x = calloc(1, sizeof *x);
  if (x) x->full = join_full(w, crel);
  if (!x || !x->full) {
    free(x);
    return;
  }
  w->scan_left--;
  x->kind = WI_FS;
  x->type = PB__EVENT_TYPE__EVENT_TYPE_CREATE;
  x->rel = x->full + (strlen(x->full) - strlen(crel));
  struct stat fb;
  if (fstatat(dfd, name, &fb, 0) != 0) fb = *sb; /* a link to nowhere: itself */
  fs_entry_fill(&x->e, &fb);
  x->e.path = x->full;
  x->e.name = fs_path_base(x->full);
  x->has_entry = 1;
  seen_add(w, x->rel);
  **out = x;
  *out = &x->next;
}

/* Watch the directory open at dfd (taken: closed here), `depth` levels
 * below the root, as `name` under `parent` (NULL: the root itself), and,
 * recursive, every directory below it; with `out`, append a synthetic
 * CREATE for each entry found (a new directory's contents).  0 when all of
 * it is watched, -1 when some of it could not be (w->st says why; the
 * rest is watched). */
static int watch_dir(fs_watch *w, int dfd, wnode *parent, const char *name, size_t depth, wd_item ***out,
                     wd_item *owner) {
  if (depth > WD_MAX_DEPTH) {
    close(dfd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: directory tree deeper than %d levels",
                  w->root, WD_MAX_DEPTH);
    return -1;
  }
  if (w->nnodes >= WD_MAX_WATCHES) {
    close(dfd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: more than %d directories", w->root,
                  WD_MAX_WATCHES);
    return -1;
  }
  char proc[40];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
  int wd = hub_add(w, proc, parent == NULL);
  if (wd < 0) {
    int e = errno;
    close(dfd);
    if (e == ENOSPC)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: inotify watch limit reached", w->root);
    else if (e == ENOMEM)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    else
      fs_status_os(&w->st, "watch directory", w->root, e);
    return -1;
  }
  wnode *n = node_by_wd(w, wd);
  if (n) {
    /* this directory is in the tree already (moved without our seeing
     * both halves, or a bind mount): it takes the new name unless that
     * would put it inside itself; its subtree is watched already */
    close(dfd);
    if (parent && n->parent) node_move(w, n, parent, name);
    return 0;
  }
  n = node_add(w, parent, name, wd);
  if (!n) {
    close(dfd);
    hub_drop(w, wd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    return -1;
  }
  if (!parent) w->rootn = n;
  if (!w->recursive && !parent) {
    close(dfd);
    return 0;
  }
  DIR *d = fdopendir(dfd);
  if (!d) {
    int e = errno;
    close(dfd);
    fs_status_os(&w->st, "watch directory", w->root, e);
    return -1;
  }
  char *rel = node_rel(n);
  if (!rel) {
    closedir(d);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    return -1;
  }
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *cn = de->d_name;
    if (cn[0] == '.' && (!cn[1] || (cn[1] == '.' && !cn[2]))) continue;
    if (watch_canceled(w)) break;
    struct stat sb;
    if (fstatat(dirfd(d), cn, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone */
    int isdir = S_ISDIR(sb.st_mode);
    if (!out && !(isdir && w->recursive)) continue;
    char *crel = join_rel(rel, cn, strlen(cn));
    if (!crel) break;
    if (out) scan_report(w, dirfd(d), cn, crel, &sb, out, owner);
    if (isdir && w->recursive) {
      int cfd = openat(dirfd(d), cn, WD_OPEN_DIR);
      if (cfd < 0) {
        if (open_failed(w, crel, errno) != 0) rc = -1;
      } else if (watch_dir(w, cfd, n, cn, depth + 1, out, owner) != 0) {
        rc = -1;
      }
    }
    free(crel);
    if (rc != 0 && !out) break; /* setup fails anyway */
  }
  free(rel);
  closedir(d);
  return rc;
}

static void watch_setup_work(void *data) {
  fs_watch *w = data;
  /* the root's own path may hold symlinks (the client named it); below it
   * nothing is followed */
  w->rootfd = open(w->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (w->rootfd < 0) {
    int e = errno;
    struct stat sb;
    if (e == ENOTDIR && stat(w->root, &sb) == 0 && !S_ISDIR(sb.st_mode))
      fs_status_set(&w->st, RPC_INVALID_ARGUMENT, "path is not a directory: %s", w->root);
    else if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&w->st, RPC_NOT_FOUND, "path not found: %s", w->root);
    else
      fs_status_os(&w->st, "stat path", w->root, e);
    return;
  }
  struct stat sb;
  if (fstat(w->rootfd, &sb) != 0) {
    fs_status_os(&w->st, "stat path", w->root, errno);
    job_release(w);
    return;
  }
  w->root_dev = sb.st_dev;
  w->root_ino = sb.st_ino;
  fs_status_clear(&w->st);
  int fd = fcntl(w->rootfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) fs_status_os(&w->st, "watch directory", w->root, errno);
  else watch_dir(w, fd, NULL, "", 0, NULL, NULL);
  job_release(w);
}

/* A directory created or moved in, `name` in dir (open at dfd): watch it
 * and below (with out: report what it holds).  -1 when some of it could
 * not be watched. */
static int watch_new_dir(fs_watch *w, wnode *dir, int dfd, const char *name, const char *rel, wd_item ***out,
                         wd_item *owner) {
  int cfd = openat(dfd, name, WD_OPEN_DIR);
  int rc = cfd < 0 ? open_failed(w, rel, errno) : watch_dir(w, cfd, dir, name, node_depth(dir) + 1, out, owner);
  if (rc != 0) LOG_DEBUG("watch: %s", w->st.msg ? w->st.msg : "out of memory");
  fs_status_clear(&w->st);
  return rc;
}

/* The subdirectories of n (open at dfd) not in the tree yet: watched, what
 * they hold reported.  -1 when some could not be. */
static int watch_missing(fs_watch *w, wnode *n, int dfd, wd_item ***out, wd_item *owner) {
  int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return -1;
  }
  char *rel = node_rel(n);
  int rc = rel ? 0 : -1;
  struct dirent *de;
  while (rel && (de = readdir(d)) != NULL) {
    const char *cn = de->d_name;
    struct stat sb;
    if (cn[0] == '.' && (!cn[1] || (cn[1] == '.' && !cn[2]))) continue;
    if (fstatat(dirfd(d), cn, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode) || node_child(w, n, cn))
      continue;
    char *crel = join_rel(rel, cn, strlen(cn));
    if (!crel || watch_new_dir(w, n, dirfd(d), cn, crel, out, owner) != 0) rc = -1;
    free(crel);
  }
  free(rel);
  closedir(d);
  return rc;
}

/* A rename was followed: the lost directories that can be reopened now get
 * their missing subdirectories watched (reported after `it`). */
static void lost_retry(fs_watch *w, wd_item *it) {
  wd_item **out = &it->extra;
  while (*out) out = &(*out)->next;
  for (;;) {
    size_t i = 0;
    int dfd = -1;
    for (; i < w->nlost && (dfd = node_dirfd(w, w->lost[i])) < 0; i++) {
    }
    if (i == w->nlost) return;
    wnode *n = w->lost[i];
    w->lost[i] = w->lost[--w->nlost];
    if (watch_missing(w, n, dfd, &out, it) != 0) it->ovf_after = 1;
  }
}

/* Resolve, stat and (recursive) follow one item; pool thread. */
static void watch_item_work(fs_watch *w, wd_item *it) {
  if (it->kind != WI_FS) return;
  if (w->from_pending && !((it->mask & IN_MOVED_TO) && it->cookie == w->from_cookie)) {
    if (w->from_node) node_drop(w, w->from_node); /* that directory left the tree */
    w->from_node = NULL;
    w->from_pending = 0;
  }
  wnode *dir = node_by_wd(w, it->wd);
  if (!dir) {
    it->kind = WI_SKIP; /* a watch already dropped */
    return;
  }
  uint32_t m = it->mask;
  if (m & IN_IGNORED) {
    int is_root = dir == w->rootn;
    if (!is_root) node_drop(w, dir); /* (the root's go with the stream) */
    it->kind = is_root ? WI_END : WI_SKIP;
    return;
  }
  if (m & (IN_DELETE_SELF | IN_MOVE_SELF)) {
    if (dir != w->rootn) {
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
  char *drel = node_rel(dir);
  char *rel = drel ? join_rel(drel, it->name, it->namelen) : NULL;
  free(drel);
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
  int follow = w->recursive && (m & IN_ISDIR) && it->kind == WI_FS;
  /* the directory is reached from the root by descriptor, never by path */
  int dfd = (want_entry && it->kind == WI_FS) || (follow && !(m & IN_MOVED_FROM)) ? node_dirfd(w, dir) : -1;
  if (want_entry && it->kind == WI_FS && dfd >= 0) {
    struct stat sb;
    if (fstatat(dfd, it->name, &sb, 0) == 0 || fstatat(dfd, it->name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
      fs_entry_fill(&it->e, &sb);
      it->e.path = it->full;
      it->e.name = fs_path_base(it->full);
      it->has_entry = 1;
    }
  }
  if (follow) {
    if (m & IN_MOVED_FROM) {
      w->from_pending = 1;
      w->from_cookie = it->cookie;
      w->from_node = node_child(w, dir, it->name);
    } else if ((m & IN_MOVED_TO) && w->from_pending && it->cookie == w->from_cookie && w->from_node) {
      /* moved inside the tree: the subtree keeps its watches */
      if (node_move(w, w->from_node, dir, it->name) != 0) node_drop(w, w->from_node);
      w->from_node = NULL;
      w->from_pending = 0;
      if (w->nlost) lost_retry(w, it);
    } else if (m & (IN_CREATE | IN_MOVED_TO)) {
      w->from_pending = 0; /* (a pending one whose directory was not watched) */
      wd_item **out = &it->extra;
      /* a part that cannot be watched: say events may be lost */
      if (dfd < 0) {
        /* the parent is not where the tree says: removed or moved, and its
         * own events follow — if it was renamed, retry after that */
        size_t i = 0;
        while (i < w->nlost && w->lost[i] != dir) i++;
        if (i == w->nlost && w->nlost < WD_LOST_MAX) w->lost[w->nlost++] = dir;
        else if (i == w->nlost) it->ovf_after = 1;
      } else if (watch_new_dir(w, dir, dfd, it->name, rel, (m & IN_CREATE) ? &out : NULL, it) != 0) {
        it->ovf_after = 1;
      }
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
  job_release(w);
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
  for (size_t i = 0; i < w->nseen; i++) free(w->seen[i].rel);
  hub_leave(w);
  free(w->root);
  fs_status_clear(&w->st);
  free(w);
}

/* A pool job for w (one at a time, w->busy); out of memory: done(w, 1) at once. */
static void watch_submit(fs_watch *w, void (*run)(void *), void (*done)(void *, int)) {
  if (!rpc_work_submit(w->call, run, done, w)) done(w, 1);
}

/* Drop every watch of the stream (the hub removes those no other stream
 * holds) and its tree: linear in the tree. */
static void watch_close_work(void *data) {
  fs_watch *w = data;
  job_release(w);
  if (w->rootn) node_drop(w, w->rootn);
  free(w->by_wd);
  free(w->by_name);
  w->by_wd = w->by_name = NULL;
  w->tab_cap = 0;
}

static void watch_closed(void *data, int canceled) {
  fs_watch *w = data;
  if (canceled) watch_close_work(w); /* the job could not run */
  watch_free(w);
}

/* Free once nothing is in flight: handles closed, no job; the watches go
 * in the pool. */
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
  if (w->hub) hub_unpause(w);
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

/* The hub reads on for w while its queue has room for a whole read or its
 * client is what is behind (then w drops instead: a client that does not
 * read never holds the hub); not held while the setup walk runs. */
static void watch_gate(fs_watch *w) {
  if (!w->hub) return;
  if (!w->call || w->drain_armed || watch_read_room(w)) hub_unpause(w);
  else if (w->started) hub_pause(w);
}

/* The owed overflow, once the queue is down to half, in events and in
 * bytes (so that a slow reader gets one overflow per stall, not one per
 * freed slot: the hub drops for a client that is behind rather than wait). */
static void watch_owe_overflow(fs_watch *w) {
  if (!w->ovf_pending || w->count > WD_QUEUE_MAX / 2 || w->bytes > WD_QUEUE_BYTES / 2) return;
  wd_item *o = item_new(0);
  if (!o) return;
  o->kind = WI_OVERFLOW;
  queue_append(w, o);
  w->ovf_pending = 0;
}

/* One inotify event from the hub's read (under hub->mu, but for
 * IN_Q_OVERFLOW). */
static void watch_push(fs_watch *w, const struct inotify_event *ev) {
  if (w->ending || w->closing || !w->call) return;
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
  /* no room for another whole read while the client keeps up: the hub
   * waits (not while the setup walk runs: that may be long) */
  watch_gate(w);
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
      hub_unpause(w); /* the client is behind: never hold the hub for it */
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
  if (w->call) watch_gate(w);
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
  w->started = 1;
  LOG_DEBUG("watch started root=%s recursive=%d watches=%zu", w->root, w->recursive, w->nnodes);
  Pb__WatchDirEvent ev = PB__WATCH_DIR_EVENT__INIT;
  Pb__WatchDirStart s = PB__WATCH_DIR_START__INIT;
  ev.event_case = PB__WATCH_DIR_EVENT__EVENT_START;
  ev.start = &s;
  if (watch_send_msg(w, &ev) != 0) return;
  watch_pump(w); /* what the hub queued during the walk */
  if (w->call && w->ka_ms) uv_timer_start(&w->ka, watch_on_ka, w->ka_ms, 0);
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
  w->rootfd = -1;
  w->cdir_fd = -1;
  w->root_wd = -1;
  if (!hub_join(w)) {
    int e = errno;
    free(w->root);
    free(w);
    if (e == EMFILE || e == ENFILE || e == ENOMEM)
      rpc_finishf(c, RPC_RESOURCE_EXHAUSTED, "watch directory %s: too many inotify instances", req->path);
    else
      rpc_finishf(c, RPC_INTERNAL, "watch directory %s: inotify: %s", req->path, strerror(e));
    return;
  }
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
