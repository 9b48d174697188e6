/* list — the one intrusive doubly-linked list (circular, with a sentinel).
 *
 * An object that goes in a list embeds a list_node (one per list it can be
 * in at the same time); the list itself is a list_node too, the head.
 * list_entry() gets the object back from its node.
 *
 * Contract:
 * - Zero is the only unlinked state of a node and the only empty state of a
 *   head: a calloc'd or memset object needs no init, list_remove() puts a
 *   node back to zero, and removing the last node of a list zeroes its head
 *   again (so an empty head may be copied or zeroed; a non-empty one must
 *   not move, its nodes point at it).
 * - list_remove(n) is O(1), needs no head and is a no-op on an unlinked
 *   node: "in the list" flags go, list_linked(n) says it.
 * - Inserting needs a node not in any list (its old contents are ignored,
 *   so a malloc'd node may be inserted as it is).
 * - list_first / list_last / list_next / list_prev give NULL at the ends.
 * - list_each(it, h, member) walks from first to last, it a pointer to the
 *   containing type, declared by the caller; the body must not remove it.
 *   list_each_safe(it, nx, h, member) lets the body remove it (nx, of the
 *   same type, is the next one, taken before the body: the body must not
 *   remove or free that one).  list_each_rev walks from last to first.
 *   h is evaluated more than once.
 * No locking: the owner of a list keeps it on one thread or under a lock.
 * Header only, no state: a leaf every layer may include.
 */
#ifndef CONCH_LIST_H
#define CONCH_LIST_H

#include <stddef.h>

typedef struct list_node {
  struct list_node *next, *prev;
} list_node;

/* An empty head (or an unlinked node): zero, as static or calloc'd ones are. */
static inline void list_init(list_node *h) { h->next = h->prev = NULL; }

static inline int list_empty(const list_node *h) { return h->next == NULL; }

/* n is in a list (for a node, not a head). */
static inline int list_linked(const list_node *n) { return n->next != NULL; }

static inline void list_link_(list_node *prev, list_node *n, list_node *next) {
  n->prev = prev;
  n->next = next;
  prev->next = n;
  next->prev = n;
}

/* The head's sentinel ring, made on the first insert into a zero head. */
static inline void list_ring_(list_node *h) {
  if (!h->next) h->next = h->prev = h;
}

static inline void list_insert_tail(list_node *h, list_node *n) {
  list_ring_(h);
  list_link_(h->prev, n, h);
}

static inline void list_insert_head(list_node *h, list_node *n) {
  list_ring_(h);
  list_link_(h, n, h->next);
}

/* Out of its list; a no-op when it is in none. */
static inline void list_remove(list_node *n) {
  if (!n->next) return;
  if (n->next == n->prev) { /* the only node: its neighbour both ways is the head */
    list_node *h = n->next;
    h->next = h->prev = NULL;
  } else {
    n->prev->next = n->next;
    n->next->prev = n->prev;
  }
  n->next = n->prev = NULL;
}

/* Every node of src to the end of dst, in order; src is left empty. */
static inline void list_splice_tail(list_node *dst, list_node *src) {
  if (!src->next) return;
  list_ring_(dst);
  list_node *first = src->next, *last = src->prev;
  first->prev = dst->prev;
  dst->prev->next = first;
  last->next = dst;
  dst->prev = last;
  src->next = src->prev = NULL;
}

static inline list_node *list_first(const list_node *h) { return h->next; }
static inline list_node *list_last(const list_node *h) { return h->prev; }
static inline list_node *list_next(const list_node *h, const list_node *n) {
  return n->next == h ? NULL : n->next;
}
static inline list_node *list_prev(const list_node *h, const list_node *n) {
  return n->prev == h ? NULL : n->prev;
}

#define list_entry(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))

/* The object of node n, NULL for NULL. */
static inline void *list_obj_(const list_node *n, size_t off) { return n ? (char *)n - off : NULL; }
#define list_first_entry(h, type, member) ((type *)list_obj_(list_first(h), offsetof(type, member)))
#define list_last_entry(h, type, member) ((type *)list_obj_(list_last(h), offsetof(type, member)))

#define list_obj_of_(it, n, member) ((__typeof__(it))list_obj_((n), offsetof(__typeof__(*(it)), member)))

#define list_each(it, h, member)                                   \
  for ((it) = list_obj_of_(it, list_first(h), member); (it);       \
       (it) = list_obj_of_(it, list_next((h), &(it)->member), member))

#define list_each_rev(it, h, member)                               \
  for ((it) = list_obj_of_(it, list_last(h), member); (it);        \
       (it) = list_obj_of_(it, list_prev((h), &(it)->member), member))

#define list_each_safe(it, nx, h, member)                                                        \
  for ((it) = list_obj_of_(it, list_first(h), member),                                           \
      (nx) = (it) ? list_obj_of_(it, list_next((h), &(it)->member), member) : NULL;              \
       (it); (it) = (nx), (nx) = (it) ? list_obj_of_(it, list_next((h), &(it)->member), member) : NULL)

#endif
