/* pbmem — a caller's buffer, then malloc, within a budget; see pbmem.h. */
#include "proto/pbmem.h"

#include <stdlib.h>

static void *pbmem_alloc(void *data, size_t size) {
  pbmem *m = data;
  if (size == 0) size = 1; /* a distinct pointer, inside the buffer or malloc'd */
  size_t r = (size + 15) & ~(size_t)15;
  if (r >= size && r <= m->cap - m->used) {
    void *p = m->buf + m->used;
    m->used += r;
    return p;
  }
  size_t cost = r + 16;
  if (r < size || cost > m->left) {
    m->over = 1;
    return NULL;
  }
  m->left -= cost;
  return malloc(size);
}

static void pbmem_free(void *data, void *ptr) {
  pbmem *m = data;
  if (m->buf && (uint8_t *)ptr >= m->buf && (uint8_t *)ptr < m->buf + m->cap) return; /* the buffer's */
  free(ptr);
}

void pbmem_init(pbmem *m, void *buf, size_t cap, size_t budget) {
  m->a.alloc = pbmem_alloc;
  m->a.free = pbmem_free;
  m->a.allocator_data = m;
  /* 16-byte alignment for what is taken from the buffer */
  uintptr_t b = (uintptr_t)buf, a = (b + 15) & ~(uintptr_t)15;
  m->buf = buf ? (uint8_t *)a : NULL;
  m->cap = buf && cap > a - b ? cap - (a - b) : 0;
  m->used = 0;
  m->left = budget;
  m->over = 0;
}
