/* bufref — who gives back a buffer handed to the transport.
 *
 * Bytes queued for a connection stay valid until the kernel has them.  Each
 * queued piece has an owner, released once nothing can point into it any
 * more.  An owner is either
 *   - a malloc'd pointer (released with free()), the common case, or
 *   - a bufref: any object that embeds a struct bufref and releases itself
 *     in release() — e.g. a block of retained process output (proc/ring.c),
 *     shared by several pieces through its own count.
 * Both travel as one `void *` (a bufref is tagged in its low bit; malloc'd
 * pointers are always aligned), so queues keep one word per piece.  A
 * bufref's bytes are only handed to the kernel (rpc_send_bytes_tail's
 * contract: never read, copied or compressed in user space).
 */
#ifndef CONCH_BUFREF_H
#define CONCH_BUFREF_H

#include <stdint.h>
#include <stdlib.h>

typedef struct bufref {
  void (*release)(struct bufref *r);
} bufref;

/* The owner word of a bufref (r must be at least 4-byte aligned). */
static inline void *bufref_owner(bufref *r) { return (void *)((uintptr_t)r | 1u); }
/* 1 when the owner word is a bufref (its bytes go to the kernel as they
 * are, above). */
static inline int bufref_owner_is_ref(const void *owner) { return ((uintptr_t)owner & 1u) != 0; }

/* Release an owner word: free() or r->release(r); NULL is a no-op. */
static inline void bufref_owner_free(void *owner) {
  if ((uintptr_t)owner & 1u) {
    bufref *r = (bufref *)((uintptr_t)owner & ~(uintptr_t)1u);
    r->release(r);
  } else {
    free(owner);
  }
}

#endif
