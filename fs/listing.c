/* fs/listing — run a ListFiles/SearchFiles walk in the thread pool and
 * answer the unary call; see handlers.h.  The answer is encoded in the
 * pool thread too (rpc_encode), so the loop only hands the bytes over.
 *
 * Lifetime: the job is the call's user pointer.  on_cancel marks it
 * (call = NULL, cancel flag for the walk, rpc_work_cancel when not started
 * yet); the after-work callback then only frees.  rpc_send_bytes failing
 * while the call is still ours means the encoded response is too large
 * (JSON is bigger than the protobuf size the walk bounds):
 * resource_exhausted.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "fs/handlers.h"
#include "proto/agent.pb-c.h"

struct fs_listing {
  rpc_work *job;  /* while queued or running */
  rpc_call *call; /* NULL once the call ended from outside */
  int busy;       /* work queued or running */
  atomic_int cancel;
  const ProtobufCMessageDescriptor *resp;
  fs_walk w;
  uint8_t *enc;   /* the encoded answer (pool thread; rpc_encode), NULL when out of memory */
  size_t enc_len;
  void *owned;
  void (*free_owned)(void *);
};

static void listing_free(fs_listing *l) {
  free(l->enc);
  fs_walk_free(&l->w);
  if (l->free_owned) l->free_owned(l->owned);
  free(l);
}

fs_listing *fs_listing_new(rpc_call *c, const ProtobufCMessageDescriptor *resp) {
  fs_listing *l = calloc(1, sizeof *l);
  if (!l) return NULL;
  l->call = c;
  l->resp = resp;
  atomic_init(&l->cancel, 0);
  l->w.cancel = &l->cancel;
  l->w.json = rpc_is_json(c);
  l->w.max_bytes = RPC_MAX_MESSAGE;
  l->w.max_visits = FS_WALK_MAX_VISITS;
  return l;
}

fs_walk *fs_listing_walk(fs_listing *l) { return &l->w; }

void fs_listing_own(fs_listing *l, void *owned, void (*free_owned)(void *)) {
  l->owned = owned;
  l->free_owned = free_owned;
}

/* Encode the entries as a ListFilesResponse / SearchFilesResponse (both
 * are `repeated FileEntry entries = 1`) into l->enc; pool thread.  Leaves
 * enc NULL when out of memory. */
static void listing_encode(fs_listing *l) {
  fs_walk *w = &l->w;
  Pb__FileEntry ev_small[FS_WALK_INLINE], *ep_small[FS_WALK_INLINE];
  int small = w->n <= FS_WALK_INLINE;
  Pb__FileEntry *ev = small ? ev_small : calloc(w->n, sizeof *ev);
  Pb__FileEntry **ep = small ? ep_small : calloc(w->n, sizeof *ep);
  if (!ev || !ep) { /* out of memory: no answer */
    l->enc = NULL;
  } else {
    for (size_t i = 0; i < w->n; i++) {
      const fs_entry *e = &w->entries[i];
      pb__file_entry__init(&ev[i]);
      ev[i].name = (char *)e->name;
      ev[i].path = e->path;
      ev[i].type = e->is_dir ? "directory" : "file";
      ev[i].size = e->size;
      ev[i].permissions = (char *)e->perms;
      ev[i].modified_time = (char *)e->mtime;
      ev[i].is_directory = e->is_dir ? 1 : 0;
      ep[i] = &ev[i];
    }
    if (l->resp == &pb__search_files_response__descriptor) {
      Pb__SearchFilesResponse m = PB__SEARCH_FILES_RESPONSE__INIT;
      m.n_entries = w->n;
      m.entries = ep;
      l->enc = rpc_encode(w->json, &m.base, &l->enc_len);
    } else {
      Pb__ListFilesResponse m = PB__LIST_FILES_RESPONSE__INIT;
      m.n_entries = w->n;
      m.entries = ep;
      l->enc = rpc_encode(w->json, &m.base, &l->enc_len);
    }
  }
  if (!small) {
    free(ev);
    free(ep);
  }
}

static void listing_work(void *data) {
  fs_listing *l = data;
  fs_walk_run(&l->w);
  if (l->w.st.code == RPC_OK) listing_encode(l);
}

static void listing_after(void *data, int canceled) {
  fs_listing *l = data;
  l->job = NULL;
  if (!l->call) { /* canceled meanwhile */
    listing_free(l);
    return;
  }
  rpc_call *c = l->call;
  if (canceled || l->w.st.code != RPC_OK) {
    l->busy = 0;
    rpc_set_user(c, NULL);
    if (canceled)
      rpc_finish(c, RPC_INTERNAL, "file listing was canceled");
    else
      fs_finish_status(c, &l->w.st);
    listing_free(l);
    return;
  }
  LOG_DEBUG("file listing done root=%s entries=%zu", l->w.root, l->w.n);
  /* busy stays set while sending: an on_cancel run from inside the send
   * then only marks the job. */
  int r = l->enc ? rpc_send_bytes(c, l->enc, l->enc + RPC_HEADROOM, l->enc_len) : -2;
  l->enc = NULL; /* taken */
  l->busy = 0;
  if (!l->call) { /* on_cancel ran inside rpc_send */
    listing_free(l);
    return;
  }
  rpc_set_user(c, NULL);
  if (r == 0)
    rpc_finish(c, RPC_OK, NULL);
  else if (r == -2)
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
  else /* the encoded response is over the cap (JSON is larger than the
        * protobuf size the walk bounds) or memory ran out */
    rpc_finishf(c, RPC_RESOURCE_EXHAUSTED, "file list exceeds maximum message size %u bytes",
                RPC_MAX_MESSAGE);
  listing_free(l);
}

void fs_listing_discard(fs_listing *l) {
  if (l) listing_free(l);
}

void fs_listing_start(fs_listing *l) {
  l->busy = 1;
  rpc_set_user(l->call, l);
  l->job = rpc_work_submit(l->call, listing_work, listing_after, l);
  if (!l->job) {
    l->busy = 0;
    rpc_set_user(l->call, NULL);
    rpc_finish(l->call, RPC_RESOURCE_EXHAUSTED, "out of memory");
    listing_free(l);
  }
}

void fs_listing_on_cancel(rpc_call *c, rpc_code why) {
  fs_listing *l = rpc_user(c);
  if (!l) return;
  l->call = NULL;
  atomic_store(&l->cancel, 1);
  if (l->busy) {
    if (l->job) rpc_work_cancel(l->job); /* fails harmlessly once running */
    return;                        /* the after-work callback frees */
  }
  listing_free(l);
}
