/* lifecycle — see lifecycle.h. */
#include "core/lifecycle.h"

#include <assert.h>

#include "core/log.h"

unsigned long lifecycle_refused;
#ifdef NDEBUG
const int lifecycle_asserts = 0;
#else
const int lifecycle_asserts = 1;
#endif

void lifecycle_refuse(const char *machine, const char *step, const char *from) {
  LOG_ERROR("%s: illegal transition %s from %s", machine, step, from);
  assert(!"illegal transition");
  lifecycle_refused++;
}

int lifecycle_check(const char *machine, unsigned legal_from, int from, int to,
                    const char *const *names, int nstates) {
  if (from >= 0 && from < nstates && to >= 0 && to < nstates && (legal_from >> from & 1u)) return 0;
  lifecycle_refuse(machine, to >= 0 && to < nstates ? names[to] : "?",
                   from >= 0 && from < nstates ? names[from] : "?");
  return -1;
}
