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
/* A message's big bytes field, found while the message is still arriving,
 * so that its bytes can be read into a block of their own instead of being
 * assembled with the rest and copied again by protobuf-c's unpack
 * (connect.c: a file chunk's content).  The message is the rest decoded
 * with protobuf-c, the field then given the block (pbwire_attach_big): the
 * same message as unpacking the whole, which fuzz_pbwire checks. */
typedef enum pbwire_big_status {
  PBWIRE_BIG_NEED,  /* no answer before more of the message is here */
  PBWIRE_BIG_FOUND, /* key, val, len and f say where */
  PBWIRE_BIG_NONE   /* not in this message: stop asking */
} pbwire_big_status;

typedef struct pbwire_big {
  size_t scan; /* where the walk goes on: 0 for a new message, kept between calls */
  size_t key;  /* FOUND: offset of the field's key, */
  size_t val;  /* of its bytes, */
  size_t len;  /* and their length */
  const ProtobufCFieldDescriptor *f;
} pbwire_big;

/* Walks the top-level fields of p[0, n), the first n bytes of a message of
 * `total` bytes, from b->scan.  FOUND: a length-delimited field of a
 * singular bytes field of d (not in a oneof, no default), at least `min`
 * bytes long, whose key starts before `within`, fitting in the message and
 * the first field of that number.  NONE for anything else: invalid wire
 * bytes, a key at or past `within`, a field past `total`.  Each call walks
 * only what it did not walk before (b->scan), so asking after every read is
 * linear in the message. */
pbwire_big_status pbwire_find_big(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                  size_t total, size_t min, size_t within, pbwire_big *b);

/* Gives m's field f (as pbwire_find_big found it) the len bytes at data, a
 * malloc'd block that m then owns, unless the rest of the message after
 * that field (after[0, after_len), valid wire bytes) sets the field again:
 * the last one wins, m keeps that one and the caller still owns data.
 * 1 when attached, 0 when not. */
int pbwire_attach_big(ProtobufCMessage *m, const ProtobufCFieldDescriptor *f, const uint8_t *after,
                      size_t after_len, uint8_t *data, size_t len);

ProtobufCMessage *pbwire_unpack_mem(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n,
                                    pbmem *m);

#endif
