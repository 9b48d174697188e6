/* slab — small blocks by size class, reused on the loop thread.
 *
 * For allocation-heavy code on the loop — nghttp2's per-stream and
 * per-frame objects (given to it as its nghttp2_mem) — that allocates and
 * frees the same few sizes over and over with a hundred streams in
 * flight: glibc's tcache keeps 7 blocks per size, so most of those frees
 * fell through to _int_free.  Here each power-of-two class from 32 to 2048
 * bytes keeps its own free list in the daemon context; bigger blocks go
 * straight to malloc.  Bounded: a class keeps at most
 * max(SLAB_CLASS_MIN_BLOCKS, SLAB_CLASS_BYTES / size) free blocks (about
 * 350 KiB in all at worst); the rest is freed.
 *
 * Loop thread only (no locks).  Every block carries a 16-byte header with
 * its class, so slab_free/slab_realloc need no size.  Blocks are 16-byte
 * aligned.  Never mix with malloc/free.
 */
#ifndef CONCH_SLAB_H
#define CONCH_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "agent/bufref.h"

#define SLAB_CLASSES 7 /* 32 … 2048 */
#define SLAB_CLASS_BYTES (32u * 1024)
#define SLAB_CLASS_MIN_BLOCKS 64u

void *slab_alloc(size_t n);
void *slab_calloc(size_t nmemb, size_t size);
void *slab_realloc(void *p, size_t n); /* n == 0: frees p, NULL */
void slab_free(void *p);               /* NULL: no-op */

/* A slab block whose bytes can travel to a transport and come back to the
 * slab once written: allocate sizeof(slab_buf) + n with slab_alloc (grow
 * with slab_realloc), fill data, hand over slab_buf_owner(b) (an owner
 * word, bufref.h; plain memory, so transports may copy it). */
typedef struct slab_buf {
  bufref ref;
  size_t pad; /* data 16-byte aligned */
  uint8_t data[];
} slab_buf;
void *slab_buf_owner(slab_buf *b);

/* Free blocks kept in class i (tests). */
unsigned slab_kept(unsigned cls);

#endif
