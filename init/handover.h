/* handover — the init protocol's part of an upgrade in place; see
 * init/handover.c and agent/handover.h. */
#ifndef CONCH_INIT_HANDOVER_H
#define CONCH_INIT_HANDOVER_H

typedef struct Conch__Handover__State Conch__Handover__State;

/* Add the part (agent/main.c, once, before any handover_load). */
void init_handover_register(void);

#endif
