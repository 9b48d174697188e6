/* reflect/service — gRPC server reflection (api.md §9 "HTTP and protocol
 * extras"): grpc.reflection.v1.ServerReflection and
 * grpc.reflection.v1alpha.ServerReflection, method ServerReflectionInfo
 * (bidi streaming), answered from the FileDescriptorSet of agent.proto and
 * the two reflection protos embedded at build time (Makefile:
 * build/<variant>/gen/proto/descriptors.c).
 *
 *   reflect_service_methods(&n)  the two rpc_method entries for the router;
 *                                NULL (n = 0) when the embedded set does not
 *                                load (a build fault).
 *
 * Per request on a stream, in order, one response: list_services (every
 * service in the set that the daemon routes: rpc_service_served),
 * file_by_filename, file_containing_symbol (messages,
 * nested ones, fields, oneofs, enums and their values, services, methods,
 * extensions), file_containing_extension, all_extension_numbers_of_type; an
 * unknown name gets error_response 5 (NOT_FOUND) and the stream goes on.  A
 * file answer is the file, then those of its transitive imports not yet
 * sent on this stream.  A request with no kind set ends the stream
 * invalid_argument.  The stream ends OK when the client half-closes.  Reads
 * stop while more than RPC_OUTQ_HIGH of answers wait for the client.
 */
#ifndef CONCH_REFLECT_SERVICE_H
#define CONCH_REFLECT_SERVICE_H

#include <stddef.h>

#include "server/rpc.h"

const rpc_method *reflect_service_methods(size_t *n);

#endif
