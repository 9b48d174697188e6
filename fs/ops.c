/* fs/ops — Stat, MakeDir, Move, Remove (api.md §9 "The rest of the file
 * surface"): validate on the loop, one thread-pool job each, answer on the
 * loop.  See fs/tree.h for the recursive parts (remove, cross-fs copy).
 *
 * Texts: missing → not_found "path not found: <p>"; MakeDir on an existing
 * directory → already_exists "directory already exists: <p>", on anything
 * else → already_exists "path exists and is not a directory: <p>"; "/" as a
 * Move end → invalid_argument "refusing to move /" (source) or "refusing to
 * move onto /" (destination); Remove "/" → invalid_argument "refusing to
 * remove /".  OS errors as §7: "<context> <path>: <errno text>".
 *
 * Lifetime: the op is the call's user pointer; on_cancel sets the cancel
 * flag (the walk stops), forgets the call and takes the job back if no
 * thread has started it (rpc_work_cancel); the done callback frees.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs/handlers.h"
#include "fs/path.h"
#include "fs/tree.h"
#include "proto/agent.pb-c.h"

enum { OP_STAT, OP_MKDIR, OP_MOVE, OP_REMOVE };

typedef struct fs_op {
  rpc_work *work; /* the pool job, until op_done runs */
  rpc_call *call; /* NULL once canceled */
  int kind;
  char *path; /* Stat/MakeDir/Remove path, Move source */
  char *dst;  /* Move destination */
  atomic_int cancel;
  fs_status st;
  int has_entry;
  fs_entry e; /* e.path: the answered path (op->path or op->dst) */
} fs_op;

static void op_free(fs_op *o) {
  free(o->path);
  free(o->dst);
  fs_status_clear(&o->st);
  free(o);
}

/* The entry for path as Stat reports it: stat, and for a link that leads
 * nowhere its own lstat.  0, or -1 with st set. */
static int op_entry(fs_op *o, const char *path) {
  struct stat sb;
  if (stat(path, &sb) != 0 && lstat(path, &sb) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&o->st, RPC_NOT_FOUND, "path not found: %s", path);
    else
      fs_status_os(&o->st, "stat path", path, e);
    return -1;
  }
  memset(&o->e, 0, sizeof o->e);
  fs_entry_fill(&o->e, &sb);
  o->e.path = (char *)path;
  o->e.name = fs_path_base(path);
  o->has_entry = 1;
  return 0;
}

