/* pbmem — the memory a decoded message is built in: a caller's buffer
 * first, then malloc, within a budget.
 *
 * A unary call decodes its one request into a buffer on the loop's stack
 * and frees it as soon as the service has taken it (rpc.h: "req is freed
 * when the callback returns"), so a small request costs no malloc at all;
 * what does not fit is malloc'd.  The budget bounds the malloc'd part:
 * each allocation counts its size rounded up to 16 plus 16 bytes of
 * overhead, and one over the budget fails (over = 1).  Frees give nothing
 * back to the budget — it bounds what one decode ever took.
 *
 * Use: pbmem_init, then hand &m.a to protobuf_c_message_unpack (or
 * pbjson_decode_mem), and free the message with
 * protobuf_c_message_free_unpacked(msg, &m.a) while the buffer still
 * exists.  Without a buffer (NULL, 0) everything is malloc'd, and the
 * message may also be freed with the system allocator (NULL).
 */
#ifndef CONCH_PBMEM_H
#define CONCH_PBMEM_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pbmem {
  ProtobufCAllocator a;
  uint8_t *buf;
  size_t cap, used;
  size_t left; /* budget left for malloc'd memory */
  int over;    /* an allocation was refused for the budget */
} pbmem;

void pbmem_init(pbmem *m, void *buf, size_t cap, size_t budget);

#endif
