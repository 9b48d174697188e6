/* fs/watch_queue — a WatchDir stream's queue of items (see fs/watch.c);
 * loop thread.
 *
 * Events go through a FIFO of items per stream: the hub appends what it
 * reads, a pool job (one at a time per stream, in order) makes them ready,
 * watch.c sends them.  Consecutive writes to one entry not yet handed to
 * a job are coalesced.
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
 * `overflow` on every stream (folded into a pending one).
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>

#include "fs/watch_int.h"

void wd_item_free(wd_item *it) {
  for (wd_item *x = it->extra, *n; x; x = n) {
    n = x->next;
    free(x->full);
    free(x);
  }
  free(it->full);
  free(it);
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

size_t watch_read_size(const fs_watch *w) {
  size_t b = WD_QUEUE_BYTES / 2 * sizeof(struct inotify_event) / item_cost(w, 0);
  size_t min = sizeof(struct inotify_event) + NAME_MAX + 1; /* one event always fits */
  return b < min ? min : b > WD_READ_BUF ? WD_READ_BUF : b;
}

/* Room for a whole read in the queue. */
static int watch_read_room(const fs_watch *w) {
  return w->count + WD_READ_EVENTS <= WD_QUEUE_MAX && w->bytes <= WD_QUEUE_BYTES / 2;
}

void watch_gate(fs_watch *w) {
  if (!w->hub) return;
  if (!w->call || w->drain_armed || watch_read_room(w)) wd_hub_unpause(w);
  else if (w->started) wd_hub_pause(w);
}

void watch_owe_overflow(fs_watch *w) {
  if (!w->ovf_pending || w->count > WD_QUEUE_MAX / 2 || w->bytes > WD_QUEUE_BYTES / 2) return;
  wd_item *o = item_new(0);
  if (!o) return;
  o->kind = WI_OVERFLOW;
  queue_append(w, o);
  w->ovf_pending = 0;
}

void watch_push(fs_watch *w, const struct inotify_event *ev) {
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
