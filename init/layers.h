/* layers — choosing the read-only layers and the overlay options
 * (boot.md §2 steps 8–9).
 *
 * Pure helpers (unit-tested); the mounting itself is in boot.c.
 *   pmem names: "pmem<N>" with canonical decimal N only (pmem0, pmem12; not
 *   pmem01, pmem0p1, pmemx), sorted by N; pmem0 is the newest layer and goes
 *   first in lowerdir.
 */
#ifndef CONCH_INIT_LAYERS_H
#define CONCH_INIT_LAYERS_H

#include <stddef.h>

#define LAYERS_MAX 64
#define LAYERS_PMEM_MAX_INDEX 99999u

/* 1 and *idx if name is "pmem<N>" in canonical form (N <= LAYERS_PMEM_MAX_INDEX). */
int layers_pmem_index(const char *name, unsigned *idx);

/* Filter names to pmem devices and sort them numerically into idx[]
 * (duplicates dropped).  Returns the count (at most max). */
size_t layers_pmem_select(const char *const *names, size_t n, unsigned *idx, size_t max);

/* Overlay mount data "lowerdir=L0:L1…,upperdir=U,workdir=W" into out.
 * Returns 0, or -1 when nlower == 0, a path contains ':' or ',', or out is
 * too small (the kernel takes one page of mount data). */
int layers_overlay_opts(char *out, size_t outlen, const char *const *lower, size_t nlower,
                        const char *upper, const char *work);

#endif
