/* fs/service — the FileService (api.md §7) as rpc_method entries.
 *
 *   size_t n;
 *   const rpc_method *m = fs_service_methods(&n);   // n == 9
 *
 * PostFileStream (client stream), GetFileStream (server stream), ListFiles
 * and SearchFiles (unary), Stat, MakeDir, Move, Remove (unary, api.md §9) and
 * WatchDir (server stream), at "/pb.FileService/<Name>".  All disk work runs
 * in libuv's thread pool (conch.loop); everything else on the loop thread.
 */
#ifndef CONCH_FS_SERVICE_H
#define CONCH_FS_SERVICE_H

#include <stddef.h>

#include "agent/rpc.h"

const rpc_method *fs_service_methods(size_t *n);

#endif
