/* rpcdecode — one request message decoded: gunzip when compressed, then
 * proto3 JSON or protobuf, within a memory budget; any thread (connect.c
 * calls it on the loop for small messages and in the pool for big ones). */
#ifndef CONCH_RPCDECODE_H
#define CONCH_RPCDECODE_H

#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>

#include "server/rpc.h"
#include "proto/pbmem.h"

/* p[0, n) into mem (pbmem.h: the scratch buffer first, then malloc, within
 * the decode budget).  The message, or NULL with *code and err2 (err2n
 * bytes) set to the call's error; *nul_out: a string held a NUL.  whole
 * (0: n): the memory budget is that of a message of `whole` bytes, less
 * `charged` already taken (a big field's block).  Free the message with
 * protobuf_c_message_free_unpacked(m, &mem->a). */
ProtobufCMessage *rpc_decode_message(const ProtobufCMessageDescriptor *d, int json, int gzip_in,
                                     const uint8_t *p, size_t n, int compressed, void *scratch,
                                     size_t scratch_len, pbmem *mem, rpc_code *code, char *err2,
                                     size_t err2n, int *nul_out, size_t whole, size_t charged);

#endif
