/* reflect/service — see service.h. */
#include "reflect/service.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/reflection.pb-c.h"
#include "reflect/descdb.h"

/* build/<variant>/gen/proto/descriptors.c */
extern const unsigned char reflect_descriptor_set[];
extern const size_t reflect_descriptor_set_len;

typedef Grpc__Reflection__V1__ServerReflectionRequest Req;
typedef Grpc__Reflection__V1__ServerReflectionResponse Resp;

static descdb db; /* loaded once, before the first call; read-only after */

typedef struct stream {
  unsigned char *sent; /* per file of db: already sent on this stream */
} stream;

static void stream_free(rpc_call *c) {
  stream *s = rpc_user(c);
  if (!s) return;
  free(s->sent);
  free(s);
  rpc_set_user(c, NULL);
}

/* A request is read only once the transport has room for its answer
 * (rpc_out_room), which echoes the request itself (original_request: up to
 * 16 MiB): the answer held behind a peer's shut window is one per
 * connection at a time, and within the daemon-wide budget, not one per
 * stream.  1 MiB asks for the connection's output to be about empty. */
#define REFLECT_ROOM (1u << 20)

static void want_room(rpc_call *c);
static void on_room(rpc_call *c) { want_room(c); }

static void want_room(rpc_call *c) {
  rpc_pause_input(c, !rpc_out_room(c, REFLECT_ROOM, on_room));
}

