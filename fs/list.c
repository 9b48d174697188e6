/* fs/list — ListFiles (api.md §7): validate, then walk in the thread pool
 * (fs/listing.c, fs/walk.c). */
#include <stdlib.h>
#include <string.h>

#include "fs/handlers.h"
#include "proto/agent.pb-c.h"

void fs_list_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__ListFilesRequest *req = (const Pb__ListFilesRequest *)msg;
  const char *path = req->path ? req->path : "";
  char err[160];
  if (!path[0] && !rpc_input_had_nul(c)) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "path is required");
    return;
  }
  if (fs_check_call_path(c, path, "list files", err, sizeof err) < 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  fs_listing *l = fs_listing_new(c, &pb__list_files_response__descriptor);
  size_t pl = strlen(path);
  char *root = l ? malloc(pl + 1) : NULL;
  if (!root) {
    fs_listing_discard(l);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  memcpy(root, path, pl + 1);
  fs_listing_own(l, root, free);
  fs_walk *w = fs_listing_walk(l);
  w->root = root;
  w->max_depth = req->depth <= 0 ? 1 : req->depth;
  fs_listing_start(l);
}
