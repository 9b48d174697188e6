/* fs/path — validation of remote guest paths (api.md §7 "Paths").
 *
 * Every FileService path must be a normalized absolute guest path: not
 * empty, no NUL byte, absolute and identical to its lexically cleaned form
 * (Go's path.Clean).  Symlinks are not resolved.  Also small path helpers
 * shared by the FileService modules.
 */
#ifndef CONCH_FS_PATH_H
#define CONCH_FS_PATH_H

#include <stddef.h>

/* Checks, in order: empty → "filepath is required for <op>"; NUL byte →
 * "filepath contains a NUL byte for <op>"; not clean/absolute →
 * "filepath must be a normalized absolute guest path for <op>".
 * Returns 0 when valid, -1 with the text in err otherwise. */
int fs_path_check(const char *p, size_t len, const char *op, char *err, size_t errlen);

/* 1 when p[0..len) is absolute and equal to path.Clean of itself. */
int fs_path_is_clean(const char *p, size_t len);

/* Basename of a clean absolute path ("/" → "/", "/a/b" → "b"). */
const char *fs_path_base(const char *p);

/* Length of the directory part of a clean absolute path ("/a/b" → 2 for
 * "/a", "/a" → 1 for "/", "/" → 1). */
size_t fs_path_dir_len(const char *p);

#endif
