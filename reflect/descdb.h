/* reflect/descdb — an index over a serialized FileDescriptorSet (the one
 * embedded at build time, see the Makefile): which file a fully qualified
 * symbol lives in, files by name, extensions, services.  The file bytes are
 * never copied: answers point into the set, which must outlive the index.
 *
 * The set is walked at the wire level (field numbers of
 * google/protobuf/descriptor.proto; protobuf-c ships no descriptor.pb-c),
 * every length checked: a malformed set is refused, never read past.
 * Pure: no loop, no globals; load once, then read from any thread.
 */
#ifndef CONCH_REFLECT_DESCDB_H
#define CONCH_REFLECT_DESCDB_H

#include <stddef.h>
#include <stdint.h>

typedef struct descdb_file {
  char *name;            /* "agent.proto" */
  const uint8_t *data;   /* the serialized FileDescriptorProto */
  size_t len;
  int *deps;             /* indices of its imports found in the set */
  size_t ndeps;
} descdb_file;

typedef enum descdb_kind {
  DESCDB_MESSAGE, DESCDB_FIELD, DESCDB_ONEOF, DESCDB_ENUM, DESCDB_ENUM_VALUE,
  DESCDB_SERVICE, DESCDB_METHOD, DESCDB_EXTENSION
} descdb_kind;

typedef struct descdb_sym {
  char *name; /* fully qualified, no leading dot: "pb.ProcessEvent.StartEvent" */
  int file;
  descdb_kind kind;
} descdb_sym;

typedef struct descdb_ext {
  char *extendee; /* fully qualified message name, no leading dot */
  int32_t number;
  int file;
} descdb_ext;

typedef struct descdb {
  descdb_file *files;
  size_t nfiles;
  descdb_sym *syms; /* sorted by name */
  size_t nsyms;
  descdb_ext *exts;
  size_t nexts;
} descdb;

/* 0, or -1 when the set is malformed (or out of memory): db is then empty. */
int descdb_load(descdb *db, const uint8_t *set, size_t len);
void descdb_free(descdb *db);

/* Index of the file, or -1. */
int descdb_file_by_name(const descdb *db, const char *name);
/* The symbol (message, nested message, field, oneof, enum, enum value —
 * scoped beside its enum, as protobuf scopes them — service, method,
 * extension), or NULL. */
const descdb_sym *descdb_symbol(const descdb *db, const char *name);
/* Index of the file declaring extension `number` of message `type`, or -1. */
int descdb_file_by_extension(const descdb *db, const char *type, int32_t number);
/* The extension numbers of message `type` (up to cap into out): how many
 * there are, or -1 when `type` is no message of the set. */
long descdb_extension_numbers(const descdb *db, const char *type, int32_t *out, size_t cap);

#endif
