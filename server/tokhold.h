/* tokhold — what authenticated with the agent token, held for as long as
 * it lives (api.md §4: "A token is checked for the whole life of what it
 * opened, not only when a request starts").
 *
 * Every holder records the token generation it authenticated with
 * (conch.token_gen, bumped by daemon_set_token when the token changes) and
 * sits in one list, oldest first.  When the token is replaced,
 * tokhold_revoke_stale() takes every holder of an older generation out of
 * the list and calls its `revoke`: connect.c ends a streaming call with
 * `unauthenticated` "agent token was replaced", conn.c has the protocol
 * close a keep-alive connection once its current exchanges ended.  Unary
 * calls hold nothing: they finish.
 *
 * Loop thread only.  A holder is embedded in its owner (no allocation);
 * the owner drops it before it is freed.
 */
#ifndef CONCH_TOKHOLD_H
#define CONCH_TOKHOLD_H

#include <stddef.h>

#include "core/list.h"

typedef struct tokhold tokhold;
struct tokhold {
  list_node link;         /* in the list (zero: not held) */
  unsigned long long gen; /* conch.token_gen it authenticated with */
  /* the token it authenticated with was replaced (it is out of the list) */
  void (*revoke)(tokhold *h);
};

/* h authenticated now, with the current token: (re)recorded with the
 * current generation, at the list's tail. */
void tokhold_take(tokhold *h, void (*revoke)(tokhold *h));

/* Out of the list (a no-op when not in it). */
void tokhold_drop(tokhold *h);

/* The token was replaced: revoke every holder of an older generation, in
 * the order they authenticated.  A revoke may drop or take other holders
 * (they are found anew after each).  Returns how many were revoked. */
size_t tokhold_revoke_stale(void);
/* Every holder for which pred says 1, out of the list and handed to fn
 * (which may free it, drop or take others), in the order they
 * authenticated; how many. */
size_t tokhold_each_out(int (*pred)(const tokhold *h), void (*fn)(tokhold *h));

#endif
