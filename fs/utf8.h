/* fs/utf8 — one UTF-8 decoding step with Go's utf8.DecodeRune semantics
 * (used by the glob matcher and by %q quoting, which must agree with Go). */
#ifndef CONCH_FS_UTF8_H
#define CONCH_FS_UTF8_H

#include <stddef.h>
#include <stdint.h>

#define FS_RUNE_ERROR 0xFFFDu

/* The rune at s (n bytes available) and its width in *w.  Invalid or short
 * input gives (FS_RUNE_ERROR, 1) — a real U+FFFD has width 3; n == 0 gives
 * (FS_RUNE_ERROR, 0). */
uint32_t fs_utf8_rune(const unsigned char *s, size_t n, size_t *w);

#endif
