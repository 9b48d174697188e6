/* fs/walk — directory walk for ListFiles/SearchFiles; see walk.h. */
#include "fs/walk.h"

#include "proto/text.h"
#include "proto/wire.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define WALK_TOO_BIG_FMT "file list exceeds maximum message size %zu bytes"

/* A growable path buffer (logical paths may exceed PATH_MAX through
 * symlinks; the kernel then answers ENAMETOOLONG and the entry is skipped). */
typedef struct walk_path {
  char *s; /* inl, or malloc'd once longer */
  size_t len, cap;
  char inl[512];
} walk_path;

typedef struct walk_link {
  dev_t dev;
  ino_t ino;
} walk_link;

typedef struct walk_chain {
  walk_link *v; /* inl, or malloc'd once deeper */
  size_t n, cap;
  walk_link inl[16];
} walk_chain;

typedef struct walker {
  fs_walk *w;
  walk_path lp;
  size_t rootlen; /* length of the root prefix to strip for rel paths */
  walk_chain chain;
} walker;

static int path_append(walk_path *p, const char *name) {
  size_t nl = strlen(name);
  size_t need = p->len + 1 + nl + 1;
  if (need > p->cap) {
    size_t nc = p->cap ? p->cap : 256;
    while (nc < need) nc *= 2;
    char *ns = p->s == p->inl ? malloc(nc) : realloc(p->s, nc);
    if (!ns) return -1;
    if (p->s == p->inl) memcpy(ns, p->inl, p->len + 1);
    p->s = ns;
    p->cap = nc;
  }
  if (!(p->len == 1 && p->s[0] == '/')) p->s[p->len++] = '/';
  memcpy(p->s + p->len, name, nl + 1);
  p->len += nl;
  return 0;
}

static int chain_has(const walk_chain *c, const struct stat *st) {
  for (size_t i = 0; i < c->n; i++)
    if (c->v[i].dev == st->st_dev && c->v[i].ino == st->st_ino) return 1;
  return 0;
}

static int chain_push(walk_chain *c, const struct stat *st) {
  if (!c->v) {
    c->v = c->inl;
    c->cap = sizeof c->inl / sizeof c->inl[0];
  }
  if (c->n == c->cap) {
    size_t nc = c->cap * 2;
    walk_link *nv = c->v == c->inl ? malloc(nc * sizeof *nv) : realloc(c->v, nc * sizeof *nv);
    if (!nv) return -1;
    if (c->v == c->inl) memcpy(nv, c->inl, sizeof c->inl);
    c->v = nv;
    c->cap = nc;
  }
  c->v[c->n].dev = st->st_dev;
  c->v[c->n].ino = st->st_ino;
  c->n++;
  return 0;
}

/* A FileEntry string field (omitted when empty). */
static size_t pb_str_len(uint32_t field, const char *s) {
  size_t l = strlen(s);
  return l ? wire_len_field_size(field, l) : 0;
}

size_t fs_entry_wire_size(const fs_entry *e, int json) {
  const char *type = e->is_dir ? "directory" : "file";
  if (json) {
    /* {"name":…,"path":…,"type":…,"size":"N","permissions":…,
     *  "modifiedTime":…,"metadata":{},"isDirectory":true},
     * permissions and times hold no character that JSON escapes */
    size_t pl = strlen(e->path), nl = strlen(e->name);
    size_t pj = text_json_string(NULL, e->path, pl), nj = text_json_string(NULL, e->path + pl - nl, nl);
    return 120 + nj + pj + strlen(type) + 2 + 22 + strlen(e->perms) + 2 + strlen(e->mtime) + 2;
  }
  size_t n = pb_str_len(1, e->name) + pb_str_len(2, e->path) + pb_str_len(3, type) +
             pb_str_len(5, e->perms) + pb_str_len(6, e->mtime);
  if (e->size) n += 1 + wire_varint_len((uint64_t)e->size);
  if (e->is_dir) n += 2;
  return wire_len_field_size(1, n); /* ListFiles/SearchFilesResponse.entries = 1 */
}

void fs_entry_fill(fs_entry *e, const struct stat *st) {
  e->is_dir = S_ISDIR(st->st_mode) ? 1 : 0;
  e->size = (int64_t)st->st_size;
  fs_mode_string(st->st_mode, e->perms);
  fs_rfc3339(st->st_mtim.tv_sec, e->mtime, sizeof e->mtime);
}

