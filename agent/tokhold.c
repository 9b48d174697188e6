/* tokhold — see tokhold.h. */
#include "agent/tokhold.h"

#include "agent/daemon.h"
#include "agent/log.h"

/* Oldest first: a holder is (re)appended with the current generation, and
 * generations only grow, so the stale ones are a prefix of the list. */
static tokhold *head, *tail;

void tokhold_drop(tokhold *h) {
  if (!h->held) return;
  h->held = 0;
  if (h->prev) h->prev->next = h->next; else head = h->next;
  if (h->next) h->next->prev = h->prev; else tail = h->prev;
  h->next = h->prev = NULL;
}

void tokhold_take(tokhold *h, void (*revoke)(tokhold *h)) {
  tokhold_drop(h);
  h->revoke = revoke;
  h->gen = conch.token_gen;
  h->held = 1;
  h->prev = tail;
  h->next = NULL;
  if (tail) tail->next = h; else head = h;
  tail = h;
}

size_t tokhold_revoke_stale(void) {
  size_t n = 0;
  while (head && head->gen != conch.token_gen) {
    tokhold *h = head;
    tokhold_drop(h);
    n++;
    h->revoke(h); /* may free h, drop or take others */
  }
  if (n) LOG_INFO("agent token replaced: ending what the previous one opened (%zu streams and connections)", n);
  return n;
}
