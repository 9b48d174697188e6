/* users — who an RPC's work runs as (api.md §9 "Commands and files as a
 * user"): the conch-init-user header or the default user, resolved against
 * the sandbox root's /etc/passwd and /etc/group.
 *
 * The agent reads the two files itself (a static binary has no NSS), in
 * the thread pool, never on the loop.  The loop keeps the last table it
 * read and resolves from it at once; it reads them again when an inotify
 * event on /etc names one of them (libuv's fs_event), and before it calls
 * a name or a uid unknown, and at most every USERS_RECHECK_MS whatever the
 * events say (the files' size, mtime and inode are compared in the pool: a
 * user added a moment ago is found even before its event is seen, and a
 * symlinked or bind-mounted file that sends no event on /etc is followed).
 *
 * The identities (rpc_ident, rpc.h) are copies: a table can be replaced
 * while calls and process records hold what they resolved.
 */
#ifndef CONCH_USERS_H
#define CONCH_USERS_H

#include <stddef.h>
#include <stdint.h>

#include "core/list.h"
#include "server/ident.h" /* users_root, USERS_MAX_GROUPS */
#include "server/rpc.h"

/* Bytes read of each file at most: the rest of a bigger file is ignored. */
#define USERS_MAX_FILE (4u << 20)
/* The cache is compared with the files at least this often. */
#define USERS_RECHECK_MS 1000
/* Longest header value or default user accepted. */
#define USERS_MAX_SPEC 256

typedef enum users_form { USERS_NAME, USERS_UID, USERS_UIDGID } users_form;

typedef struct users_spec {
  users_form form;
  uint32_t uid, gid;
  const char *text; /* the spec as given */
} users_spec;

/* `name`, `uid` or `uid:gid` (decimal, at most 4294967294; a name: no ':',
 * no space or control byte, not only digits, at most 255 bytes).  0, or -1
 * when malformed. */
int users_spec_parse(const char *text, users_spec *out);

/* USERS_ERROR: the files could not be read (`cannot read the user
 * database`), never mistaken for empty ones. */
typedef enum users_status { USERS_OK, USERS_PENDING, USERS_INVALID, USERS_UNKNOWN, USERS_ERROR } users_status;

typedef struct users_wait users_wait;
struct users_wait {
  list_node link; /* in the queue (zero: not queued) */
  unsigned after; /* reads started when it queued: only a later one answers it */
  char spec[USERS_MAX_SPEC + 1];
  /* From the loop, once the files were read: st USERS_OK (id: a hold, the
   * callee's), USERS_UNKNOWN or USERS_INVALID. */
  void (*done)(users_wait *w, users_status st, const rpc_ident *id);
};

/* Resolve text (loop).  USERS_OK: *out is a hold; USERS_INVALID (malformed:
 * `invalid user: <u>`), USERS_UNKNOWN (`unknown user: <u>`); USERS_PENDING:
 * the files are being read, w->done follows from the loop, never from
 * inside this call (w must stay valid until then, or users_cancel(w));
 * USERS_ERROR: no read could be started. */
users_status users_resolve(const char *text, const rpc_ident **out, users_wait *w);

/* Take w out of the queue (a no-op when it is not there). */
void users_cancel(users_wait *w);

/* 1 while w is in the queue (USERS_PENDING, its done not yet run). */
static inline int users_waiting(const users_wait *w) { return list_linked(&w->link); }

/* The same, reading the files now, in the calling thread (the init
 * message's defaultUser, from the pool): USERS_OK (a hold, or root's static
 * one), USERS_INVALID, USERS_UNKNOWN or USERS_ERROR. */
users_status users_resolve_now(const char *text, const rpc_ident **out);

/* ---- the pure parts (unit-tested) ---- */
typedef struct users_tab users_tab;

/* A table from the files' contents (either may be NULL: missing); NULL
 * when out of memory.  Malformed lines are skipped. */
users_tab *users_tab_new(const char *passwd, size_t plen, const char *group, size_t glen);
void users_tab_free(users_tab *t);

/* The identity spec names in t: a new hold, or NULL with *unknown set
 * (a name not in t) or clear (out of memory).  *miss: the uid has no
 * passwd entry (resolved all the same: gid = uid, home "/"). */
rpc_ident *users_tab_resolve(const users_tab *t, const users_spec *sp, int *unknown, int *miss);

#endif
