/* plist — ProcessService/List (api.md §6, §9); see plist.c.  Above the
 * record (proc.h, process.c), beside service.c, which routes the call
 * here. */
#ifndef CONCH_PROC_PLIST_H
#define CONCH_PROC_PLIST_H

#include "server/rpc.h"

void proc_list_on_request(rpc_call *c, const ProtobufCMessage *m);
void proc_list_cancel(rpc_call *c, rpc_code why);

#endif