static void on_open(rpc_call *c, const ProtobufCMessage *req) {
  (void)req;
  stream *s = calloc(1, sizeof *s);
  if (s) s->sent = calloc(db.nfiles ? db.nfiles : 1, 1);
  if (!s || !s->sent) {
    free(s);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  rpc_set_user(c, s);
  want_room(c);
}

/* The file, then its transitive imports not yet sent on this stream, into
 * out (room for db.nfiles); how many. */
static size_t file_closure(stream *s, int file, ProtobufCBinaryData *out) {
  size_t n = 0;
  int *todo = malloc(db.nfiles * sizeof *todo);
  if (!todo) return 0;
  unsigned char *seen = calloc(db.nfiles, 1);
  if (!seen) {
    free(todo);
    return 0;
  }
  size_t top = 0;
  todo[top++] = file;
  seen[file] = 1;
  while (top) {
    int f = todo[--top];
    /* the requested file always, its imports once per stream */
    if (f == file || !s->sent[f]) {
      out[n++] = (ProtobufCBinaryData){db.files[f].len, (uint8_t *)db.files[f].data};
      s->sent[f] = 1;
    }
    for (size_t i = 0; i < db.files[f].ndeps; i++) {
      int d = db.files[f].deps[i];
      if (!seen[d]) {
        seen[d] = 1;
        todo[top++] = d;
      }
    }
  }
  free(seen);
  free(todo);
  return n;
}

static void on_message(rpc_call *c, const ProtobufCMessage *msg) {
  const Req *req = (const Req *)msg;
  stream *s = rpc_user(c);
  Resp resp = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
  Grpc__Reflection__V1__FileDescriptorResponse files = GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
  Grpc__Reflection__V1__ExtensionNumberResponse exts = GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
  Grpc__Reflection__V1__ListServiceResponse list = GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
  Grpc__Reflection__V1__ErrorResponse err = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
  ProtobufCBinaryData *blobs = NULL;
  Grpc__Reflection__V1__ServiceResponse *svcs = NULL, **svcp = NULL;
  int32_t *nums = NULL;
  char emsg[320];
  int file = -1, oom = 0;
  const char *what = NULL, *name = NULL;

  resp.valid_host = req->host;
  resp.original_request = (Req *)req;
  switch (req->message_request_case) {
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
      name = req->file_by_filename;
      file = descdb_file_by_name(&db, name);
      what = "file";
      break;
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL: {
      name = req->file_containing_symbol;
      const descdb_sym *sym = descdb_symbol(&db, name);
      file = sym ? sym->file : -1;
      what = "symbol";
      break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION: {
      const Grpc__Reflection__V1__ExtensionRequest *e = req->file_containing_extension;
      file = e ? descdb_file_by_extension(&db, e->containing_type, e->extension_number) : -1;
      if (file < 0)
        snprintf(emsg, sizeof emsg, "extension not found: %.200s %d", e ? e->containing_type : "",
                 e ? (int)e->extension_number : 0);
      break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE: {
      name = req->all_extension_numbers_of_type;
      long n = descdb_extension_numbers(&db, name, NULL, 0);
      if (n < 0) {
        snprintf(emsg, sizeof emsg, "type not found: %.200s", name);
        break;
      }
      nums = malloc(((size_t)n + 1) * sizeof *nums);
      if (!nums) {
        oom = 1;
        break;
      }
      exts.n_extension_number = (size_t)descdb_extension_numbers(&db, name, nums, (size_t)n);
      exts.extension_number = nums;
      exts.base_type_name = (char *)name;
      resp.message_response_case =
          GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
      resp.all_extension_numbers_response = &exts;
      break;
    }
    case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES: {
      /* the services in the set that the daemon routes (a degraded PID 1
       * serves no ProcessService; the reflection ones always are) */
      size_t n = 0;
      for (size_t i = 0; i < db.nsyms; i++)
        n += db.syms[i].kind == DESCDB_SERVICE && rpc_service_served(db.syms[i].name);
      svcs = calloc(n + 1, sizeof *svcs);
      svcp = calloc(n + 1, sizeof *svcp);
      if (!svcs || !svcp) {
        oom = 1;
        break;
      }
      for (size_t i = 0, j = 0; i < db.nsyms; i++) {
        if (db.syms[i].kind != DESCDB_SERVICE || !rpc_service_served(db.syms[i].name)) continue;
        svcs[j] = (Grpc__Reflection__V1__ServiceResponse)GRPC__REFLECTION__V1__SERVICE_RESPONSE__INIT;
        svcs[j].name = db.syms[i].name;
        svcp[j] = &svcs[j];
        j++;
      }
      list.n_service = n;
      list.service = svcp;
      resp.message_response_case =
          GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
      resp.list_services_response = &list;
      break;
    }
    default:
      stream_free(c);
      rpc_finish(c, RPC_INVALID_ARGUMENT, "invalid MessageRequest: no request kind set");
      return;
  }
  if (!oom && file >= 0) {
    blobs = malloc(db.nfiles * sizeof *blobs);
    if (!blobs) {
      oom = 1;
    } else {
      files.n_file_descriptor_proto = file_closure(s, file, blobs);
      files.file_descriptor_proto = blobs;
      oom = files.n_file_descriptor_proto == 0;
      resp.message_response_case =
          GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
      resp.file_descriptor_response = &files;
    }
  } else if (!oom && resp.message_response_case ==
                         GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE__NOT_SET) {
    if (what) snprintf(emsg, sizeof emsg, "%s not found: %.200s", what, name);
    err.error_code = RPC_NOT_FOUND;
    err.error_message = emsg;
    resp.message_response_case = GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
    resp.error_response = &err;
  }
  int sent = oom ? -1 : rpc_send(c, &resp.base);
  free(blobs);
  free(svcs);
  free(svcp);
  free(nums);
  if (sent != 0) {
    stream_free(c);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  /* a client that sends requests without reading the answers stops being read */
  want_room(c);
}

static void on_input_end(rpc_call *c) {
  stream_free(c);
  rpc_finish(c, RPC_OK, NULL);
}

static void on_cancel(rpc_call *c, rpc_code why) {
  (void)why;
  stream_free(c);
}

#define REFLECT_METHOD(pkg)                                                   \
  {                                                                           \
    .path = "/grpc.reflection." pkg ".ServerReflection/ServerReflectionInfo", \
    .kind = RPC_BIDI_STREAM,                                                  \
    .input = &grpc__reflection__v1__server_reflection_request__descriptor,    \
    .output = &grpc__reflection__v1__server_reflection_response__descriptor,  \
    .on_request = on_open, .on_message = on_message,                          \
    .on_input_end = on_input_end, .on_cancel = on_cancel,                     \
  }

/* v1alpha's messages are v1's under another package: the same wire and JSON
 * forms, so one codec serves both routes. */
static const rpc_method reflect_methods[] = {REFLECT_METHOD("v1"), REFLECT_METHOD("v1alpha")};

const rpc_method *reflect_service_methods(size_t *n) {
  if (!db.nfiles && descdb_load(&db, reflect_descriptor_set, reflect_descriptor_set_len) != 0) {
    *n = 0;
    return NULL;
  }
  *n = sizeof reflect_methods / sizeof *reflect_methods;
  return reflect_methods;
}
