/* fs/rfc3339 — UTC RFC 3339 timestamps with second precision
 * ("2026-07-11T10:00:00Z"), as FileEntry.modified_time uses them.
 */
#ifndef CONCH_FS_RFC3339_H
#define CONCH_FS_RFC3339_H

#include <stddef.h>
#include <time.h>

#define FS_RFC3339_MAX 32

/* Formats t into out (>= FS_RFC3339_MAX).  Returns the length, or 0 when
 * the time cannot be represented (out is then ""). */
size_t fs_rfc3339(time_t t, char *out, size_t outlen);

#endif
