/* budget — see budget.h. */
#include "core/budget.h"

#include <uv.h>

#include "core/daemon.h"

#define BUDGET_POLL_MS 10

static list_node fifo; /* oldest first */
static uv_timer_t timer;
static int timer_init;

size_t budget_out_limit(void) { return conch.budget / 2; }

void budget_unwait(budget_waiter *w) {
  if (!budget_waiting(w)) return;
  list_remove(&w->link);
  if (list_empty(&fifo) && timer_init) uv_timer_stop(&timer);
}

static void on_timer(uv_timer_t *t) {
  (void)t;
  size_t q = conch.held;
  budget_waiter *w;
  while ((w = list_first_entry(&fifo, budget_waiter, link)) && q + w->need <= budget_out_limit()) {
    q += w->need;
    budget_unwait(w);
    w->wake(w); /* may free w */
  }
}

void budget_wait(budget_waiter *w, size_t n) {
  w->need = n;
  if (budget_waiting(w)) return; /* keeps its place */
  if (!timer_init) {
    uv_timer_init(conch.loop, &timer);
    uv_unref((uv_handle_t *)&timer);
    timer_init = 1;
  }
  list_insert_tail(&fifo, &w->link);
  if (!uv_is_active((uv_handle_t *)&timer)) uv_timer_start(&timer, on_timer, BUDGET_POLL_MS, BUDGET_POLL_MS);
}

int budget_take(size_t n) {
  if (n && conch.held + n > conch.budget) return -1;
  conch.held += n;
  return 0;
}

void budget_give(size_t n) { conch.held -= n; }

int budget_over(void) { return conch.held > budget_out_limit(); }
