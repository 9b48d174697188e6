/* fs/httphdr — the header texts of /files (api.md §9 "Files over plain
 * HTTP"): dates, validators, Content-Disposition, one byte range.  Pure
 * functions, any thread (tests/unit/test_fs_httphdr.c). */
#ifndef CONCH_FS_HTTPHDR_H
#define CONCH_FS_HTTPHDR_H

#include <stdint.h>
#include <time.h>

/* t as an RFC 9110 IMF-fixdate ("Mon, 07 Dec 2026 21:20:00 GMT"). */
void fs_http_date(time_t t, char out[40]);
/* An IMF-fixdate's time; -1 when s (NULL allowed) is not one. */
int64_t fs_http_parse_date(const char *s);
/* 1 when an If-None-Match list names etag (weak comparison: W/ ignored)
 * or is `*`. */
int fs_http_etag_listed(const char *list, const char *etag);
/* `attachment; filename="…"` (RFC 6266) with `_` for what is not plain
 * ASCII, plus `filename*=UTF-8''…` when anything was; malloc'd (NULL: out
 * of memory). */
char *fs_http_disposition(const char *name);

typedef enum fs_http_rng { FS_RANGE_NONE, FS_RANGE_OK, FS_RANGE_BAD } fs_http_rng;
/* One byte range of a file of size bytes (`bytes=a-b`, `a-`, `-n`) →
 * FS_RANGE_OK with [*a, *b]; FS_RANGE_BAD: unsatisfiable (416);
 * FS_RANGE_NONE: absent, malformed or several ranges (the whole file). */
fs_http_rng fs_http_range(const char *v, uint64_t size, uint64_t *a, uint64_t *b);

#endif
