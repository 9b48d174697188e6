/* fuzz_modules — the module load order from a modules.dep text (the
 * image's, but parsed defensively).  The input's first line names the
 * modules to load, the rest is modules.dep.  Properties: each file is
 * planned at most once, the count returned is the count planned, and
 * nothing is planned for an empty request. */
#include <string.h>

#include "init/modules.h"
#include "fuzz.h"

#define MAXP 512
static const char *planned[MAXP];
static size_t nplanned;

static void on_load(void *arg, const char *path) {
  for (size_t i = 0; i < nplanned; i++) FUZZ_CHECK(strcmp(planned[i], path) != 0);
  FUZZ_CHECK(nplanned < MAXP);
  planned[nplanned++] = path;
}
static void on_builtin(void *arg, const char *name) {}
static void on_warn(void *arg, const char *name, const char *why) { FUZZ_CHECK(why && *why); }

static char *names[64];
static size_t nnames;
static void add(void *arg, const char *s, size_t n) {
  if (nnames < 64) names[nnames++] = strndup(s, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size > 65536) return 0;
  const char *s = (const char *)data;
  const char *nl = memchr(s, '\n', size);
  size_t first = nl ? (size_t)(nl - s) : size;
  nnames = nplanned = 0;
  modules_split(s, first, add, NULL);
  modules_plan_ops ops = {on_load, on_builtin, on_warn, NULL};
  const char *dep = nl ? nl + 1 : "";
  int rc = modules_plan(dep, nl ? size - first - 1 : 0, NULL, 0, (const char *const *)names, nnames, &ops);
  FUZZ_CHECK(rc == (int)nplanned);
  if (nnames == 0) FUZZ_CHECK(rc == 0);
  for (size_t i = 0; i < nnames; i++) free(names[i]);
  return 0;
}
