/* wire — protobuf binary encoding by hand: varints, tags, length-delimited
 * field headers.  For the few places that frame or scan protobuf bytes
 * without protobuf-c (a download's FileChunk and a process's output event
 * framed in place in front of the data, the NUL scan of pbwire.c, wire
 * sizes computed before encoding).
 *
 * A varint is 1..10 bytes, 7 bits each, least significant group first, the
 * high bit set on every byte but the last.  The reader accepts what
 * protobuf-c's unpack accepts (a scanner that disagreed with it could be
 * steered past a field): at most 10 bytes, bits beyond the 64th dropped;
 * 11 or more bytes, or input that ends inside the varint, is an error.
 * The writer always writes the shortest form.
 */
#ifndef CONCH_PROTO_WIRE_H
#define CONCH_PROTO_WIRE_H

#include <stddef.h>
#include <stdint.h>

#define WIRE_VARINT_MAX 10

/* wire types */
#define WIRE_T_VARINT 0
#define WIRE_T_I64 1
#define WIRE_T_LEN 2
#define WIRE_T_I32 5

/* Bytes of the shortest varint of v (1..10). */
size_t wire_varint_len(uint64_t v);
/* The varint of v into out (WIRE_VARINT_MAX bytes of room); its length. */
size_t wire_varint_put(uint8_t *out, uint64_t v);
/* Reads a varint at *p (end: first byte past the input) into *v and moves
 * *p past it: 0; -1 when truncated or longer than 10 bytes (*p, *v then
 * unspecified). */
int wire_varint_get(const uint8_t **p, const uint8_t *end, uint64_t *v);

/* A field key: field number and wire type. */
static inline uint64_t wire_key(uint32_t field, unsigned type) { return (uint64_t)field << 3 | (type & 7); }

/* Bytes of a length-delimited field with a payload of len bytes: key,
 * length, payload. */
size_t wire_len_field_size(uint32_t field, uint64_t len);
/* Writes the key and length of a length-delimited field so that they end
 * at buf + off (the payload of len bytes starts there); returns the
 * offset where they start.  off must be at least
 * wire_len_field_size(field, len) - len. */
size_t wire_prepend_len(uint8_t *buf, size_t off, uint32_t field, uint64_t len);

#endif
