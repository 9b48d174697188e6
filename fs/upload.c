/* fs/upload — PostFileStream (api.md §7): one file per client stream.
 *
 * Per chunk: content > 1 MiB → resource_exhausted.  First chunk: validate
 * filepath, then (pool) open the temp file (fs/atomic.h: whole or not
 * at all).  Later chunks: empty or identical filepath, else "filepath
 * changed during stream upload"; empty content is skipped.  End of input:
 * (pool) the commit.  Response {uploadedCount:1, entries:[{name, path,
 * type:"file"}]}.  On any error or cancel the temp file is removed (in the
 * pool), the target is untouched and no message is sent.
 *
 * Pipelining with bounded memory: chunks wait in a queue while the previous
 * batch is written in the pool (network and disk overlap): a chunk that is
 * essentially its content (UP_TAKE_MIN bytes or more, at most UP_TAKE_SLACK
 * of path and other fields) as the decoded message itself, taken from the
 * layer (no copy), any other as a copy of its content — so what is held is
 * within UP_TAKE_SLACK / UP_TAKE_MIN of the content counted.  The call's
 * input is paused while UP_QUEUE_HIGH bytes wait, so at most about
 * 2 x (UP_QUEUE_HIGH + 1 MiB) is held per upload.  A layer that kept
 * delivering past the pause would be stopped at UP_QUEUE_MAX.
 * UP_QUEUE_HIGH is one chunk: an upload's working set then stays under
 * main.c's 4 MiB trim threshold, so the heap top is not trimmed and
 * faulted back in chunk after chunk (docs/internals/profile.md).
 * A target that is an existing directory fails at the first chunk with
 * invalid_argument "path is a directory: <p>".
 */
#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "fs/atomic.h"
#include "fs/handlers.h"
#include "fs/path.h"
#include "proto/agent.pb-c.h"

#define UP_QUEUE_HIGH (1u * 1024 * 1024)
#define UP_QUEUE_MAX (8u * 1024 * 1024)
#define UP_TAKE_MIN (64u * 1024) /* content from which a chunk is kept as its message */
#define UP_TAKE_SLACK (4u * 1024 + 64) /* the rest of such a message: a path, the tags */

/* A chunk's bytes: in the FileChunk message itself, taken from the layer
 * (no copy), or copied behind the struct when it could not be taken. */
typedef struct up_chunk {
  struct up_chunk *next;
  ProtobufCMessage *msg; /* owned, or NULL: the bytes are in copy[] */
  const unsigned char *data;
  size_t len;
  unsigned char copy[];
} up_chunk;

typedef enum up_op { UP_OPEN, UP_WRITE, UP_COMMIT, UP_CLEANUP } up_op;

typedef struct fs_upload {
  rpc_call *call; /* NULL once the call ended (finished or canceled) */
  rpc_call *held; /* canceled with the answer held until the temp file is gone */
  char *target;
  fs_atomic at; /* the temp file, from the first chunk on */
  int started, input_end;
  int busy;    /* pool work queued/running */
  int sending; /* inside rpc_send */
  int failing; /* an error is recorded in st; ending the call */
  atomic_int canceled; /* set by on_cancel; pool ops stop early */
  up_op op;
  up_chunk *batch; /* chunks written by the running op */
  up_chunk *q_head, *q_tail;
  size_t q_bytes;
  uint64_t bytes;
  fs_status st;   /* result of the last pool op (pool writes, loop reads after) */
  fs_status fail; /* the error the call ends with (loop only) */
  rpc_work *work; /* the pool job while busy */
} fs_upload;

static void up_chunks_free(up_chunk *k) {
  for (up_chunk *n; k; k = n) {
    n = k->next;
    if (k->msg) protobuf_c_message_free_unpacked(k->msg, NULL);
    free(k);
  }
}

static void up_free(fs_upload *u) {
  if (u->held) rpc_end_deferred(u->held); /* the cleanup is done: answer now */
  up_chunks_free(u->batch);
  up_chunks_free(u->q_head);
  free(u->target);
  fs_status_clear(&u->st);
  fs_status_clear(&u->fail);
  free(u);
}

/* ---- pool side ---------------------------------------------------- */

static int up_write_batch(fs_upload *u) {
  for (const up_chunk *k = u->batch; k; k = k->next) {
    if (fs_atomic_write(&u->at, k->data, k->len, &u->st) < 0) return -1;
    u->bytes += k->len;
  }
  return 0;
}

static void up_work(void *data) {
  fs_upload *u = data;
  switch (u->op) {
    case UP_OPEN:
      if (fs_atomic_open(&u->at, &u->st) == 0) up_write_batch(u);
      break;
    case UP_WRITE:
      if (atomic_load(&u->canceled)) {
        fs_status_set(&u->st, RPC_CANCELED, "upload canceled");
        fs_atomic_abort(&u->at);
      } else {
        up_write_batch(u);
      }
      break;
    case UP_COMMIT:
      fs_atomic_commit(&u->at, &u->st);
      break;
    case UP_CLEANUP:
      fs_atomic_abort(&u->at);
      break;
  }
}

