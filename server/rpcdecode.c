/* rpcdecode — see rpcdecode.h. */
#include "server/rpcdecode.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

#include "proto/gzip.h"
#include "proto/json.h"
#include "proto/pbjson.h"
#include "proto/pbwire.h"

ProtobufCMessage *rpc_decode_message(const ProtobufCMessageDescriptor *d, int json, int gzip_in,
                                     const uint8_t *p, size_t n, int compressed, void *scratch,
                                     size_t scratch_len, pbmem *mem, rpc_code *code, char *err2,
                                     size_t err2n, int *nul_out, size_t whole, size_t charged) {
  uint8_t *plain = NULL;
  if (compressed) {
    if (!gzip_in) {
      *code = RPC_INTERNAL;
      snprintf(err2, err2n, "protocol error: received compressed message without encoding");
      return NULL;
    }
    size_t pl;
    gz_result gr = gz_inflate(p, n, RPC_MAX_MESSAGE, &plain, &pl);
    if (gr != GZ_OK) {
      *code = gr == GZ_BAD ? RPC_INVALID_ARGUMENT : RPC_RESOURCE_EXHAUSTED;
      snprintf(err2, err2n, "%s",
               gr == GZ_BAD ? "invalid gzip data"
               : gr == GZ_TOO_BIG ? "message is larger than configured max 16777216 bytes"
                                  : "out of memory");
      return NULL;
    }
    p = plain;
    n = pl;
  }
  char err[512];
  ProtobufCMessage *m;
  int nul = 0, too_big = 0;
  /* the same bound for both codecs: a JSON document's (json.h) */
  if (!whole) whole = n;
  size_t budget = JSON_MEM_BUDGET(whole);
  pbmem_init(mem, scratch, scratch_len, budget > charged ? budget - charged : 0);
  if (json) {
    int flags = 0;
    m = pbjson_decode_mem(d, (const char *)p, n, &mem->a, &flags, err, sizeof err);
    too_big = (flags & PBJSON_TOO_BIG) != 0 || (!m && mem->over);
    nul = (flags & PBJSON_HAD_NUL) != 0;
  } else {
    m = pbwire_unpack_mem(d, p, n, mem);
    too_big = !m && mem->over;
    if (!m)
      snprintf(err, sizeof err, "invalid protobuf");
    else if (pbjson_check_decoded(m, err, sizeof err) != 0) {
      protobuf_c_message_free_unpacked(m, &mem->a);
      m = NULL;
    } else
      nul = pbwire_has_nul_string(d, p, n);
  }
  if (too_big)
    snprintf(err, sizeof err, "message needs more than %zu bytes of memory to decode", budget);
  free(plain);
  if (!m) {
    snprintf(err2, err2n, "unmarshal into %s: %s", d->name, err);
    if (too_big) malloc_trim(0); /* a refused decode may leave millions of small free blocks */
    *code = too_big ? RPC_RESOURCE_EXHAUSTED : RPC_INVALID_ARGUMENT;
    return NULL;
  }
  *nul_out = nul;
  return m;
}

