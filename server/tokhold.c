/* tokhold — see tokhold.h. */
#include "server/tokhold.h"

#include "core/daemon.h"
#include "core/log.h"

/* Oldest first: a holder is (re)appended with the current generation, and
 * generations only grow, so the stale ones are a prefix of the list. */
static list_node holders;

void tokhold_drop(tokhold *h) { list_remove(&h->link); }

void tokhold_take(tokhold *h, void (*revoke)(tokhold *h)) {
  tokhold_drop(h);
  h->revoke = revoke;
  h->gen = conch.token_gen;
  list_insert_tail(&holders, &h->link);
}

size_t tokhold_revoke_stale(void) {
  size_t n = 0;
  tokhold *h;
  while ((h = list_first_entry(&holders, tokhold, link)) && h->gen != conch.token_gen) {
    tokhold_drop(h);
    n++;
    h->revoke(h); /* may free h, drop or take others */
  }
  if (n) LOG_INFO("agent token replaced: ending what the previous one opened (%zu streams and connections)", n);
  return n;
}

size_t tokhold_each_out(int (*pred)(const tokhold *h), void (*fn)(tokhold *h)) {
  size_t n = 0;
  for (;;) { /* found anew after each: fn may change the list */
    tokhold *h, *found = NULL;
    list_each(h, &holders, link) if (pred(h)) {
      found = h;
      break;
    }
    if (!found) return n;
    tokhold_drop(found);
    n++;
    fn(found);
  }
}
