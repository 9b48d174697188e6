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

/* 1 = some string field contains NUL; 0 = none (or input not parseable:
 * protobuf-c's own unpack is the judge of validity). */
int pbwire_has_nul_string(const ProtobufCMessageDescriptor *d, const uint8_t *p, size_t n);

#endif
