/* fs/service — FileService method table and shared call helpers; see
 * service.h and handlers.h. */
#include "fs/service.h"

#include <stdio.h>
#include <string.h>

#include "fs/handlers.h"
#include "fs/path.h"
#include "proto/agent.pb-c.h"

static const rpc_method fs_methods[] = {
    {
        .path = "/pb.FileService/PostFileStream",
        .kind = RPC_CLIENT_STREAM,
        .input = &pb__file_chunk__descriptor,
        .output = &pb__post_files_response__descriptor,
        .on_request = fs_upload_on_request,
        .on_message = fs_upload_on_message,
        .on_input_end = fs_upload_on_input_end,
        .on_cancel = fs_upload_on_cancel,
    },
    {
        .path = "/pb.FileService/GetFileStream",
        .kind = RPC_SERVER_STREAM,
        .input = &pb__get_file_request__descriptor,
        .output = &pb__file_chunk__descriptor,
        .on_request = fs_download_on_request,
        .on_cancel = fs_download_on_cancel,
        .flags = RPC_F_DRAIN_END,
    },
    {
        .path = "/pb.FileService/ListFiles",
        .kind = RPC_UNARY,
        .input = &pb__list_files_request__descriptor,
        .output = &pb__list_files_response__descriptor,
        .on_request = fs_list_on_request,
        .on_cancel = fs_listing_on_cancel,
    },
    {
        .path = "/pb.FileService/SearchFiles",
        .kind = RPC_UNARY,
        .input = &pb__search_files_request__descriptor,
        .output = &pb__search_files_response__descriptor,
        .on_request = fs_search_on_request,
        .on_cancel = fs_listing_on_cancel,
    },
    {
        .path = "/pb.FileService/Stat",
        .kind = RPC_UNARY,
        .input = &pb__stat_request__descriptor,
        .output = &pb__stat_response__descriptor,
        .on_request = fs_stat_on_request,
        .on_cancel = fs_op_on_cancel,
    },
    {
        .path = "/pb.FileService/MakeDir",
        .kind = RPC_UNARY,
        .input = &pb__make_dir_request__descriptor,
        .output = &pb__make_dir_response__descriptor,
        .on_request = fs_mkdir_on_request,
        .on_cancel = fs_op_on_cancel,
    },
    {
        .path = "/pb.FileService/Move",
        .kind = RPC_UNARY,
        .input = &pb__move_request__descriptor,
        .output = &pb__move_response__descriptor,
        .on_request = fs_move_on_request,
        .on_cancel = fs_op_on_cancel,
    },
    {
        .path = "/pb.FileService/Remove",
        .kind = RPC_UNARY,
        .input = &pb__remove_request__descriptor,
        .output = &pb__remove_response__descriptor,
        .on_request = fs_remove_on_request,
        .on_cancel = fs_op_on_cancel,
    },
    {
        .path = "/pb.FileService/WatchDir",
        .kind = RPC_SERVER_STREAM,
        .input = &pb__watch_dir_request__descriptor,
        .output = &pb__watch_dir_event__descriptor,
        .on_request = fs_watch_on_request,
        .on_cancel = fs_watch_on_cancel,
        .flags = RPC_F_DRAIN_END,
    },
};

uv_loop_t *fs_loop;

const rpc_method *fs_service_methods(uv_loop_t *loop, size_t *n) {
  fs_loop = loop;
  *n = sizeof fs_methods / sizeof *fs_methods;
  return fs_methods;
}

int fs_check_call_path(rpc_call *c, const char *p, const char *op, char *err, size_t errlen) {
  if (!p) p = "";
  if (rpc_input_had_nul(c)) {
    snprintf(err, errlen, "filepath contains a NUL byte for %s", op);
    return -1;
  }
  return fs_path_check(p, strlen(p), op, err, errlen);
}

void fs_finish_status(rpc_call *c, const fs_status *st) {
  rpc_finish(c, st->code, st->msg);
}
