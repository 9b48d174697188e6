/* fs/watch_hub — the one inotify instance of WatchDir (see fs/watch.c).
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
 * subscribed streams' queues under it (through wd_hub_ops: the streams are
 * above the hub).
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/inotify.h>
#include <unistd.h>
#include <uv.h>

#include "fs/handlers.h"
#include "fs/watch_int.h"

/* ---- the table (pool jobs add and drop, the loop dispatches) ---- */

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

int wd_hub_add(fs_watch *w, const char *path, int is_root) {
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

void wd_hub_drop(fs_watch *w, int wd) {
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
    fs_watch *w;
    list_each(w, &h->streams, hlink) h->ops->push(w, ev);
    return;
  }
  uv_mutex_lock(&h->mu);
  hub_ent **p = hub_slot(h, ev->wd);
  if (p && *p) {
    for (unsigned i = 0; i < (*p)->n; i++) h->ops->push((*p)->subs[i], ev);
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
    fs_watch *w, *nx; /* (w may be freed: out of memory for its clean-up job) */
    list_each_safe(w, nx, &h->streams, hlink) {
      if (w->call && !w->closing) h->ops->finish(w, RPC_INTERNAL, "watch directory: inotify read failed");
    }
    return;
  }
  static char buf[WD_READ_BUF] __attribute__((aligned(__alignof__(struct inotify_event))));
  /* one read fits in half of every stream's queue */
  size_t rdsize = WD_READ_BUF;
  fs_watch *w, *nx;
  list_each(w, &h->streams, hlink) {
    size_t r = h->ops->read_size(w);
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
  list_each_safe(w, nx, &h->streams, hlink) { /* (w may be freed, as above) */
    if (w->call && !w->closing) h->ops->pump(w);
  }
}

void wd_hub_pause(fs_watch *w) {
  if (w->read_paused) return;
  w->read_paused = 1;
  w->hub->npaused++;
}

void wd_hub_unpause(fs_watch *w) {
  if (!w->read_paused) return;
  w->read_paused = 0;
  wd_hub *h = w->hub;
  if (--h->npaused == 0 && !h->polling) {
    h->polling = 1;
    uv_poll_start(&h->poll, UV_READABLE, hub_on_poll);
  }
}

static wd_hub *hub_cur; /* the hub new streams join (loop) */

wd_hub *wd_hub_join(fs_watch *w, const wd_hub_ops *ops) {
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
    h->ops = ops;
    h->poll.data = h;
    h->polling = 1;
    uv_poll_start(&h->poll, UV_READABLE, hub_on_poll);
    hub_cur = h;
  }
  h->refs++;
  w->hub = h;
  list_insert_head(&h->streams, &w->hlink);
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

void wd_hub_leave(fs_watch *w) {
  wd_hub *h = w->hub;
  if (!h) return;
  wd_hub_unpause(w);
  list_remove(&w->hlink);
  w->hub = NULL;
  if (--h->refs) return;
  if (hub_cur == h) hub_cur = NULL;
  if (h->polling) uv_poll_stop(&h->poll);
  h->polling = 0;
  uv_close((uv_handle_t *)&h->poll, hub_on_poll_closed);
}
