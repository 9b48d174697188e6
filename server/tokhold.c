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
