/* fs/query — the query string of a /files request (api.md §9 "Files over
 * plain HTTP"): `&`-separated `key=value` pairs, percent-decoded ('+' is
 * a space, as HTML forms and Python's urlencode write it).  Untrusted
 * input: a bad escape, invalid UTF-8 or a second `path` is an error; keys
 * other than the ones below are ignored.  Pure; no I/O. */
#ifndef CONCH_FS_QUERY_H
#define CONCH_FS_QUERY_H

#include <stddef.h>

typedef struct fs_query {
  /* decoded values (malloc'd, NUL-terminated), NULL when absent */
  char *path, *username, *expires, *signature;
  size_t path_len; /* a decoded path may hold a NUL byte */
} fs_query;

/* Longest query accepted. */
#define FS_QUERY_MAX 16384

/* Decode q (NULL: no query) into *out.  0, or -1 with the reason in err
 * (*out then holds nothing). */
int fs_query_parse(const char *q, fs_query *out, char *err, size_t errlen);
void fs_query_free(fs_query *q);

/* Decode s[0..n) into out (at most n bytes); the decoded length, or -1 for
 * a '%' not followed by two hex digits. */
long fs_percent_decode(const char *s, size_t n, char *out);

#endif
