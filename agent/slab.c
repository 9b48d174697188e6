/* slab — small blocks by size class; see slab.h. */
#include "agent/slab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/daemon.h"

_Static_assert(sizeof conch.slab / sizeof conch.slab[0] == SLAB_CLASSES, "conch.slab size");

#define SLAB_HDR 16u
#define SLAB_BIG 0xffu

typedef struct slab_hdr {
  size_t cls; /* class index, or SLAB_BIG (then `size` is the block size) */
  size_t size;
} slab_hdr;

/* The smallest class that holds n bytes: 32 << c >= n. */
static unsigned slab_class(size_t n) {
  if (n <= 32) return 0;
  unsigned c = (unsigned)(64 - __builtin_clzll((unsigned long long)(n - 1))) - 5;
  return c < SLAB_CLASSES ? c : SLAB_BIG;
}

static size_t slab_class_size(unsigned c) { return (size_t)32 << c; }

/* SLAB_CLASS_BYTES / size, at least SLAB_CLASS_MIN_BLOCKS (a shift: the
 * sizes are powers of two; a division here cost more than the rest of
 * slab_free). */
static unsigned slab_class_cap(unsigned c) {
  _Static_assert((SLAB_CLASS_BYTES & (SLAB_CLASS_BYTES - 1)) == 0, "power of two");
  unsigned n = (SLAB_CLASS_BYTES / 32u) >> c;
  return n < SLAB_CLASS_MIN_BLOCKS ? SLAB_CLASS_MIN_BLOCKS : n;
}

void *slab_alloc(size_t n) {
  unsigned c = slab_class(n);
  slab_hdr *h;
  if (c == SLAB_BIG) {
    if (n > SIZE_MAX - SLAB_HDR) return NULL;
    h = malloc(SLAB_HDR + n);
    if (!h) return NULL;
    h->size = n;
  } else {
    conch_cache *fl = &conch.slab[c];
    if (fl->head) {
      h = fl->head;
      fl->head = *(void **)h;
      fl->n--;
    } else {
      h = malloc(SLAB_HDR + slab_class_size(c));
      if (!h) return NULL;
    }
    h->size = slab_class_size(c);
  }
  h->cls = c;
  return (char *)h + SLAB_HDR;
}

void *slab_calloc(size_t nmemb, size_t size) {
  if (size && nmemb > SIZE_MAX / size) return NULL;
  void *p = slab_alloc(nmemb * size);
  if (p) memset(p, 0, nmemb * size);
  return p;
}

void slab_free(void *p) {
  if (!p) return;
  slab_hdr *h = (slab_hdr *)((char *)p - SLAB_HDR);
  if (h->cls == SLAB_BIG) {
    free(h);
    return;
  }
  conch_cache *fl = &conch.slab[h->cls];
  if (fl->n >= slab_class_cap((unsigned)h->cls)) {
    free(h);
    return;
  }
  *(void **)h = fl->head;
  fl->head = h;
  fl->n++;
}

void *slab_realloc(void *p, size_t n) {
  if (!p) return slab_alloc(n);
  if (n == 0) {
    slab_free(p);
    return NULL;
  }
  slab_hdr *h = (slab_hdr *)((char *)p - SLAB_HDR);
  if (n <= h->size) return p; /* fits where it is */
  void *q = slab_alloc(n);
  if (!q) return NULL;
  memcpy(q, p, h->size);
  slab_free(p);
  return q;
}

static void slab_buf_release(bufref *r) { slab_free(r); }

void *slab_buf_owner(slab_buf *b) {
  b->ref.release = slab_buf_release;
  return bufref_owner_plain(&b->ref);
}

unsigned slab_kept(unsigned cls) { return cls < SLAB_CLASSES ? conch.slab[cls].n : 0; }
