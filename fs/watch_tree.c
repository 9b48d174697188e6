/* fs/watch_tree — a WatchDir stream's tree of watched directories (see
 * fs/watch.c); its pool jobs only.
 *
 * The stream's watched directories form a tree of nodes (parent, name),
 * found by watch descriptor or by (parent, name) in two hash tables, so a
 * rename or a directory moved out costs its own subtree, never the whole
 * tree.  The tree belongs to whichever job of the stream runs (jobs are
 * serial): no lock.  A node's directory is reached from the root by
 * descriptor, component by component, never by path; the root itself is
 * reopened by path for each job and accepted only if it is still the
 * directory the stream watches.
 */
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fs/watch_int.h"

static uint32_t name_hash(const wnode *parent, const char *name) {
  uint32_t x = 2166136261u ^ (uint32_t)((uintptr_t)parent >> 4);
  for (const unsigned char *p = (const unsigned char *)name; *p; p++) x = (x ^ *p) * 16777619u;
  return x;
}

wnode *wd_node_by_wd(fs_watch *w, int wd) {
  if (!w->tab_cap) return NULL;
  wnode *n = w->by_wd[wd_hash(wd, w->tab_cap)];
  while (n && n->wd != wd) n = n->hw;
  return n;
}

wnode *wd_node_child(fs_watch *w, wnode *parent, const char *name) {
  if (!w->tab_cap) return NULL;
  uint32_t hv = name_hash(parent, name);
  wnode *n = w->by_name[hv & (w->tab_cap - 1)];
  while (n && !(n->hname == hv && n->parent == parent && strcmp(n->name, name) == 0)) n = n->hn;
  return n;
}

static void name_insert(fs_watch *w, wnode *n) {
  n->hname = name_hash(n->parent, n->name);
  size_t b = n->hname & (w->tab_cap - 1);
  n->hn = w->by_name[b];
  w->by_name[b] = n;
}

static void name_remove(fs_watch *w, wnode *n) {
  wnode **p = &w->by_name[n->hname & (w->tab_cap - 1)];
  while (*p != n) p = &(*p)->hn;
  *p = n->hn;
}

static void wd_insert(fs_watch *w, wnode *n) {
  size_t b = wd_hash(n->wd, w->tab_cap);
  n->hw = w->by_wd[b];
  w->by_wd[b] = n;
}

static void kid_link(wnode *n) {
  if (n->parent) list_insert_head(&n->parent->kids, &n->sib);
}

static void kid_unlink(wnode *n) { list_remove(&n->sib); }

/* The tree changed: the cached open directory may name another one now. */
static void cdir_forget(fs_watch *w) {
  if (w->cdir_fd >= 0) close(w->cdir_fd);
  w->cdir_fd = -1;
  w->cdir_node = NULL;
}

void wd_node_drop(fs_watch *w, wnode *n) {
  cdir_forget(w);
  kid_unlink(n);
  wnode *x = n;
  for (;;) {
    wnode *k;
    while ((k = list_first_entry(&x->kids, wnode, sib))) x = k;
    wnode *p = x->parent;
    int last = x == n;
    if (!last) kid_unlink(x);
    wd_hub_drop(w, x->wd);
    wnode **q = &w->by_wd[wd_hash(x->wd, w->tab_cap)];
    while (*q != x) q = &(*q)->hw;
    *q = x->hw;
    name_remove(w, x);
    if (w->from_node == x) w->from_node = NULL;
    for (size_t i = 0; i < w->nlost; i++)
      if (w->lost[i] == x) {
        w->lost[i] = w->lost[--w->nlost]; /* gone from the tree: nothing to retry */
        break;
      }
    free(x->name);
    free(x);
    w->nnodes--;
    if (last) break;
    k = list_first_entry(&p->kids, wnode, sib);
    x = k ? k : p;
  }
  if (n == w->rootn) w->rootn = NULL;
}

/* 1 when a is n or below it. */
static int node_within(const wnode *a, const wnode *n) {
  for (; a; a = a->parent)
    if (a == n) return 1;
  return 0;
}

