/* fs/atomic — a file written whole or not at all (api.md §7
 * PostFileStream, and PUT /files): mkdir -p of the target's directory
 * (0755), which is opened and held; the content goes to a temp file in it
 * (an unnamed O_TMPFILE, or where the filesystem has none
 * ".conch-upload-<random>" O_EXCL); the commit fdatasyncs it, gives it the
 * target's mode (and owner) when the target exists or 0644, names it
 * ".conch-upload-<random>" (linkat) and renames it onto the target — every
 * step relative to the held directory, so a directory renamed meanwhile
 * takes the upload with it and no temp file is stranded.  On any failure
 * the temp file is removed and the target untouched.
 *
 * Pool side only (blocking calls), except fs_atomic_init/has_temp; with
 * the caller's file-system identity on the thread (rpc_work_submit). */
#ifndef CONCH_FS_ATOMIC_H
#define CONCH_FS_ATOMIC_H

#include <stdatomic.h>
#include <stddef.h>

#include "fs/status.h"

typedef struct fs_atomic {
  const char *target; /* clean absolute path (not owned) */
  const atomic_int *canceled; /* set: open and commit stop ("upload canceled") */
  char *tmp; /* the temp file's name in dfd while it has one */
  int fd;    /* the temp file (O_TMPFILE: unnamed until the commit) */
  int dfd;   /* the target's directory */
  int replaced; /* after a commit: the target existed */
} fs_atomic;

void fs_atomic_init(fs_atomic *a, const char *target, const atomic_int *canceled);
static inline int fs_atomic_has_temp(const fs_atomic *a) { return a->fd >= 0 || a->dfd >= 0; }
/* Each returns 0, or -1 with st set and the temp file already removed. */
int fs_atomic_open(fs_atomic *a, fs_status *st);
int fs_atomic_write(fs_atomic *a, const void *data, size_t len, fs_status *st);
int fs_atomic_commit(fs_atomic *a, fs_status *st);
/* Remove the temp file (if any) and close what is open. */
void fs_atomic_abort(fs_atomic *a);

#endif
