/* pbjson_int — descriptor helpers shared by the pbjson encoder and decoder
 * (internal to proto/; not a public interface).
 *
 * protobuf-c 1.4.1 descriptors carry no json_name and do not mark map entry
 * messages, so both are derived here exactly as protoc derives them.
 */
#ifndef CONCH_PBJSON_INT_H
#define CONCH_PBJSON_INT_H

#include <stddef.h>
#include <stdint.h>
#include <protobuf-c/protobuf-c.h>

/* Address of a member / the quantifier of field f inside message m. */
#define PBJ_MEMBER(m, f) ((void *)((char *)(m) + (f)->offset))
#define PBJ_QUANT(m, f) ((void *)((char *)(m) + (f)->quantifier_offset))

/* lowerCamelCase JSON name of a proto field name (protoc's ToJsonName:
 * drop '_' and upper-case the letter after it).  Writes at most cap-1 bytes
 * plus NUL; returns the full length. */
size_t pbj_json_name(const char *name, char *out, size_t cap);
/* 1 when key[0..klen) equals the JSON name of the proto field name. */
int pbj_json_name_eq(const char *name, const char *key, size_t klen);

/* 1 when repeated message field f of message type parent is a proto map
 * (its type is the synthesized <Field>Entry nested message with key = 1 and
 * value = 2). */
int pbj_is_map(const ProtobufCMessageDescriptor *parent, const ProtobufCFieldDescriptor *f);

/* Size of one element of a repeated field of this type in protobuf-c's C arrays. */
size_t pbj_elt_size(ProtobufCType t);

/* 1 for oneof members that are the selected member of their oneof. */
int pbj_oneof_selected(const ProtobufCMessage *m, const ProtobufCFieldDescriptor *f);

/* A field path for error messages: "entries[2].size", "env[PATH]". */
typedef struct pbj_path {
  char s[192];
  size_t len;
} pbj_path;
/* Each push returns the previous length; pbj_path_pop(p, thatlen) undoes it. */
size_t pbj_path_field(pbj_path *p, const char *name);
size_t pbj_path_index(pbj_path *p, size_t i);
size_t pbj_path_key(pbj_path *p, const char *key, size_t klen);
void pbj_path_pop(pbj_path *p, size_t len);

#endif