static int walk_cancelled(const fs_walk *w) {
  return w->cancel && atomic_load_explicit(w->cancel, memory_order_relaxed);
}

static void walk_path_free(fs_walk *w, char *p) {
  if (!(p >= w->paths && p < w->paths + sizeof w->paths)) free(p);
}

/* Offer the entry at wk->lp to the filter and keep it.  0 ok, -1 stop. */
static int walk_emit(walker *wk, const struct stat *st) {
  fs_walk *w = wk->w;
  const char *path = wk->lp.s;
  const char *base = strrchr(path, '/');
  base = (base && base[1]) ? base + 1 : path;
  if (w->filter) {
    const char *rel = path + wk->rootlen;
    size_t rellen = wk->lp.len - wk->rootlen;
    if (wk->rootlen == 0) { /* file root: the basename */
      rel = base;
      rellen = strlen(base);
    }
    if (!w->filter(w->filter_arg, rel, rellen, base, strlen(base), S_ISDIR(st->st_mode)))
      return 0;
  }
  fs_entry e;
  memset(&e, 0, sizeof e);
  fs_entry_fill(&e, st);
  size_t pl = wk->lp.len;
  if (pl < sizeof w->paths - w->paths_used) {
    e.path = w->paths + w->paths_used;
    memcpy(e.path, path, pl + 1);
    w->paths_used += pl + 1;
  } else if (!(e.path = strdup(path))) {
    goto nomem;
  }
  e.name = e.path + (base - path);
  size_t sz = fs_entry_wire_size(&e, w->json);
  if (w->bytes + sz > w->max_bytes) {
    walk_path_free(w, e.path);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, WALK_TOO_BIG_FMT, w->max_bytes);
    return -1;
  }
  if (!w->entries) {
    w->entries = w->inl;
    w->cap = FS_WALK_INLINE;
  }
  if (w->n == w->cap) {
    size_t nc = w->cap < 64 ? 64 : w->cap * 2;
    fs_entry *nv = w->entries == w->inl ? malloc(nc * sizeof *nv) : realloc(w->entries, nc * sizeof *nv);
    if (!nv) {
      walk_path_free(w, e.path);
      goto nomem;
    }
    if (w->entries == w->inl) memcpy(nv, w->inl, w->n * sizeof *nv);
    w->entries = nv;
    w->cap = nc;
  }
  w->entries[w->n++] = e;
  w->bytes += sz;
  return 0;
nomem:
  fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", w->root);
  return -1;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Read the names of directory wk->lp (without "." and ".."), sorted.
 * Returns 0 (names in *out, count *n; free each and the array), 1 when a
 * subdirectory cannot be read (skip it), -1 on error (status set).  Only
 * the root's read errors are errors: below it, an unreadable directory
 * (EACCES as for /proc/1/fdinfo, vanished, replaced…) is listed but not
 * entered, and a read error part-way keeps the names read so far. */
