/* pbjson — proto3 canonical JSON for any protobuf-c message (api.md §3).
 *
 * One generic codec driven by ProtobufCMessageDescriptor: no per-message
 * code.  Output: lowerCamelCase names, default values omitted, int64/uint64
 * as strings, bytes as standard padded base64 without line breaks, maps as
 * objects, a set oneof member always emitted (even when empty: {}).
 * Input: lowerCamelCase or original names, unknown fields ignored, int64 as
 * string or number, standard or URL-safe base64 with or without padding
 * (anything else rejected), null = default, strict UTF-8.
 *
 * Implementation: pbjson.c (encoder, UTF-8 walk), pbjson_decode.c (decoder,
 * on top of the strict parser in proto/json.h); strings, UTF-8 and base64
 * are proto/text.h's.  json_name is derived from the field name as protoc does
 * (protobuf-c descriptors do not carry it; a custom json_name option is
 * therefore not honoured on output).
 */
#ifndef CONCH_PBJSON_H
#define CONCH_PBJSON_H

#include <stddef.h>
#include <protobuf-c/protobuf-c.h>

/* Encode.  Returns a malloc'd, NUL-terminated buffer (length in *len) or NULL on ENOMEM.
 * One pass into a buffer that grows by doubling.  Strings are written by
 * text_json_string (proto/text.h): JSON cannot carry invalid UTF-8, so such
 * bytes in string fields come out as \ufffd, one per byte (run
 * pbjson_check_decoded first where that matters). */
char *pbjson_encode(const ProtobufCMessage *msg, size_t *len);
/* The same with `headroom` bytes left free before the JSON (an envelope
 * prefix, say): the JSON starts at the returned pointer + headroom. */
char *pbjson_encode_at(const ProtobufCMessage *msg, size_t headroom, size_t *len);
/* The same into the caller's buffer (cap bytes), which is never
 * reallocated or freed here: returns buf when the message fits, else a new
 * malloc'd buffer with the whole encoding (buf's bytes then do not
 * matter; buf NULL: always a new one), or NULL when out of memory.  Lets a
 * caller encode in another thread into memory its own thread allocated. */
char *pbjson_encode_fixed(const ProtobufCMessage *msg, size_t headroom, char *buf, size_t cap,
                          size_t *len);

/* Decode a complete JSON document into a new message of type desc (free it
 * with protobuf_c_message_free_unpacked(m, NULL)).  On failure returns NULL
 * and writes a human-readable reason into err, naming the field by its path
 * (e.g. "invalid value for field \"content\": invalid base64",
 * "duplicate field \"cmd\"", "invalid value for field \"entries[1].size\": …").
 * Empty input is an error.  Every failure is the caller's invalid_argument
 * except "out of memory" and PBJSON_TOO_BIG (below). */
ProtobufCMessage *pbjson_decode(const ProtobufCMessageDescriptor *desc, const char *json,
                                size_t len, char *err, size_t errlen);
/* The same, with *flags (if not NULL) set to a mask of:
 * PBJSON_HAD_NUL — decoded, and some string field held a NUL byte
 *   ("\u0000"): protobuf-c strings are C strings, so the value is cut at
 *   the NUL, and callers that must reject NULs (file paths) check this;
 * PBJSON_TOO_BIG — not decoded: the document needs more memory than
 *   JSON_MEM_BUDGET(len) allows (the caller's resource_exhausted). */
#define PBJSON_HAD_NUL 1
#define PBJSON_TOO_BIG 2
ProtobufCMessage *pbjson_decode_ex(const ProtobufCMessageDescriptor *desc, const char *json,
                                   size_t len, int *flags, char *err, size_t errlen);
/* The same, the message built with allocator a (e.g. a pbmem's; NULL is
 * malloc) and freed with protobuf_c_message_free_unpacked(m, a). */
ProtobufCMessage *pbjson_decode_mem(const ProtobufCMessageDescriptor *desc, const char *json,
                                    size_t len, ProtobufCAllocator *a, int *flags, char *err,
                                    size_t errlen);

/* Check an unpacked protobuf message as the JSON decoder checks its input:
 * every string field (recursively, incl. maps and repeated) is valid UTF-8,
 * and no map has a key twice (JSON rejects that; protobuf would silently
 * keep both entries, which List would then echo as a JSON object with a
 * repeated key).  0 = ok, -1 = invalid (field named in err). */
int pbjson_check_decoded(const ProtobufCMessage *msg, char *err, size_t errlen);

#endif
