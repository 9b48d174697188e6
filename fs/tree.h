/* fs/tree — blocking tree operations for Move and Remove (fs/ops.c);
 * thread-pool work bodies only.
 *
 * Remove never follows a symlink: every directory is opened relative to its
 * parent's fd with O_NOFOLLOW and entries go with unlinkat, so a link (or an
 * entry swapped for one meanwhile) is removed itself, never its target.  A
 * directory on another mount than the path's parent — told by mount ID
 * (statx STATX_MNT_ID), so a bind mount of the same filesystem too — is
 * not entered (its removal fails "device or resource busy").  The walk holds
 * one fd per level and is bounded to FS_TREE_MAX_DEPTH levels; no name
 * lists are kept (each directory is read until a pass finds it empty, at
 * most FS_TREE_MAX_PASSES passes).  A cancel flag stops it between entries.
 *
 * Cross-filesystem move (rename said EXDEV): the source is copied to
 * ".conch-move-<random>" beside the destination — file data fdatasync'ed,
 * mode, owner and times kept, symlinks recreated, FIFOs/devices mknod'ed,
 * directories copied recursively under the same bounds (hard links become
 * separate files) — then renamed onto the destination (atomic: readers see
 * the old destination or the whole new one), then the source is removed.
 * Any failure before the rename removes the copy and leaves the source:
 * a mount inside the source (or the source a mount point) is refused so
 * (invalid_argument "cannot move a mount point across filesystems: <p>"),
 * and an entry swapped for another kind after its stat (aborted "file
 * changed during move: <p>") — every open is O_NONBLOCK | O_NOFOLLOW and
 * judged by the fstat of what it opened, so a FIFO or device swapped in
 * never blocks a pool thread.
 */
#ifndef CONCH_FS_TREE_H
#define CONCH_FS_TREE_H

#include <stdatomic.h>
#include <stddef.h>

#include "fs/status.h"

#define FS_TREE_MAX_DEPTH 1024
#define FS_TREE_MAX_PASSES 8

/* mkdir -p of path[0, dirlen) (0755); 0, or -1 with st set.  made (may be
 * NULL): the length of the shortest prefix this call created, 0 if none. */
int fs_tree_mkdir_p(const char *path, size_t dirlen, size_t *made, fs_status *st);
/* Undo fs_tree_mkdir_p's work (made as it said): rmdir path[0, dirlen) and
 * its parents down to path[0, made), stopping at one no longer empty. */
void fs_tree_unmake(const char *path, size_t dirlen, size_t made);
/* Remove path (not following a final symlink), recursively. */
int fs_tree_remove(const char *path, const atomic_int *cancel, fs_status *st);
/* Move src to dst across filesystems (see above). */
int fs_tree_move_xdev(const char *src, const char *dst, const atomic_int *cancel, fs_status *st);
/* "move <src> to <dst>: <errno text>" with §7's code. */
void fs_tree_status_move(fs_status *st, const char *src, const char *dst, int err);

#endif
