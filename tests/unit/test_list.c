/* test_list — core/list.h: insertion order at both ends, removal from
 * anywhere and twice, zero heads and nodes, the walks (forward, backward,
 * removing as they go), splicing, and an object in two lists at once. */
#include <stdlib.h>
#include <string.h>

#include "core/list.h"
#include "tests/unit/test.h"

typedef struct item {
  int v;
  list_node a; /* not first: list_entry must subtract the offset */
  list_node b;
} item;

/* The values of h front to back into out ("" when empty), and checks
 * that the walk back gives the same. */
static void order(list_node *h, char *out) {
  char back[64];
  size_t n = 0, m = 0;
  item *it;
  list_each(it, h, a) out[n++] = (char)('0' + it->v);
  out[n] = 0;
  list_each_rev(it, h, a) back[m++] = (char)('0' + it->v);
  back[m] = 0;
  if (m != n) TEST_FAIL_("forward %zu items, backward %zu", n, m);
  for (size_t i = 0; i < n; i++)
    if (back[i] != out[n - 1 - i]) TEST_FAIL_("backward walk \"%s\" is not \"%s\" reversed", back, out);
}

TEST(zero_is_empty_and_unlinked) {
  list_node h;
  memset(&h, 0, sizeof h);
  item x = {0};
  ASSERT(list_empty(&h));
  ASSERT(!list_linked(&x.a));
  ASSERT(list_first(&h) == NULL);
  ASSERT(list_last(&h) == NULL);
  ASSERT(list_first_entry(&h, item, a) == NULL);
  char s[16];
  order(&h, s);
  ASSERT_STR_EQ(s, "");
  list_remove(&x.a); /* not in a list: nothing happens */
  ASSERT(!list_linked(&x.a));
  static list_node st; /* a static head needs no init either */
  list_insert_tail(&st, &x.a);
  ASSERT(list_first_entry(&st, item, a) == &x);
  list_remove(&x.a);
  ASSERT(list_empty(&st));
}

TEST(insert_order) {
  list_node h = {0};
  item x[5];
  for (int i = 0; i < 5; i++) x[i].v = i;
  char s[16];
  list_insert_tail(&h, &x[1].a);
  list_insert_tail(&h, &x[2].a);
  list_insert_head(&h, &x[0].a);
  list_insert_tail(&h, &x[3].a);
  order(&h, s);
  ASSERT_STR_EQ(s, "0123");
  ASSERT(list_first_entry(&h, item, a) == &x[0]);
  ASSERT(list_last_entry(&h, item, a) == &x[3]);
  ASSERT(list_next(&h, &x[3].a) == NULL);
  ASSERT(list_prev(&h, &x[0].a) == NULL);
  ASSERT(list_next(&h, &x[1].a) == &x[2].a);
  ASSERT(list_prev(&h, &x[1].a) == &x[0].a);
  ASSERT(list_entry(list_next(&h, &x[0].a), item, a) == &x[1]);
  list_init(&h); /* (the nodes still point at it: only for a test) */
  ASSERT(list_empty(&h));
  list_insert_head(&h, &x[4].a);
  list_insert_head(&h, &x[3].a);
  order(&h, s);
  ASSERT_STR_EQ(s, "34");
}

TEST(remove_anywhere_and_twice) {
  list_node h = {0};
  item x[4];
  char s[16];
  for (int i = 0; i < 4; i++) {
    x[i].v = i;
    list_insert_tail(&h, &x[i].a);
    ASSERT(list_linked(&x[i].a));
  }
  list_remove(&x[1].a); /* middle */
  ASSERT(!list_linked(&x[1].a));
  order(&h, s);
  ASSERT_STR_EQ(s, "023");
  list_remove(&x[1].a); /* again: a no-op, the list untouched */
  order(&h, s);
  ASSERT_STR_EQ(s, "023");
  list_remove(&x[0].a); /* first */
  list_remove(&x[3].a); /* last */
  order(&h, s);
  ASSERT_STR_EQ(s, "2");
  list_remove(&x[2].a); /* the only one: the head is zero again */
  ASSERT(list_empty(&h));
  ASSERT(h.next == NULL && h.prev == NULL);
  list_remove(&x[2].a);
  ASSERT(list_empty(&h));
  list_insert_tail(&h, &x[1].a); /* a removed node goes in again */
  order(&h, s);
  ASSERT_STR_EQ(s, "1");
}

