/* ident — see ident.h. */
#include "server/ident.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

const rpc_ident users_root = {.refs = 0, .uid = 0, .gid = 0, .implicit = 1, .has_entry = 1,
                              .name = "root", .home = "/root"};

/* ------------------------------------------------------------ identities */

const rpc_ident *rpc_ident_hold(const rpc_ident *id) {
  if (id && id->refs) ((rpc_ident *)id)->refs++;
  return id;
}

void rpc_ident_release(const rpc_ident *id) {
  if (id && id->refs && --((rpc_ident *)id)->refs == 0) free((void *)id);
}

/* One block: the struct, the groups, the two strings. */
rpc_ident *ident_new(uint32_t uid, uint32_t gid, const char *name, const char *home, const uint32_t *groups,
                     size_t ngroups) {
  size_t nl = strlen(name) + 1, hl = strlen(home) + 1;
  rpc_ident *id = malloc(sizeof *id + ngroups * sizeof *groups + nl + hl);
  if (!id) return NULL;
  uint32_t *g = (uint32_t *)(id + 1);
  char *s = (char *)(g + ngroups);
  if (ngroups) memcpy(g, groups, ngroups * sizeof *groups);
  memcpy(s, name, nl);
  memcpy(s + nl, home, hl);
  *id = (rpc_ident){.refs = 1, .uid = uid, .gid = gid, .name = s, .home = s + nl, .ngroups = ngroups,
                    .groups = g};
  return id;
}

const rpc_ident *rpc_ident_restored(const char *name, uint32_t uid, uint32_t gid) {
  if (!name || !name[0]) return &users_root;
  rpc_ident *id = ident_new(uid, gid, name, "/", NULL, 0);
  return id ? id : &users_root;
}

/* ------------------------------------------------------------ a thread's fs identity */

static pthread_once_t saved_once = PTHREAD_ONCE_INIT;
static gid_t saved_groups[64];
static int saved_n;

/* root's own groups, as the threads started with them */
static void save_groups(void) {
  int n = getgroups(64, saved_groups);
  saved_n = n < 0 ? 0 : n;
}

int rpc_fs_become(const rpc_ident *id) {
  if (!id || (id->uid == 0 && id->gid == 0 && id->ngroups == 0)) return 0;
  pthread_once(&saved_once, save_groups);
  size_t n = id->ngroups < USERS_MAX_GROUPS ? id->ngroups : USERS_MAX_GROUPS;
  if (syscall(SYS_setgroups, n, (const gid_t *)id->groups) != 0) return -1;
  setfsgid(id->gid);
  setfsuid(id->uid);
  if ((uint32_t)setfsuid((uid_t)-1) != id->uid || (uint32_t)setfsgid((gid_t)-1) != id->gid) {
    rpc_fs_restore();
    return -1;
  }
  return 0;
}

void rpc_fs_restore(void) {
  pthread_once(&saved_once, save_groups);
  setfsuid(0);
  setfsgid(0);
  syscall(SYS_setgroups, (size_t)saved_n, saved_groups);
}
