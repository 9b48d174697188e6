/* fs/glob — the SearchFiles glob (api.md §7), Go path.Match semantics.
 *
 * "*" any run of non-'/' characters, "?" one non-'/' character (a UTF-8
 * rune), "[...]" classes with ranges and "^" negation, "\" escapes the next
 * character; the pattern must match the whole name.  Syntax errors are
 * those of Go's ErrBadPattern: unclosed or empty class, bad range, trailing
 * backslash, invalid UTF-8 inside a class.
 *
 * Matching is Go's chunk algorithm: every '*' tries each following position
 * once and commits to the first chunk match, so a match costs at most
 * O(len(pattern) * len(name)) — no exponential backtracking.
 */
#ifndef CONCH_FS_GLOB_H
#define CONCH_FS_GLOB_H

#include <stddef.h>

/* 1 when the whole pattern is syntactically valid, 0 otherwise. */
int fs_glob_valid(const char *pat, size_t plen);

/* 1 match, 0 no match, -1 syntax error met while matching.  Call
 * fs_glob_valid first to get Go's "check the whole pattern" behaviour. */
int fs_glob_match(const char *pat, size_t plen, const char *name, size_t nlen);

#endif