static int walk_read_names(walker *wk, char ***out, size_t *n, int is_root) {
  *out = NULL;
  *n = 0;
  DIR *d = opendir(wk->lp.s);
  if (!d) {
    if (!is_root) return 1;
    fs_status_os(&wk->w->st, "read directory", wk->lp.s, errno);
    return -1;
  }
  char **v = NULL;
  size_t cnt = 0, cap = 0;
  for (;;) {
    errno = 0;
    struct dirent *de = readdir(d);
    if (!de) {
      if (errno && is_root) {
        fs_status_os(&wk->w->st, "read directory", wk->lp.s, errno);
        goto fail;
      }
      break;
    }
    const char *nm = de->d_name;
    if (nm[0] == '.' && (nm[1] == 0 || (nm[1] == '.' && nm[2] == 0))) continue;
    if ((cnt & 1023) == 0 && walk_cancelled(wk->w)) {
      fs_status_set(&wk->w->st, RPC_CANCELED, "canceled");
      goto fail;
    }
    if (cnt == cap) {
      size_t nc = cap ? cap * 2 : 32;
      char **nv = realloc(v, nc * sizeof *nv);
      if (!nv) goto nomem;
      v = nv;
      cap = nc;
    }
    if (!(v[cnt] = strdup(nm))) goto nomem;
    cnt++;
  }
  closedir(d);
  if (cnt) qsort(v, cnt, sizeof *v, name_cmp);
  *out = v;
  *n = cnt;
  return 0;
nomem:
  fs_status_set(&wk->w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", wk->w->root);
fail:
  closedir(d);
  for (size_t i = 0; i < cnt; i++) free(v[i]);
  free(v);
  return -1;
}

/* Walk the directory at wk->lp, whose children are at `level`. */
static int walk_dir(walker *wk, int level, int is_root) {
  fs_walk *w = wk->w;
  char **names;
  size_t n;
  int r = walk_read_names(wk, &names, &n, is_root);
  if (r) return r > 0 ? 0 : -1;
  size_t dirlen = wk->lp.len;
  int rc = 0;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (walk_cancelled(w)) {
      fs_status_set(&w->st, RPC_CANCELED, "canceled");
      rc = -1;
      break;
    }
    if (w->max_visits && ++w->visits > w->max_visits) {
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "file walk exceeds %zu entries",
                    w->max_visits);
      rc = -1;
      break;
    }
    if (path_append(&wk->lp, names[i]) < 0) {
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", w->root);
      rc = -1;
      break;
    }
    struct stat st;
    int ok = stat(wk->lp.s, &st) == 0;
    int broken = 0;
    if (!ok) {
      /* Dangling (or looping) link: report the link itself. */
      broken = lstat(wk->lp.s, &st) == 0;
    }
    if (ok || broken) {
      rc = walk_emit(wk, &st);
      if (rc == 0 && ok && S_ISDIR(st.st_mode) && (w->max_depth == 0 || level < w->max_depth) &&
          !chain_has(&wk->chain, &st)) {
        if (chain_push(&wk->chain, &st) < 0) {
          fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", w->root);
          rc = -1;
        } else {
          rc = walk_dir(wk, level + 1, 0);
          wk->chain.n--;
        }
      }
    }
    wk->lp.len = dirlen;
    wk->lp.s[dirlen] = 0;
  }
  for (size_t i = 0; i < n; i++) free(names[i]);
  free(names);
  return rc;
}

int fs_walk_run(fs_walk *w) {
  walker wk;
  memset(&wk, 0, sizeof wk);
  wk.w = w;
  fs_status_clear(&w->st);
  if (w->max_bytes == 0) w->max_bytes = SIZE_MAX;
  /* The response wrapper: JSON {"entries":[…]}, protobuf nothing. */
  w->bytes = w->json ? 16 : 0;

  size_t rl = strlen(w->root);
  wk.lp.cap = sizeof wk.lp.inl;
  wk.lp.s = wk.lp.inl;
  if (rl + 1 > wk.lp.cap) {
    wk.lp.cap = rl + 256;
    if (!(wk.lp.s = malloc(wk.lp.cap))) {
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", w->root);
      return w->st.code;
    }
  }
  memcpy(wk.lp.s, w->root, rl + 1);
  wk.lp.len = rl;

  struct stat st;
  if (stat(w->root, &st) != 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&w->st, RPC_NOT_FOUND, "path not found: %s", w->root);
    else
      fs_status_os(&w->st, "stat path", w->root, e);
  } else if (!S_ISDIR(st.st_mode)) {
    wk.rootlen = 0; /* file root: rel = basename */
    walk_emit(&wk, &st);
  } else {
    /* rel paths drop "<root>/" (root "/" drops just "/"). */
    wk.rootlen = rl == 1 ? 1 : rl + 1;
    if (chain_push(&wk.chain, &st) < 0)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory listing %s", w->root);
    else
      walk_dir(&wk, 1, 1);
  }
  if (wk.lp.s != wk.lp.inl) free(wk.lp.s);
  if (wk.chain.v != wk.chain.inl) free(wk.chain.v);
  return w->st.code;
}

void fs_walk_free(fs_walk *w) {
  for (size_t i = 0; i < w->n; i++) walk_path_free(w, w->entries[i].path);
  if (w->entries != w->inl) free(w->entries);
  w->entries = NULL;
  w->n = w->cap = 0;
  w->paths_used = 0;
  fs_status_clear(&w->st);
}
