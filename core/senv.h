/* senv — the sandbox environment (boot.md §3, api.md §6).
 *
 * Pairs set from the init message (never unset; a later set replaces the
 * value), read by everything that starts a process.  Stored in conch.senv.
 */
#ifndef CONCH_SENV_H
#define CONCH_SENV_H

#include <stddef.h>

#define SENV_DEFAULT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

/* Set KEY=VAL (replacing). Returns 0 or -1 (ENOMEM). */
int senv_set(const char *key, const char *val);
/* Value or NULL. */
const char *senv_get(const char *key);

/* Build an envp for a child: sandbox env, plus HOME=/root and PATH=default
 * when absent, overlaid by n (keys[i]=vals[i]) pairs (the overlay wins).
 * Returns one malloc'd block (free() once), NULL-terminated; NULL on ENOMEM. */
char **senv_build(const char *const *keys, const char *const *vals, size_t n);

/* The same from a built envp (base, e.g. senv_build's) instead of the
 * sandbox environment: touches no daemon state, so it may run in the
 * thread pool on a snapshot taken on the loop. */
char **senv_merge(char *const *base, const char *const *keys, const char *const *vals, size_t n);

/* Lookup in an envp array as built above. */
const char *senv_lookup(char *const *envp, const char *key);

#endif
