/* fs/status — the outcome of a FileService operation: an RPC code and a
 * malloc'd message, built on any thread and handed to rpc_finish() on the
 * loop thread.
 *
 * OS errors (api.md §7): EACCES/EPERM → permission_denied, anything else →
 * internal; message "<context> <path>: <strerror text in lower case>", e.g.
 * "open file /x: permission denied".
 */
#ifndef CONCH_FS_STATUS_H
#define CONCH_FS_STATUS_H

#include "server/rpc.h"

typedef struct fs_status {
  rpc_code code; /* RPC_OK when nothing failed */
  char *msg;     /* malloc'd, NULL when none (or out of memory) */
  int err;       /* the errno fs_status_os was given, else 0 */
} fs_status;

/* Set code and formatted message (replacing any previous one). */
void fs_status_set(fs_status *st, rpc_code code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Set from an errno value as described above. */
void fs_status_os(fs_status *st, const char *context, const char *path, int err);
/* The code for an errno value. */
rpc_code fs_errno_code(int err);
/* Free the message and reset to RPC_OK. */
void fs_status_clear(fs_status *st);

#endif
