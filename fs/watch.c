/* fs/watch — WatchDir (api.md §9): a server stream of inotify events; the
 * RPC itself.  The hub (watch_hub.c), a stream's queue (watch_queue.c), its
 * pool jobs (watch_job.c) and its tree of watched directories
 * (watch_tree.c) are below it; fs/watch_int.h says how they stack.
 *
 * A request is validated here, joins the hub and runs its setup job; then
 * `start` is sent and the queue's items go to one item job at a time, in
 * order, and are sent as the jobs make them ready.
 *
 * Mapping: IN_CREATE → CREATE, IN_MODIFY → WRITE (consecutive writes to
 * one entry not yet handed to a job are coalesced), IN_ATTRIB → CHMOD,
 * IN_DELETE → REMOVE, IN_MOVED_FROM → RENAME without entry, IN_MOVED_TO →
 * RENAME with entry.  The root itself: deleted → REMOVE "." then the stream
 * ends OK; renamed → RENAME "." then the stream ends OK (its path no longer
 * names it); unmounted → ends OK.  An entry gone before its stat is sent
 * without entry.
 *
 * Sending stops once the call holds WD_OUTQ_MAX unsent bytes (or the
 * daemon-wide budget is past its half) and the transport has no room
 * (rpc_out_room), and resumes when it has, so a client that does not read
 * costs at most the queue plus WD_OUTQ_MAX and an event per stream.
 * `keepalive` after keepalive_ms (CONCH_FS_WATCH_KEEPALIVE_MS, default
 * 30000, 0 = never) with nothing sent and nothing queued.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "core/log.h"
#include "fs/handlers.h"
#include "fs/watch_int.h"
#include "proto/agent.pb-c.h"

static void watch_pump(fs_watch *w);
static void watch_send(fs_watch *w);

/* Free w and its queue (its watches and tree already dropped) and leave the hub. */
static void watch_free(fs_watch *w) {
  for (wd_item *it = w->head, *n; it; it = n) {
    n = it->next;
    wd_item_free(it);
  }
  for (size_t i = 0; i < w->nseen; i++) free(w->seen[i].rel);
  wd_hub_leave(w);
  free(w->root);
  fs_status_clear(&w->st);
  free(w);
}

/* A pool job for w (one at a time, w->busy); out of memory: done(w, 1) at once. */
static void watch_submit(fs_watch *w, void (*run)(void *), void (*done)(void *, int)) {
  if (!rpc_work_submit(w->call, run, done, w)) done(w, 1);
}

/* After watch_close_work: nothing of w is left in flight. */
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
  if (w->hub) wd_hub_unpause(w);
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
    if ((rpc_outq_bytes(w->call) > WD_OUTQ_MAX || budget_over()) &&
        !rpc_out_room(w->call, WD_OUTQ_MAX, watch_on_drain)) {
      w->drain_armed = 1;
      wd_hub_unpause(w); /* the client is behind: never hold the hub for it */
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
    wd_item_free(it);
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

/* The hub's calls up into the streams. */
static const wd_hub_ops watch_hub_ops = {
    .read_size = watch_read_size,
    .push = watch_push,
    .pump = watch_pump,
    .finish = watch_finish,
};

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
  if (!wd_hub_join(w, &watch_hub_ops)) {
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
