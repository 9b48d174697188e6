/* test_users — the pure parts of server/users.c: the header's three forms
 * and what is malformed, the passwd and group tables (malformed lines
 * skipped, NIS lines, missing files), resolution by name, uid and uid:gid
 * (supplementary groups, no entry), and a thread's fs identity switched
 * and restored (root only: setfsuid). */
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <unistd.h>

#include "server/users.h"
#include "tests/unit/test.h"

TEST(spec_forms) {
  users_spec sp;
  ASSERT_EQ(users_spec_parse("alice", &sp), 0);
  ASSERT_EQ(sp.form, USERS_NAME);
  ASSERT_EQ(users_spec_parse("1000", &sp), 0);
  ASSERT_EQ(sp.form, USERS_UID);
  ASSERT_EQ(sp.uid, 1000);
  ASSERT_EQ(users_spec_parse("1000:50", &sp), 0);
  ASSERT_EQ(sp.form, USERS_UIDGID);
  ASSERT_EQ(sp.uid, 1000);
  ASSERT_EQ(sp.gid, 50);
  ASSERT_EQ(users_spec_parse("0", &sp), 0);
  ASSERT_EQ(users_spec_parse("4294967294", &sp), 0);
  ASSERT_EQ(sp.uid, 4294967294u);
  ASSERT_EQ(users_spec_parse("user.name-1_x$", &sp), 0);
  ASSERT_EQ(sp.form, USERS_NAME);
  static const char *const bad[] = {"", "a b", "1:", ":1", "1:2:3", "-1", "-x", "4294967295",
                                    "99999999999", "x/y", "a,b", "a\tb", "a\x7f", "1:x", "x:1"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (users_spec_parse(bad[i], &sp) == 0) TEST_FAIL_("accepted \"%s\"", bad[i]);
  char longname[USERS_MAX_SPEC + 8];
  memset(longname, 'a', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  ASSERT_EQ(users_spec_parse(longname, &sp), -1);
}

static const char PW[] =
    "root:x:0:0:root:/root:/bin/bash\n"
    "# a comment line is malformed: skipped\n"
    "bad:x:notanumber:0::/:/bin/sh\n"
    "short:x:1\n"
    "+nis::::::\n"
    "alice:x:1000:1000:Alice:/home/alice:/bin/sh\n"
    "nohome:x:1001:1001:::/bin/sh\n"
    "dup:x:1000:7::/dup:/bin/sh\n"
    "last:x:1002:1002::/home/last:/bin/sh"; /* no newline at the end */

static const char GR[] =
    "root:x:0:\n"
    "alice:x:1000:\n"
    "staff:x:50:alice,nohome\n"
    "audio:x:29:bob,alice\n"
    "again:x:50:alice\n" /* the same gid twice: once in the list */
    "broken:x:\n"
    "video:x:44:\n";

static rpc_ident *res(const users_tab *t, const char *text, int *unknown, int *miss) {
  users_spec sp;
  if (users_spec_parse(text, &sp) != 0) return NULL;
  return users_tab_resolve(t, &sp, unknown, miss);
}

static int has_group(const rpc_ident *id, uint32_t g) {
  for (size_t i = 0; i < id->ngroups; i++)
    if (id->groups[i] == g) return 1;
  return 0;
}

TEST(tables_and_resolution) {
  users_tab *t = users_tab_new(PW, sizeof PW - 1, GR, sizeof GR - 1);
  ASSERT(t != NULL);
  int unknown, miss;
  rpc_ident *id = res(t, "alice", &unknown, &miss);
  ASSERT(id != NULL);
  ASSERT_EQ(id->uid, 1000);
  ASSERT_EQ(id->gid, 1000);
  ASSERT_STR_EQ(id->name, "alice");
  ASSERT_STR_EQ(id->home, "/home/alice");
  ASSERT_EQ(id->ngroups, 2);
  ASSERT(has_group(id, 50) && has_group(id, 29));
  ASSERT(id->has_entry && !id->implicit && !miss);
  rpc_ident_release(id);

  id = res(t, "1000", &unknown, &miss); /* the first entry of the uid */
  ASSERT_STR_EQ(id->name, "alice");
  ASSERT_EQ(id->ngroups, 2);
  rpc_ident_release(id);

  id = res(t, "1000:44", &unknown, &miss); /* as given: no supplementary groups */
  ASSERT_EQ(id->uid, 1000);
  ASSERT_EQ(id->gid, 44);
  ASSERT_EQ(id->ngroups, 0);
  ASSERT_STR_EQ(id->name, "alice");
  ASSERT_STR_EQ(id->home, "/home/alice");
  rpc_ident_release(id);

  id = res(t, "nohome", &unknown, &miss); /* an empty home field: "/" */
  ASSERT_STR_EQ(id->home, "/");
  ASSERT_EQ(id->ngroups, 1);
  rpc_ident_release(id);

  id = res(t, "last", &unknown, &miss); /* the last line, without a newline */
  ASSERT(id != NULL);
  ASSERT_STR_EQ(id->home, "/home/last");
  rpc_ident_release(id);

  id = res(t, "4242", &unknown, &miss); /* no entry: gid = uid, home / */
  ASSERT(id != NULL && miss && !unknown);
  ASSERT_EQ(id->gid, 4242);
  ASSERT_STR_EQ(id->name, "4242");
  ASSERT_STR_EQ(id->home, "/");
  ASSERT(!id->has_entry);
  rpc_ident_release(id);

  ASSERT(res(t, "bad", &unknown, &miss) == NULL && unknown);
  ASSERT(res(t, "short", &unknown, &miss) == NULL && unknown);
  ASSERT(res(t, "+nis", &unknown, &miss) == NULL && unknown);
  ASSERT(res(t, "bob", &unknown, &miss) == NULL && unknown); /* only in a group list */
  users_tab_free(t);

  /* missing files: an empty table */
  t = users_tab_new(NULL, 0, NULL, 0);
  ASSERT(t != NULL);
  ASSERT(res(t, "root", &unknown, &miss) == NULL && unknown);
  id = res(t, "0", &unknown, &miss);
  ASSERT(id && miss && id->uid == 0);
  rpc_ident_release(id);
  users_tab_free(t);
}

TEST(holds) {
  ASSERT(rpc_ident_hold(&users_root) == &users_root); /* static: never freed */
  rpc_ident_release(&users_root);
  ASSERT(users_root.implicit && users_root.uid == 0);
  users_tab *t = users_tab_new(PW, sizeof PW - 1, GR, sizeof GR - 1);
  int unknown, miss;
  rpc_ident *id = res(t, "alice", &unknown, &miss);
  users_tab_free(t); /* the identity is a copy: it outlives the table */
  const rpc_ident *h = rpc_ident_hold(id);
  ASSERT_EQ(id->refs, 2);
  rpc_ident_release(h);
  ASSERT_STR_EQ(id->home, "/home/alice");
  rpc_ident_release(id); /* freed (ASan: no leak) */
  rpc_ident_release(NULL);
}

TEST(thread_identity_switched_and_restored) {
  if (geteuid() != 0) TEST_FAIL_("needs root (make unit runs as root)");
  users_tab *t = users_tab_new(PW, sizeof PW - 1, GR, sizeof GR - 1);
  int unknown, miss;
  rpc_ident *id = res(t, "alice", &unknown, &miss);
  gid_t before[64];
  int nb = getgroups(64, before);
  ASSERT_EQ(rpc_fs_become(id), 0);
  ASSERT_EQ(setfsuid((uid_t)-1), 1000);
  ASSERT_EQ(setfsgid((gid_t)-1), 1000);
  gid_t g[8];
  ASSERT_EQ(getgroups(8, g), 2);
  ASSERT_EQ(geteuid(), 0); /* only the fs identity: the thread stays root otherwise */
  rpc_fs_restore();
  ASSERT_EQ(setfsuid((uid_t)-1), 0);
  ASSERT_EQ(setfsgid((gid_t)-1), 0);
  gid_t after[64];
  ASSERT_EQ(getgroups(64, after), nb);
  ASSERT_MEM_EQ(after, before, (size_t)nb * sizeof *before);
  ASSERT_EQ(rpc_fs_become(&users_root), 0); /* root: nothing to do */
  ASSERT_EQ(setfsuid((uid_t)-1), 0);
  rpc_ident_release(id);
  users_tab_free(t);
}

TEST(many_groups_each_once) {
  /* 20 000 groups listing alice, each gid twice and in no order: each
   * once, sorted (the loop's cost stays n log n whatever the file holds) */
  size_t n = 20000, cap = n * 2 * 40 + 64;
  char *g = malloc(cap);
  size_t len = 0;
  for (size_t i = 0; i < 2 * n; i++)
    len += (size_t)snprintf(g + len, cap - len, "g%zu:x:%zu:bob,alice\n", i, 100000 + (i * 7919) % n);
  users_tab *t = users_tab_new(PW, sizeof PW - 1, g, len);
  free(g);
  int unknown, miss;
  rpc_ident *id = res(t, "alice", &unknown, &miss);
  ASSERT(id != NULL);
  ASSERT_EQ(id->ngroups, n);
  for (size_t i = 1; i < id->ngroups; i++) ASSERT(id->groups[i - 1] < id->groups[i]);
  rpc_ident_release(id);
  users_tab_free(t);
}

int main(void) {
  RUN(spec_forms);
  RUN(tables_and_resolution);
  RUN(holds);
  RUN(many_groups_each_once);
  RUN(thread_identity_switched_and_restored);
  return test_summary();
}
