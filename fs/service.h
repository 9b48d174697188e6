/* fs/service — the FileService (api.md §7) as rpc_method entries.
 *
 *   size_t n;
 *   const rpc_method *m = fs_service_methods(loop, &n);   // n == 9
 *
 * PostFileStream (client stream), GetFileStream (server stream), ListFiles
 * and SearchFiles (unary), Stat, MakeDir, Move, Remove (unary, api.md §9) and
 * WatchDir (server stream), at "/pb.FileService/<Name>".  All disk work runs
 * in the thread pool (rpc_work_submit); everything
 * else on the loop thread.
 */
#ifndef CONCH_FS_SERVICE_H
#define CONCH_FS_SERVICE_H

#include <stddef.h>
#include <uv.h>

#include "server/rpc.h"

const rpc_method *fs_service_methods(uv_loop_t *loop, size_t *n);

/* GET/HEAD/PUT/POST/OPTIONS /files (api.md §9 "Files over plain HTTP"; fs/http.c),
 * registered by agent/ with router_add_http after fs_service_methods. */
void fs_http_serve(rpc_http *r);

#endif