TEST(safe_walk_removes) {
  list_node h = {0};
  item x[6], *it, *nx;
  char s[16];
  for (int i = 0; i < 6; i++) {
    x[i].v = i;
    list_insert_tail(&h, &x[i].a);
  }
  int seen = 0;
  list_each_safe(it, nx, &h, a) {
    seen++;
    if (it->v % 2 == 0) list_remove(&it->a);
  }
  ASSERT_EQ(seen, 6);
  order(&h, s);
  ASSERT_STR_EQ(s, "135");
  seen = 0;
  list_each_safe(it, nx, &h, a) { /* every one, down to empty */
    seen++;
    list_remove(&it->a);
  }
  ASSERT_EQ(seen, 3);
  ASSERT(list_empty(&h));
  seen = 0;
  list_each_safe(it, nx, &h, a) seen++;
  ASSERT_EQ(seen, 0);
}

/* The body of a plain walk does not remove; one that does ends the walk
 * there (a removed node has no next) rather than running off. */
TEST(plain_walk_stops_at_a_removed_node) {
  list_node h = {0};
  item x[3], *it;
  for (int i = 0; i < 3; i++) {
    x[i].v = i;
    list_insert_tail(&h, &x[i].a);
  }
  int seen = 0;
  list_each(it, &h, a) {
    seen++;
    if (it->v == 1) list_remove(&it->a);
  }
  ASSERT_EQ(seen, 2);
}

TEST(splice) {
  list_node d = {0}, s = {0};
  item x[5];
  char o[16];
  for (int i = 0; i < 5; i++) x[i].v = i;
  list_splice_tail(&d, &s); /* empty into empty */
  ASSERT(list_empty(&d) && list_empty(&s));
  list_insert_tail(&s, &x[0].a);
  list_insert_tail(&s, &x[1].a);
  list_splice_tail(&d, &s); /* into an empty one */
  ASSERT(list_empty(&s));
  order(&d, o);
  ASSERT_STR_EQ(o, "01");
  list_insert_tail(&s, &x[2].a);
  list_insert_tail(&s, &x[3].a);
  list_insert_tail(&s, &x[4].a);
  list_splice_tail(&d, &s); /* behind what is there */
  ASSERT(list_empty(&s));
  order(&d, o);
  ASSERT_STR_EQ(o, "01234");
  list_splice_tail(&d, &s); /* nothing to move */
  order(&d, o);
  ASSERT_STR_EQ(o, "01234");
  list_remove(&x[4].a);
  list_remove(&x[0].a);
  order(&d, o);
  ASSERT_STR_EQ(o, "123");
}

TEST(two_lists_at_once) {
  list_node ha = {0}, hb = {0};
  item x[3], *it;
  for (int i = 0; i < 3; i++) {
    x[i].v = i;
    list_insert_tail(&ha, &x[i].a);
    list_insert_head(&hb, &x[i].b);
  }
  char s[8];
  size_t n = 0;
  list_each(it, &hb, b) s[n++] = (char)('0' + it->v);
  s[n] = 0;
  ASSERT_STR_EQ(s, "210");
  list_remove(&x[1].b);
  ASSERT(list_linked(&x[1].a));
  order(&ha, s);
  ASSERT_STR_EQ(s, "012");
}

/* A malloc'd node goes in as it is (its garbage is not read). */
TEST(uninitialised_node_inserts) {
  list_node h = {0};
  item *x = malloc(sizeof *x);
  ASSERT(x != NULL);
  memset(x, 0xa5, sizeof *x);
  x->v = 7;
  list_insert_tail(&h, &x->a);
  ASSERT(list_first_entry(&h, item, a) == x);
  list_remove(&x->a);
  ASSERT(list_empty(&h));
  ASSERT(!list_linked(&x->a));
  free(x);
}

int main(void) {
  RUN(zero_is_empty_and_unlinked);
  RUN(insert_order);
  RUN(remove_anywhere_and_twice);
  RUN(safe_walk_removes);
  RUN(plain_walk_stops_at_a_removed_node);
  RUN(splice);
  RUN(two_lists_at_once);
  RUN(uninitialised_node_inserts);
  return test_summary();
}
