/* The message types the fuzzers decode: every request and every message
 * they contain. */
#ifndef CONCH_FUZZ_MSGS_H
#define CONCH_FUZZ_MSGS_H

#include "proto/agent.pb-c.h"

static const ProtobufCMessageDescriptor *const fuzz_msgs[] = {
    &pb__start_process_request__descriptor, &pb__connect_process_request__descriptor,
    &pb__list_processes_request__descriptor, &pb__send_signal_request__descriptor,
    &pb__file_chunk__descriptor,            &pb__get_file_request__descriptor,
    &pb__list_files_request__descriptor,    &pb__search_files_request__descriptor,
    &pb__process_event__descriptor,         &pb__list_files_response__descriptor,
    &pb__list_processes_response__descriptor,
};
#define FUZZ_NMSGS (sizeof fuzz_msgs / sizeof fuzz_msgs[0])

#endif
