/* fs/search — SearchFiles (api.md §7): validate path and patterns, then an
 * unlimited-depth walk in the thread pool keeping the files whose path
 * relative to the root or basename matches the pattern and no exclude
 * pattern.
 *
 * NUL bytes: rpc_input_had_nul() does not say which string held the NUL;
 * it is reported as a NUL in the path ("filepath contains a NUL byte for
 * search files") after the required-field checks.
 *
 * Pattern errors quote the pattern as Go's %q does (text_go_quote_dup, proto/text.h): for
 * ordinary patterns that is just "<p>".
 */
#include <stdlib.h>
#include <string.h>

#include "fs/glob.h"
#include "fs/handlers.h"
#include "proto/agent.pb-c.h"
#include "proto/text.h"

typedef struct search_spec {
  char *root;
  char *pattern;
  size_t plen;
  char **ex;
  size_t *exlen;
  size_t n_ex;
} search_spec;

static void search_spec_free(void *p) {
  search_spec *s = p;
  if (!s) return;
  free(s->root);
  free(s->pattern);
  for (size_t i = 0; i < s->n_ex; i++) free(s->ex[i]);
  free(s->ex);
  free(s->exlen);
  free(s);
}

static int glob_either(const char *pat, size_t plen, const char *rel, size_t rellen,
                       const char *base, size_t bl) {
  return fs_glob_match(pat, plen, rel, rellen) == 1 || fs_glob_match(pat, plen, base, bl) == 1;
}

/* Runs on a pool thread; the spec is read-only there. */
static int search_filter(void *arg, const char *rel, size_t rellen, const char *base, size_t bl,
                         int is_dir) {
  const search_spec *s = arg;
  if (is_dir) return 0;
  if (!glob_either(s->pattern, s->plen, rel, rellen, base, bl)) return 0;
  for (size_t i = 0; i < s->n_ex; i++)
    if (glob_either(s->ex[i], s->exlen[i], rel, rellen, base, bl)) return 0;
  return 1;
}

static search_spec *search_spec_new(const Pb__SearchFilesRequest *req) {
  search_spec *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->root = strdup(req->path);
  s->pattern = strdup(req->pattern);
  s->plen = s->pattern ? strlen(s->pattern) : 0;
  if (req->n_exclude_patterns) {
    s->ex = calloc(req->n_exclude_patterns, sizeof *s->ex);
    s->exlen = calloc(req->n_exclude_patterns, sizeof *s->exlen);
    if (!s->ex || !s->exlen) goto fail;
    for (size_t i = 0; i < req->n_exclude_patterns; i++) {
      const char *e = req->exclude_patterns[i] ? req->exclude_patterns[i] : "";
      if (!(s->ex[i] = strdup(e))) goto fail;
      s->exlen[i] = strlen(e);
      s->n_ex++;
    }
  }
  if (!s->root || !s->pattern) goto fail;
  return s;
fail:
  search_spec_free(s);
  return NULL;
}

/* "invalid <kind> pattern "<p>": syntax error in pattern", the pattern
 * quoted like Go's %q. */
static void search_bad_pattern(rpc_call *c, const char *kind, const char *pat) {
  char *q = text_go_quote_dup(pat, strlen(pat));
  rpc_finishf(c, RPC_INVALID_ARGUMENT, "invalid %s pattern %s: syntax error in pattern", kind,
              q ? q : "\"\"");
  free(q);
}

void fs_search_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__SearchFilesRequest *req = (const Pb__SearchFilesRequest *)msg;
  const char *path = req->path ? req->path : "";
  const char *pattern = req->pattern ? req->pattern : "";
  int had_nul = rpc_input_had_nul(c);
  char err[160];
  /* An empty C string with a NUL in the message: the path was "\0…". */
  if (!path[0] && !had_nul) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "path is required");
    return;
  }
  if (!pattern[0]) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, "pattern is required");
    return;
  }
  if (fs_check_call_path(c, path, "search files", err, sizeof err) < 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  if (!fs_glob_valid(pattern, strlen(pattern))) {
    search_bad_pattern(c, "search", pattern);
    return;
  }
  for (size_t i = 0; i < req->n_exclude_patterns; i++) {
    const char *e = req->exclude_patterns[i] ? req->exclude_patterns[i] : "";
    if (!fs_glob_valid(e, strlen(e))) {
      search_bad_pattern(c, "exclude", e);
      return;
    }
  }
  fs_listing *l = fs_listing_new(c, &pb__search_files_response__descriptor);
  search_spec *s = l ? search_spec_new(req) : NULL;
  if (!s) {
    fs_listing_discard(l);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  fs_listing_own(l, s, search_spec_free);
  fs_walk *w = fs_listing_walk(l);
  w->root = s->root;
  w->max_depth = 0;
  w->filter = search_filter;
  w->filter_arg = s;
  fs_listing_start(l);
}
