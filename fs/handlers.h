/* fs/handlers — internal to fs/: the FileService RPC callbacks (one file
 * each: upload.c, download.c, list.c, search.c) and the helpers they share
 * (service.c, listing.c).  The public face is fs/service.h.
 */
#ifndef CONCH_FS_HANDLERS_H
#define CONCH_FS_HANDLERS_H

#include <stddef.h>
#include <uv.h>

#include "server/rpc.h"
#include "fs/walk.h"

/* The loop the service runs on (fs_service_methods). */
extern uv_loop_t *fs_loop;

/* Largest accepted FileChunk content, and the GetFileStream chunk size. */
#define FS_CHUNK_MAX (1024u * 1024u)
/* Most entries a ListFiles/SearchFiles walk examines (fs/walk.h). */
#define FS_WALK_MAX_VISITS 1000000u

/* PostFileStream */
void fs_upload_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_upload_on_message(rpc_call *c, const ProtobufCMessage *msg);
void fs_upload_on_input_end(rpc_call *c);
void fs_upload_on_cancel(rpc_call *c, rpc_code why);
/* GetFileStream */
void fs_download_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_download_on_cancel(rpc_call *c, rpc_code why);
/* ListFiles */
void fs_list_on_request(rpc_call *c, const ProtobufCMessage *req);
/* SearchFiles */
void fs_search_on_request(rpc_call *c, const ProtobufCMessage *req);
/* Stat, MakeDir, Move, Remove (ops.c) */
void fs_stat_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_mkdir_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_move_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_remove_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_op_on_cancel(rpc_call *c, rpc_code why);
/* WatchDir (watch.c) */
void fs_watch_on_request(rpc_call *c, const ProtobufCMessage *req);
void fs_watch_on_cancel(rpc_call *c, rpc_code why);
/* ListFiles and SearchFiles */
void fs_listing_on_cancel(rpc_call *c, rpc_code why);

/* 1 when fd is on a kernel pseudo filesystem (proc, sysfs, …), whose
 * sizes promise nothing (download.c). */
int fs_pseudo_fs(int fd);

/* Validate a request path (api.md §7) taking rpc_input_had_nul() into
 * account: a NUL anywhere in the just-delivered message is reported as a
 * NUL in the path (the only string field of its message, except for
 * SearchFiles, see search.c).  0 ok; -1 with the text in err. */
int fs_check_call_path(rpc_call *c, const char *p, const char *op, char *err, size_t errlen);


/* Finish a call with an fs_status (message NULL when out of memory). */
void fs_finish_status(rpc_call *c, const fs_status *st);

/* ListFiles/SearchFiles: run `w` (root/depth/filter set, root and filter
 * state owned by `owned`, freed with free_owned) in the thread pool and
 * answer with a response of type `resp` (ListFilesResponse or
 * SearchFilesResponse: repeated FileEntry entries = 1).  Finishes the call
 * itself on any failure. */
typedef struct fs_listing fs_listing;
fs_listing *fs_listing_new(rpc_call *c, const ProtobufCMessageDescriptor *resp);
fs_walk *fs_listing_walk(fs_listing *l);
void fs_listing_own(fs_listing *l, void *owned, void (*free_owned)(void *));
void fs_listing_start(fs_listing *l);
/* Give back a listing that was never started (out of memory on the way). */
void fs_listing_discard(fs_listing *l);

#endif