/* ---- loop side ---------------------------------------------------- */

static void up_after(void *data, int canceled);

/* One pool op; 0, or -1 when it cannot be queued.  The call it serves is
 * NULL for the clean-up after the call ended. */
static int up_queue(fs_upload *u, up_op op) {
  u->op = op;
  u->busy = 1;
  u->work = rpc_work_submit(u->call, up_work, up_after, u);
  if (!u->work) u->busy = 0;
  return u->work ? 0 : -1;
}

/* The call is gone: remove the temp file (in the pool) and free. */
static void up_dispose(fs_upload *u) {
  if (u->busy) return; /* up_after comes back here */
  if (fs_atomic_has_temp(&u->at)) {
    if (up_queue(u, UP_CLEANUP) == 0) return;
    fs_atomic_abort(&u->at); /* cannot queue: do it here */
  }
  up_free(u);
}

/* Error path: remove the temp file (pool) first, then end the call with
 * the recorded status, so a client that sees the error finds nothing left. */
static void up_fail_continue(fs_upload *u) {
  if (!u->call) {
    up_dispose(u);
    return;
  }
  if (u->busy) return; /* up_after comes back here */
  rpc_pause_input(u->call, 1);
  if (fs_atomic_has_temp(&u->at)) {
    if (up_queue(u, UP_CLEANUP) == 0) return;
    fs_atomic_abort(&u->at); /* cannot queue: do it here */
  }
  rpc_call *c = u->call;
  u->call = NULL;
  rpc_set_user(c, NULL);
  LOG_INFO("upload failed path=%s code=%s msg=%s", u->target ? u->target : "-",
           rpc_code_name(u->fail.code), u->fail.msg ? u->fail.msg : "");
  rpc_finish(c, u->fail.code, u->fail.msg);
  up_free(u);
}

/* Record the error (the first one wins) and end the call. */
static void up_fail(fs_upload *u, rpc_code code, const char *msg) {
  if (!u->failing) {
    u->failing = 1;
    atomic_store(&u->canceled, 1); /* a running pool op stops early */
    fs_status_set(&u->fail, code, "%s", msg ? msg : "");
  }
  up_fail_continue(u);
}