static void op_mkdir(fs_op *o) {
  const char *p = o->path;
  if (mkdir(p, 0755) != 0) {
    int e = errno;
    if (e == ENOENT) { /* parents first (mkdir -p), then the directory itself */
      if (fs_tree_mkdir_p(p, fs_path_dir_len(p), NULL, &o->st) != 0) return;
      e = mkdir(p, 0755) == 0 ? 0 : errno;
    }
    if (e == EEXIST) {
      struct stat sb;
      if (stat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
        fs_status_set(&o->st, RPC_ALREADY_EXISTS, "directory already exists: %s", p);
      else
        fs_status_set(&o->st, RPC_ALREADY_EXISTS, "path exists and is not a directory: %s", p);
      return;
    }
    if (e) {
      fs_status_os(&o->st, "make directory", p, e);
      return;
    }
  }
  op_entry(o, p);
}

/* 0 when o->path exists (not following a final symlink), else the status. */
static int op_exists(fs_op *o) {
  struct stat sb;
  if (lstat(o->path, &sb) == 0) return 0;
  int e = errno;
  if (e == ENOENT || e == ENOTDIR)
    fs_status_set(&o->st, RPC_NOT_FOUND, "path not found: %s", o->path);
  else
    fs_status_os(&o->st, "stat path", o->path, e);
  return -1;
}

static void op_move(fs_op *o) {
  if (op_exists(o) != 0) return;
  size_t dl = fs_path_dir_len(o->dst), made = 0;
  if (dl > 1 && fs_tree_mkdir_p(o->dst, dl, &made, &o->st) != 0) return;
  if (rename(o->path, o->dst) != 0) {
    int e = errno;
    if (e != EXDEV) {
      fs_tree_status_move(&o->st, o->path, o->dst, e);
      fs_tree_unmake(o->dst, dl, made); /* a failed Move leaves nothing */
      return;
    }
    /* another filesystem: copy beside the destination, rename it into
     * place (atomic), then remove the source */
    if (fs_tree_move_xdev(o->path, o->dst, &o->cancel, &o->st) != 0) {
      /* (a copy already in place keeps its parents: rmdir fails there) */
      fs_tree_unmake(o->dst, dl, made);
      return;
    }
  }
  op_entry(o, o->dst);
}

static void op_remove(fs_op *o) {
  if (op_exists(o) != 0) return;
  fs_tree_remove(o->path, &o->cancel, &o->st);
}

static void op_work(void *data) {
  fs_op *o = data;
  switch (o->kind) {
    case OP_STAT: op_entry(o, o->path); break;
    case OP_MKDIR: op_mkdir(o); break;
    case OP_MOVE: op_move(o); break;
    case OP_REMOVE: op_remove(o); break;
  }
}

static void op_done(void *data, int canceled) {
  fs_op *o = data;
  o->work = NULL;
  rpc_call *c = o->call;
  if (!c) { /* canceled meanwhile */
    op_free(o);
    return;
  }
  rpc_set_user(c, NULL);
  if (canceled) { /* never ran: no thread could take it */
    rpc_finish(c, RPC_INTERNAL, "file operation was canceled");
    op_free(o);
    return;
  }
  if (o->st.code != RPC_OK) {
    fs_finish_status(c, &o->st);
    op_free(o);
    return;
  }
  Pb__FileEntry fe = PB__FILE_ENTRY__INIT;
  if (o->has_entry) {
    fe.name = (char *)o->e.name;
    fe.path = o->e.path;
    fe.type = o->e.is_dir ? "directory" : "file";
    fe.size = o->e.size;
    fe.permissions = o->e.perms;
    fe.modified_time = o->e.mtime;
    fe.is_directory = o->e.is_dir ? 1 : 0;
  }
  int r;
  switch (o->kind) {
    case OP_STAT: {
      Pb__StatResponse m = PB__STAT_RESPONSE__INIT;
      m.entry = &fe;
      r = rpc_send(c, &m.base);
      break;
    }
    case OP_MKDIR: {
      Pb__MakeDirResponse m = PB__MAKE_DIR_RESPONSE__INIT;
      m.entry = &fe;
      r = rpc_send(c, &m.base);
      break;
    }
    case OP_MOVE: {
      Pb__MoveResponse m = PB__MOVE_RESPONSE__INIT;
      m.entry = &fe;
      r = rpc_send(c, &m.base);
      break;
    }
    default: {
      Pb__RemoveResponse m = PB__REMOVE_RESPONSE__INIT;
      r = rpc_send(c, &m.base);
      break;
    }
  }
  if (o->call) { /* rpc_send never calls back, but be safe */
    if (r == 0)
      rpc_finish(c, RPC_OK, NULL);
    else
      rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
  }
  op_free(o);
}

static void op_start(rpc_call *c, int kind, const char *path, const char *dst) {
  fs_op *o = calloc(1, sizeof *o);
  if (o) {
    o->path = strdup(path);
    o->dst = dst ? strdup(dst) : NULL;
  }
  if (!o || !o->path || (dst && !o->dst)) {
    if (o) op_free(o);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  o->kind = kind;
  o->call = c;
  atomic_init(&o->cancel, 0);
  rpc_set_user(c, o);
  if (!(o->work = rpc_work_submit(c, op_work, op_done, o))) {
    rpc_set_user(c, NULL);
    op_free(o);
    rpc_finish(c, RPC_INTERNAL, "queue file operation failed");
  }
}

/* One path field, validated with op's verb; 0 or -1 (call finished). */
static int op_check(rpc_call *c, const char *p, const char *verb) {
  char err[160];
  if (fs_check_call_path(c, p, verb, err, sizeof err) < 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return -1;
  }
  return 0;
}

void fs_stat_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__StatRequest *req = (const Pb__StatRequest *)msg;
  if (op_check(c, req->path, "stat") == 0) op_start(c, OP_STAT, req->path, NULL);
}

void fs_mkdir_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__MakeDirRequest *req = (const Pb__MakeDirRequest *)msg;
  if (op_check(c, req->path, "make directory") != 0) return;
  if (strcmp(req->path, "/") == 0) {
    rpc_finish(c, RPC_ALREADY_EXISTS, "directory already exists: /");
    return;
  }
  op_start(c, OP_MKDIR, req->path, NULL);
}

void fs_move_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__MoveRequest *req = (const Pb__MoveRequest *)msg;
  /* a NUL anywhere in the request is blamed on the first path checked */
  if (op_check(c, req->source, "move") != 0) return;
  if (op_check(c, req->destination, "move") != 0) return;
  if (strcmp(req->source, "/") == 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "refusing to move /");
    return;
  }
  if (strcmp(req->destination, "/") == 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "refusing to move onto /");
    return;
  }
  op_start(c, OP_MOVE, req->source, req->destination);
}

void fs_remove_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__RemoveRequest *req = (const Pb__RemoveRequest *)msg;
  if (op_check(c, req->path, "remove") != 0) return;
  if (strcmp(req->path, "/") == 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "refusing to remove /");
    return;
  }
  op_start(c, OP_REMOVE, req->path, NULL);
}

void fs_op_on_cancel(rpc_call *c, rpc_code why) {
  fs_op *o = rpc_user(c);
  if (!o) return;
  o->call = NULL;
  atomic_store(&o->cancel, 1);
  rpc_work_cancel(o->work); /* op_done frees, canceled or not */
}
