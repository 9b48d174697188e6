/* test_slab — agent/slab: blocks come back by size class and are reused,
 * each class keeps a bounded number of free blocks, realloc keeps the bytes
 * and stays in place while the class fits, big blocks and overflowing
 * sizes are handled, alignment is 16. */
#include <stdint.h>
#include <stdlib.h>

#include "agent/daemon.h"
#include "agent/slab.h"
#include "test.h"

TEST(reuse_by_class) {
  void *a = slab_alloc(100); /* class 128 */
  ASSERT(a != NULL);
  ASSERT_EQ((uintptr_t)a % 16, 0);
  memset(a, 0xab, 100);
  unsigned before = slab_kept(2);
  slab_free(a);
  ASSERT_EQ(slab_kept(2), before + 1);
  void *b = slab_alloc(128); /* same class: the same block */
  ASSERT(b == a);
  ASSERT_EQ(slab_kept(2), before);
  slab_free(b);
  slab_free(NULL);
}

TEST(bounded_free_lists) {
  enum { N = 3000 };
  void **v = malloc(N * sizeof *v);
  for (int i = 0; i < N; i++) v[i] = slab_alloc(32);
  for (int i = 0; i < N; i++) slab_free(v[i]);
  /* class 32: 32 KiB / 32 = 1024 blocks at most */
  ASSERT_EQ(slab_kept(0), SLAB_CLASS_BYTES / 32);
  for (int i = 0; i < N; i++) v[i] = slab_alloc(2048);
  for (int i = 0; i < N; i++) slab_free(v[i]);
  ASSERT_EQ(slab_kept(6), SLAB_CLASS_MIN_BLOCKS); /* the floor for big classes */
  free(v);
}

TEST(calloc_and_big) {
  unsigned char *p = slab_calloc(10, 20);
  ASSERT(p != NULL);
  for (int i = 0; i < 200; i++) ASSERT_EQ(p[i], 0);
  slab_free(p);
  ASSERT(slab_calloc(SIZE_MAX / 2, 3) == NULL); /* overflow refused */
  ASSERT(slab_alloc(SIZE_MAX - 4) == NULL);
  unsigned char *big = slab_alloc(100000); /* beyond the classes: malloc */
  ASSERT(big != NULL);
  ASSERT_EQ((uintptr_t)big % 16, 0);
  memset(big, 7, 100000);
  slab_free(big);
  ASSERT_EQ(slab_kept(7), 0);
}

TEST(realloc_keeps_bytes) {
  char *p = slab_realloc(NULL, 10);
  memcpy(p, "0123456789", 10);
  char *q = slab_realloc(p, 30); /* still class 32: in place */
  ASSERT(q == p);
  char *r = slab_realloc(q, 5000); /* beyond the classes */
  ASSERT(r != NULL);
  ASSERT_MEM_EQ(r, "0123456789", 10);
  char *s = slab_realloc(r, 6000); /* big block grows: moves, keeps bytes */
  ASSERT_MEM_EQ(s, "0123456789", 10);
  ASSERT(slab_realloc(s, 0) == NULL); /* frees */
}

/* Every size goes to the smallest class that holds it (32 << c >= n);
 * past 2048 bytes, to malloc. */
TEST(class_boundaries) {
  for (size_t n = 0; n <= 4100; n++) {
    unsigned want = SLAB_CLASSES; /* none */
    for (unsigned c = 0; c < SLAB_CLASSES; c++)
      if ((size_t)32 << c >= n) {
        want = c;
        break;
      }
    void *p = slab_alloc(n);
    ASSERT(p != NULL);
    memset(p, 0x5a, n); /* ASan: the block holds n bytes */
    unsigned mid[SLAB_CLASSES];
    for (unsigned c = 0; c < SLAB_CLASSES; c++) mid[c] = slab_kept(c);
    slab_free(p);
    for (unsigned c = 0; c < SLAB_CLASSES; c++) {
      unsigned grew = slab_kept(c) - mid[c];
      if (grew != (c == want)) TEST_FAIL_("size %zu went to class %u (want %u)", n, c, want);
    }
  }
}

/* A slab_buf travels as a plain owner word and comes back to its class. */
TEST(slab_buf_owner_word) {
  slab_buf *b = slab_alloc(sizeof *b + 100); /* class 128 */
  ASSERT(b != NULL);
  ASSERT_EQ((uintptr_t)b->data % 16, 0);
  void *owner = slab_buf_owner(b);
  ASSERT_EQ(bufref_owner_is_ref(owner), 1);
  ASSERT_EQ(bufref_owner_readable(owner), 1);
  unsigned before = slab_kept(2);
  bufref_owner_free(owner);
  ASSERT_EQ(slab_kept(2), before + 1);
}

int main(void) {
  RUN(reuse_by_class);
  RUN(bounded_free_lists);
  RUN(calloc_and_big);
  RUN(realloc_keeps_bytes);
  RUN(class_boundaries);
  RUN(slab_buf_owner_word);
  return test_summary();
}