static void up_succeed(fs_upload *u) {
  rpc_call *c = u->call;
  Pb__WriteInfo wi = PB__WRITE_INFO__INIT;
  wi.name = (char *)fs_path_base(u->target);
  wi.path = u->target;
  wi.type = "file";
  Pb__WriteInfo *wip = &wi;
  Pb__PostFilesResponse resp = PB__POST_FILES_RESPONSE__INIT;
  resp.uploaded_count = 1;
  resp.n_entries = 1;
  resp.entries = &wip;
  LOG_INFO("upload done path=%s bytes=%llu", u->target, (unsigned long long)u->bytes);
  u->sending = 1; /* an on_cancel from inside rpc_send only marks */
  int r = rpc_send(c, &resp.base);
  u->sending = 0;
  if (u->call) {
    rpc_set_user(c, NULL);
    if (r == 0)
      rpc_finish(c, RPC_OK, NULL);
    else
      rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
  up_free(u);
}

/* Hand the waiting chunks to the pool as one batch; commit once the input
 * ended and nothing waits; pause input while UP_QUEUE_HIGH bytes wait. */
static void up_kick(fs_upload *u) {
  if (!u->call || u->failing) return;
  if (!u->busy) {
    int r = 0;
    if (u->q_head) {
      u->batch = u->q_head;
      u->q_head = u->q_tail = NULL;
      u->q_bytes = 0;
      r = up_queue(u, UP_WRITE);
    } else if (u->input_end) {
      r = up_queue(u, UP_COMMIT);
    }
    if (r != 0) {
      up_fail(u, RPC_INTERNAL, "queue file write failed");
      return;
    }
  }
  rpc_pause_input(u->call, u->q_bytes >= UP_QUEUE_HIGH);
}

static void up_after(void *data, int canceled) {
  fs_upload *u = data;
  up_op op = u->op;
  u->busy = 0;
  u->work = NULL;
  up_chunks_free(u->batch);
  u->batch = NULL;
  if (!u->call) { /* ended meanwhile: clean up */
    up_dispose(u);
    return;
  }
  if (u->failing) {
    up_fail_continue(u);
    return;
  }
  if (canceled) { /* never ran: no thread could take it */
    up_fail(u, RPC_INTERNAL, "file upload was canceled");
    return;
  }
  if (u->st.code != RPC_OK) { /* the work body already removed the temp file */
    u->failing = 1;
    u->fail = u->st;
    u->st.code = RPC_OK;
    u->st.msg = NULL;
    up_fail_continue(u);
    return;
  }
  if (op == UP_COMMIT) {
    up_succeed(u);
    return;
  }
  up_kick(u);
}

/* Whether the chunk is kept as its message: big, and nothing much else in
 * it (a 1-byte chunk padded with a long path or unknown fields is copied,
 * so the queue's count of content bytes stays what it holds). */
static int up_takes(const Pb__FileChunk *ch) {
  return ch->content.len >= UP_TAKE_MIN &&
         protobuf_c_message_get_packed_size(&ch->base) <= ch->content.len + UP_TAKE_SLACK;
}

/* The chunk's content as a queue entry: the message taken from the layer
 * when up_takes and it can be (its bytes are then written from where they
 * were decoded), else a copy.  NULL when out of memory. */
static up_chunk *up_chunk_of(rpc_call *c, const Pb__FileChunk *ch) {
  ProtobufCMessage *m = up_takes(ch) ? rpc_take_request(c) : NULL;
  up_chunk *k = malloc(sizeof *k + (m ? 0 : ch->content.len));
  if (!k) {
    if (m) protobuf_c_message_free_unpacked(m, NULL);
    return NULL;
  }
  k->next = NULL;
  k->msg = m;
  k->len = ch->content.len;
  k->data = m ? ch->content.data : k->copy;
  if (!m && k->len) memcpy(k->copy, ch->content.data, k->len);
  return k;
}

void fs_upload_on_request(rpc_call *c, const ProtobufCMessage *req) {
  fs_upload *u = calloc(1, sizeof *u);
  if (!u) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  u->call = c;
  atomic_init(&u->canceled, 0);
  fs_atomic_init(&u->at, NULL, &u->canceled);
  rpc_set_user(c, u);
}

void fs_upload_on_message(rpc_call *c, const ProtobufCMessage *msg) {
  fs_upload *u = rpc_user(c);
  if (!u || !u->call || u->failing) return;
  const Pb__FileChunk *ch = (const Pb__FileChunk *)msg;
  const char *fp = ch->filepath ? ch->filepath : "";
  char err[160];
  if (ch->content.len > FS_CHUNK_MAX) {
    up_fail(u, RPC_RESOURCE_EXHAUSTED, "file chunk exceeds maximum size 1048576 bytes");
    return;
  }
  if (!u->started) {
    if (fs_check_call_path(c, fp, "stream upload", err, sizeof err) < 0) {
      up_fail(u, RPC_INVALID_ARGUMENT, err);
      return;
    }
    u->started = 1;
    if (!(u->target = strdup(fp)) || !(u->at.target = u->target) ||
        (ch->content.len && !(u->batch = up_chunk_of(c, ch)))) {
      up_fail(u, RPC_RESOURCE_EXHAUSTED, "out of memory");
      return;
    }
    /* open (and write the first content) while later chunks queue up */
    if (up_queue(u, UP_OPEN) != 0) up_fail(u, RPC_INTERNAL, "queue file upload failed");
    return;
  }
  if (rpc_input_had_nul(c) || (fp[0] && strcmp(fp, u->target) != 0)) {
    up_fail(u, RPC_INVALID_ARGUMENT, "filepath changed during stream upload");
    return;
  }
  if (ch->content.len == 0) return;
  if (u->q_bytes + ch->content.len > UP_QUEUE_MAX) {
    up_fail(u, RPC_RESOURCE_EXHAUSTED, "upload queue full");
    return;
  }
  up_chunk *k = up_chunk_of(c, ch);
  if (!k) {
    up_fail(u, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  if (u->q_tail)
    u->q_tail->next = k;
  else
    u->q_head = k;
  u->q_tail = k;
  u->q_bytes += k->len;
  up_kick(u);
}

void fs_upload_on_input_end(rpc_call *c) {
  fs_upload *u = rpc_user(c);
  if (!u || !u->call || u->failing) return;
  if (!u->started) {
    up_fail(u, RPC_INVALID_ARGUMENT, "no file chunks provided");
    return;
  }
  u->input_end = 1;
  up_kick(u);
}

void fs_upload_on_cancel(rpc_call *c, rpc_code why) {
  fs_upload *u = rpc_user(c);
  if (!u) return;
  LOG_INFO("upload canceled path=%s why=%s", u->target ? u->target : "-", rpc_code_name(why));
  u->call = NULL;
  atomic_store(&u->canceled, 1);
  if (u->sending) return; /* up_succeed frees */
  /* an error the layer raised (a broken envelope, the deadline) is only
   * answered once the temp file is gone, as for the service's own errors */
  if (u->busy || fs_atomic_has_temp(&u->at)) {
    rpc_defer_end(c);
    u->held = c;
  }
  if (u->busy) rpc_work_cancel(u->work); /* up_after then disposes, canceled or not */
  up_dispose(u);
}
