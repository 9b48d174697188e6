/* parts — this program's upgrade in place: the state's schema
 * (proto/handover.proto) and its parts, on core/handover.h's framework
 * (docs/internals/upgrade.md). */
#ifndef CONCH_AGENT_PARTS_H
#define CONCH_AGENT_PARTS_H

/* The state format this program writes; it reads HANDOVER_FORMAT_MIN up to
 * HANDOVER_FORMAT (a change of proto/handover.proto a reader must not miss
 * bumps HANDOVER_FORMAT: docs/guide/upgrade.md). */
#define HANDOVER_FORMAT 2 /* 2: forwarders and relayed connections (net) */
#define HANDOVER_FORMAT_MIN 1

/* Once, at start: the schema, the argument vector the next program gets,
 * and the parts in their order: the daemon's settings (token, sandbox
 * identity and environment, default user, log), the API server
 * (server/handover.h), the process table, the ports, the init protocol. */
void agent_handover_setup(int argc, char **argv);

#endif
