/* fs/walk — the ListFiles / SearchFiles directory walk (api.md §7).
 *
 * Blocking: call it from a thread-pool work body only.  The root is stat'ed
 * following symlinks; a missing root → not_found "path not found: <p>".  A
 * file root yields one entry (if the filter keeps it).  A directory root
 * yields its descendants, depth-first pre-order, names in byte order within
 * each directory; children of the root are level 1 and a directory at level
 * L is entered when L < max_depth (max_depth 0 = unlimited).
 *
 * Entries are stat'ed following symlinks and carry their *logical* path
 * (link/child).  A directory whose (dev, ino) is already on the current
 * descent chain is reported but not entered (symlink cycles).  A broken
 * symlink is reported with its own lstat data (type file, "L…" mode).
 * Entries that vanish during the walk are skipped.  Failing to read the
 * root directory fails the walk with the OS error ("read directory <p>:
 * …"); a subdirectory that cannot be read (permission, vanished…) is still
 * listed but not entered, so a search of "/" is not spoiled by one
 * /proc/<pid>/fdinfo.
 *
 * Bounds: the walk stops with resource_exhausted
 * "file list exceeds maximum message size 16777216 bytes" once the encoded
 * response (protobuf or JSON, estimated from above) would exceed max_bytes,
 * with resource_exhausted "file walk exceeds <N> entries" once more than
 * max_visits entries were examined (symlinks such as /proc/<pid>/fd/<n>
 * can make the logical tree of "/" practically endless even with the
 * cycle guard), and with RPC_CANCELED as soon as *cancel becomes non-zero.
 */
#ifndef CONCH_FS_WALK_H
#define CONCH_FS_WALK_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "fs/mode.h"
#include "fs/rfc3339.h"
#include "fs/status.h"

#define FS_WALK_INLINE 4
#define FS_WALK_INLINE_PATHS 512

typedef struct fs_entry {
  char *path;       /* logical path (in the walk's inline store, or malloc'd) */
  const char *name; /* basename, points into path */
  int is_dir;
  int64_t size;
  char perms[FS_MODE_STR_MAX];
  char mtime[FS_RFC3339_MAX];
} fs_entry;

/* Keep an entry?  rel is the path relative to the root ("" … for a file
 * root: its basename), base its basename. */
typedef int (*fs_walk_filter)(void *arg, const char *rel, size_t rellen, const char *base,
                              size_t baselen, int is_dir);

typedef struct fs_walk {
  /* in */
  const char *root;     /* a clean absolute path */
  int max_depth;        /* 0 = unlimited */
  fs_walk_filter filter; /* NULL = keep all */
  void *filter_arg;
  const atomic_int *cancel; /* may be NULL */
  int json;              /* size bound estimated for JSON (else protobuf) */
  size_t max_bytes;
  size_t max_visits;     /* 0 = unlimited */
  /* out */
  fs_entry *entries;
  size_t n, cap;
  /* The first entries and paths live here: a small listing allocates
   * nothing in the pool thread (memory malloc'd there and freed on the
   * loop crosses glibc arenas, which costs locks).  The struct must not be
   * moved once run. */
  fs_entry inl[FS_WALK_INLINE];
  size_t paths_used;
  char paths[FS_WALK_INLINE_PATHS];
  size_t bytes;  /* estimated encoded size of the response so far */
  size_t visits; /* entries examined */
  fs_status st;
} fs_walk;

/* Run the walk; returns st.code (RPC_OK on success; entries as far as the
 * walk got are kept either way).  */
int fs_walk_run(fs_walk *w);
/* Free entries and status. */
void fs_walk_free(fs_walk *w);

/* Encoded size of one entry inside a ListFiles/SearchFilesResponse
 * (protobuf: exact; JSON: an upper bound).  e->name must be the last bytes
 * of e->path, as the walk makes them. */
size_t fs_entry_wire_size(const fs_entry *e, int json);

/* Fill *e (except path/name) from a stat (or, for a dangling link, lstat)
 * result: type "directory" only for directories. */
void fs_entry_fill(fs_entry *e, const struct stat *st);

#endif
