/* budget — the daemon-wide budget of bytes held for clients (daemon.h:
 * conch.held, conch.budget) and the FIFO of producers waiting for room in
 * it.
 *
 * Producers that can wait stop once everything held for clients is past
 * half the budget: the other half stays for requests and for answers that
 * cannot wait.  They wait in one FIFO; a 10 ms timer runs while it is not
 * empty and wakes them in order, as many as fit (the bytes they free come
 * from writes on any connection, which know nothing of the waiters).
 */
#ifndef CONCH_BUDGET_H
#define CONCH_BUDGET_H

#include <stddef.h>

#include "core/list.h"

typedef struct budget_waiter budget_waiter;
struct budget_waiter {
  list_node link; /* in the FIFO (zero: not waiting) */
  size_t need;
  /* its turn: about `need` bytes fit now (it is out of the FIFO) */
  void (*wake)(budget_waiter *w);
};

/* What waiting producers may fill: half the budget. */
size_t budget_out_limit(void);

/* Wait for n bytes of room; a waiter already in the FIFO keeps its place
 * (with the new need). */
void budget_wait(budget_waiter *w, size_t n);

/* Leave the FIFO (a no-op when not in it). */
void budget_unwait(budget_waiter *w);

/* Input held for a client that cannot wait (bytes queued for a process)
 * takes its part of the budget with budget_take: 0, or -1 when it would pass
 * the budget (fail the call RPC_RESOURCE_EXHAUSTED); budget_give returns it. */
int budget_take(size_t n);
void budget_give(size_t n);
/* 1 while the budget is past the half where rpc_out_room says no: a
 * producer that sends without asking room first (process output) asks it
 * then, and a lossy one drops. */
int budget_over(void);

/* 1 while w is in the FIFO. */
static inline int budget_waiting(const budget_waiter *w) { return list_linked(&w->link); }

#endif
