/* ident — identities (rpc_ident, rpc.h): the implicit root, holds and
 * releases, the one-block constructor, and a pool thread's file-system
 * identity (rpc_fs_become / rpc_fs_restore).  A leaf of server/: it calls
 * nothing else of it (tests/tools/check-layers.sh), so that users.c, which
 * makes identities, and rpcwork.c and connect.c, which hold them, never
 * call each other through it. */
#ifndef CONCH_IDENT_H
#define CONCH_IDENT_H

#include <stddef.h>
#include <stdint.h>

#include "server/rpc.h"

/* Supplementary groups kept at most (the kernel's NGROUPS_MAX). */
#define USERS_MAX_GROUPS 65536

/* The implicit root: nobody named a user (static: holds are no-ops). */
extern const rpc_ident users_root;

/* A new identity with one reference, in one block (the groups and both
 * strings copied behind the struct); NULL when out of memory. */
rpc_ident *ident_new(uint32_t uid, uint32_t gid, const char *name, const char *home, const uint32_t *groups,
                     size_t ngroups);

#endif
