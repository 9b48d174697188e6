/* handover — the init protocol's part of an upgrade in place; see
 * init/handover.c and core/handover.h. */
#ifndef CONCH_INIT_HANDOVER_H
#define CONCH_INIT_HANDOVER_H

/* Add the part (agent/parts.c, once, before any handover_load). */
void init_handover_register(void);

#endif
