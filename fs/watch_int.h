/* fs/watch_int — internal to fs/watch*.c (WatchDir): the stream, the hub
 * and the tree types, the bounds, and the functions the files give each
 * other.  No other fs/ file includes it; the service sees fs_watch_on_request
 * and fs_watch_on_cancel (fs/handlers.h) only.
 *
 * Layers, each calling only those below it:
 *   watch.c        the RPC: request and cancel, the stream's pool jobs
 *                  submitted and done, events encoded and sent, keepalive,
 *                  teardown (loop)
 *   watch_queue.c  a stream's FIFO of items and its bounds, fed by the hub
 *                  (loop)
 *   watch_job.c    the pool jobs: the setup walk, item resolution (stat,
 *                  new directories watched and scanned, renames followed),
 *                  the stream's watches dropped at its end (pool)
 *   watch_tree.c   a stream's tree of watched directories and the reopening
 *                  of a directory by descriptor from the root (pool)
 *   watch_hub.c    the one inotify instance: its watch descriptor table
 *                  (loop and pool, under its mutex) and its reads (loop)
 * The hub reaches the streams above it only through wd_hub_ops (watch.c
 * gives them to wd_hub_join), so calls between two files go one way.
 */
#ifndef CONCH_FS_WATCH_INT_H
#define CONCH_FS_WATCH_INT_H

#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/inotify.h>
#include <sys/types.h>
#include <uv.h>

#include "core/list.h"
#include "server/rpc.h"
#include "fs/status.h"
#include "fs/walk.h"

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
  struct wnode *parent;
  list_node kids; /* its subdirectories in the tree (sib), newest first */
  list_node sib;  /* in parent->kids */
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

/* What the hub asks of the streams above it: hooks, so that watch_hub.c
 * calls no file above it.  watch.c's, the same for every stream. */
typedef struct wd_hub_ops {
  size_t (*read_size)(const fs_watch *w);                      /* watch_read_size */
  void (*push)(fs_watch *w, const struct inotify_event *ev);   /* watch_push */
  void (*pump)(fs_watch *w);                                   /* after the reads */
  void (*finish)(fs_watch *w, rpc_code code, const char *msg); /* the fd failed */
} wd_hub_ops;

typedef struct wd_hub {
  int fd;
  uv_poll_t poll;
  uv_mutex_t mu;    /* tab, cap, used, and each stream's root_wd */
  hub_ent **tab;
  size_t cap, used;
  /* loop-owned */
  list_node streams; /* every stream using the hub (fs_watch.hlink), newest first */
  int refs;          /* = streams in the list */
  int npaused;       /* streams whose full queue asks the reads to pause */
  int polling;
  const wd_hub_ops *ops; /* set by the stream that made the hub */
} wd_hub;

struct fs_watch {
  rpc_call *call; /* NULL once the call ended */
  char *root;
  size_t rootlen;
  int recursive;
  atomic_int cancel;
  fs_status st;
  wd_hub *hub;
  list_node hlink;         /* in hub->streams (loop) */
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


/* Watch descriptor → bucket, for the hub's table and a stream's by_wd. */
static inline size_t wd_hash(int wd, size_t cap) { return ((uint32_t)wd * 2654435761u) & (cap - 1); }

/* ---- watch_hub.c ---- */

/* Watch the directory at path for w: the kernel's watch descriptor (the
 * same for every stream watching that inode), or -1 with errno.  Pool. */
int wd_hub_add(fs_watch *w, const char *path, int is_root);
/* w stops watching wd; the last stream to do so removes the kernel's watch.
 * Pool. */
void wd_hub_drop(fs_watch *w, int wd);
/* w's full queue asks the hub's reads to pause / no longer does.  Loop. */
void wd_hub_pause(fs_watch *w);
void wd_hub_unpause(fs_watch *w);
/* The hub for a new stream w (made on first use, with ops); NULL when
 * inotify_init1 or memory fails (errno says which).  Loop. */
wd_hub *wd_hub_join(fs_watch *w, const wd_hub_ops *ops);
/* w leaves its hub (every watch of w already dropped); the last one closes
 * it.  Loop. */
void wd_hub_leave(fs_watch *w);

/* ---- watch_tree.c (a stream's pool jobs only) ---- */

/* The node watching wd; NULL when none. */
wnode *wd_node_by_wd(fs_watch *w, int wd);
/* The node `name` under parent; NULL when not in the tree. */
wnode *wd_node_child(fs_watch *w, wnode *parent, const char *name);
/* Drop n and everything below it: unsubscribe, unlink, free.  Iterative,
 * linear in the subtree. */
void wd_node_drop(fs_watch *w, wnode *n);
/* A node for wd at (parent, name); NULL when out of memory.  A stale node
 * still at that name (its directory was replaced) is dropped. */
wnode *wd_node_add(fs_watch *w, wnode *parent, const char *name, int wd);
/* n (with its subtree) now is `name` under parent.  -1 (nothing changed)
 * when parent is n or below it, or out of memory. */
int wd_node_move(fs_watch *w, wnode *n, wnode *parent, const char *name);
/* Levels below the root (0 for the root). */
size_t wd_node_depth(const wnode *n);
/* The relative name of n ("" for the root), malloc'd. */
char *wd_node_rel(const wnode *n);
/* A job ends: it holds no descriptor past it. */
void wd_job_release(fs_watch *w);
/* The directory of n, opened component by component from the root fd
 * (O_NOFOLLOW: a component swapped for a symlink fails, it is never
 * followed).  Cached until the tree changes or the job ends; -1 when it
 * is no longer where the tree says. */
int wd_node_dirfd(fs_watch *w, wnode *n);
/* root + "/" + rel (rel "" → root), malloc'd. */
char *wd_join_full(const fs_watch *w, const char *rel);
/* rel of a child: dir "" → name, else dir/name; malloc'd. */
char *wd_join_rel(const char *dir, const char *name, size_t nl);

/* ---- watch_job.c (pool work bodies, one job of a stream at a time) ---- */

/* Setup: open the root, record its identity, watch it and (recursive)
 * every directory below; w->st says what failed. */
void watch_setup_work(void *data);
/* Resolve, stat and (recursive) follow the job's items (w->job_first,
 * w->job_n). */
void watch_items_work(void *data);
/* Drop every watch of the stream (the hub removes those no other stream
 * holds) and its tree: linear in the tree. */
void watch_close_work(void *data);

/* ---- watch_queue.c (loop) ---- */

/* Free an item and the extras a scan attached to it. */
void wd_item_free(wd_item *it);
/* A read of rdsize bytes holds at most rdsize / 16 events, each costing
 * at most item_cost(w, 0) per 16 bytes read (an event without a name);
 * reads are sized so that one fits in half the queue's bytes. */
size_t watch_read_size(const fs_watch *w);
/* The hub reads on for w while its queue has room for a whole read or its
 * client is what is behind (then w drops instead: a client that does not
 * read never holds the hub); not held while the setup walk runs. */
void watch_gate(fs_watch *w);
/* The owed overflow, once the queue is down to half, in events and in
 * bytes (so that a slow reader gets one overflow per stall, not one per
 * freed slot: the hub drops for a client that is behind rather than wait). */
void watch_owe_overflow(fs_watch *w);
/* One inotify event from the hub's read (under hub->mu, but for
 * IN_Q_OVERFLOW). */
void watch_push(fs_watch *w, const struct inotify_event *ev);

#endif
