/* pbwire — facts about protobuf binary input that protobuf-c's unpack hides.
 *
 * protobuf-c hands strings over as C strings, so a NUL byte inside a string
 * field silently cuts it.  pbwire_has_nul_string() walks the wire bytes by
 * descriptor (nested messages and map entries included) and tells whether
 * any string field holds a NUL, so callers can reject such input instead. */
#ifndef CONCH_PBWIRE_H
#define CONCH_PBWIRE_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

#include "proto/pbmem.h"

/* 1 = some string field contains NUL; 0 = none (or input not parseable:
 * protobuf-c's own unpack is the judge of validity). */
int pbwire_has_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n);

/* protobuf_c_message_unpack in m's memory (pbmem.h: a caller's buffer,
 * then malloc within a budget, each allocation counted with 16 bytes of
 * overhead).  Without the bound 16 MiB of empty repeated strings (2 bytes
 * each on the wire) became 8 M allocations, some 320 MiB.  NULL when the
 * input is invalid or over the budget (then m->over = 1).  Free the result
 * with protobuf_c_message_free_unpacked(msg, &m->a) (or NULL when m has no
 * buffer). */
ProtobufCMessage *pbwire_unpack_mem(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                    pbmem *m);

#endif
