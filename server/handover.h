/* handover — the API server's part of an upgrade in place
 * (core/handover.h): its listener and its connections. */
#ifndef CONCH_SERVER_HANDOVER_H
#define CONCH_SERVER_HANDOVER_H

#include "core/handover.h"

/* Registered by the program's top (agent/parts.c); its state is
 * proto/handover.proto's State.api_listeners.
 *   drain    connections stop reading (no new request starts work; queued
 *            answers still go out), the listener stops accepting (its
 *            socket stays open: clients wait in the backlog); undone when
 *            the exec failed
 *   busy     output queued on a connection, for HANDOVER_FLUSH_MS at most
 *   restore  the listeners the state names are served from resume on */
extern const handover_part server_handover_part;

#endif