wnode *wd_node_add(fs_watch *w, wnode *parent, const char *name, int wd) {
  if (w->nnodes + 1 > w->tab_cap) {
    size_t nc = w->tab_cap ? w->tab_cap * 2 : 64;
    wnode **a = calloc(nc, sizeof *a), **b = calloc(nc, sizeof *b);
    if (!a || !b) {
      free(a);
      free(b);
      return NULL;
    }
    for (size_t i = 0; i < w->tab_cap; i++)
      for (wnode *x = w->by_wd[i], *nx; x; x = nx) {
        nx = x->hw;
        size_t k = wd_hash(x->wd, nc);
        x->hw = a[k];
        a[k] = x;
      }
    for (size_t i = 0; i < w->tab_cap; i++)
      for (wnode *x = w->by_name[i], *nx; x; x = nx) {
        nx = x->hn;
        x->hn = b[x->hname & (nc - 1)];
        b[x->hname & (nc - 1)] = x;
      }
    free(w->by_wd);
    free(w->by_name);
    w->by_wd = a;
    w->by_name = b;
    w->tab_cap = nc;
  }
  if (parent) {
    wnode *old = wd_node_child(w, parent, name);
    if (old) wd_node_drop(w, old);
  }
  wnode *n = calloc(1, sizeof *n);
  if (n) n->name = strdup(name);
  if (!n || !n->name) {
    free(n);
    return NULL;
  }
  n->wd = wd;
  n->parent = parent;
  kid_link(n);
  wd_insert(w, n);
  name_insert(w, n);
  w->nnodes++;
  return n;
}

int wd_node_move(fs_watch *w, wnode *n, wnode *parent, const char *name) {
  if (node_within(parent, n)) return -1;
  char *nm = strdup(name);
  if (!nm) return -1;
  wnode *old = wd_node_child(w, parent, name);
  if (old && old != n) {
    if (node_within(n, old)) return -1; /* (a stale tree: leave it) */
    wd_node_drop(w, old); /* replaced by the rename */
  }
  cdir_forget(w);
  name_remove(w, n);
  kid_unlink(n);
  free(n->name);
  n->name = nm;
  n->parent = parent;
  kid_link(n);
  name_insert(w, n);
  return 0;
}

size_t wd_node_depth(const wnode *n) {
  size_t d = 0;
  for (; n && n->parent; n = n->parent) d++;
  return d;
}

char *wd_node_rel(const wnode *n) {
  size_t len = 0;
  for (const wnode *x = n; x->parent; x = x->parent) len += strlen(x->name) + 1;
  char *r = malloc(len ? len : 1);
  if (!r) return NULL;
  if (!len) {
    r[0] = 0;
    return r;
  }
  size_t at = len - 1;
  r[at] = 0;
  for (const wnode *x = n; x->parent; x = x->parent) {
    size_t l = strlen(x->name);
    at -= l;
    memcpy(r + at, x->name, l);
    if (at) r[--at] = '/';
  }
  return r;
}

/* The root, reopened by its path for this job and accepted only if it is
 * still the directory the stream watches; -1 otherwise. */
static int root_fd(fs_watch *w) {
  if (w->rootfd >= 0) return w->rootfd;
  int fd = open(w->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  struct stat sb;
  if (fd >= 0 && (fstat(fd, &sb) != 0 || sb.st_dev != w->root_dev || sb.st_ino != w->root_ino)) {
    close(fd);
    fd = -1;
  }
  return w->rootfd = fd;
}

void wd_job_release(fs_watch *w) {
  cdir_forget(w);
  if (w->rootfd >= 0) close(w->rootfd);
  w->rootfd = -1;
}

int wd_node_dirfd(fs_watch *w, wnode *n) {
  if (w->cdir_node == n && w->cdir_fd >= 0) return w->cdir_fd;
  cdir_forget(w);
  if (root_fd(w) < 0) return -1;
  size_t d = wd_node_depth(n);
  int fd;
  if (!d) {
    fd = fcntl(w->rootfd, F_DUPFD_CLOEXEC, 0);
  } else {
    const wnode **v = malloc(d * sizeof *v);
    if (!v) return -1;
    size_t i = 0;
    for (const wnode *x = n; x->parent; x = x->parent) v[i++] = x;
    fd = w->rootfd;
    while (i-- > 0) {
      int nfd = openat(fd, v[i]->name, WD_OPEN_DIR);
      if (fd != w->rootfd) close(fd);
      fd = nfd;
      if (fd < 0) break;
    }
    free(v);
  }
  if (fd < 0) return -1;
  w->cdir_node = n;
  w->cdir_fd = fd;
  return fd;
}

char *wd_join_full(const fs_watch *w, const char *rel) {
  size_t rl = strlen(rel);
  char *f = malloc(w->rootlen + 1 + rl + 1);
  if (!f) return NULL;
  memcpy(f, w->root, w->rootlen);
  size_t n = w->rootlen;
  if (rl) {
    if (!(n == 1 && f[0] == '/')) f[n++] = '/';
    memcpy(f + n, rel, rl);
    n += rl;
  }
  f[n] = 0;
  return f;
}

char *wd_join_rel(const char *dir, const char *name, size_t nl) {
  size_t dl = strlen(dir);
  char *r = malloc(dl + 1 + nl + 1);
  if (!r) return NULL;
  size_t n = 0;
  if (dl) {
    memcpy(r, dir, dl);
    r[dl] = '/';
    n = dl + 1;
  }
  memcpy(r + n, name, nl);
  r[n + nl] = 0;
  return r;
}
