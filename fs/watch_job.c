/* fs/watch_job — the pool jobs of a WatchDir stream (see fs/watch.c): one
 * at a time per stream, in order (rpc_work_submit/done order them).
 *
 * Setup runs in the pool: open the root (O_DIRECTORY; missing → not_found
 * "path not found: <p>", not a directory → invalid_argument "path is not a
 * directory: <p>"), watch it and, with `recursive`, every directory below.
 * Directories are walked by descriptor only: each child is opened with
 * openat(parent fd, name, O_NOFOLLOW|O_DIRECTORY) and watched as
 * /proc/self/fd/<fd>, so the watch is on the inode opened — a path swapped
 * for a symlink is never followed, whatever the race.  A stream that cannot
 * cover its tree says so: at setup an error (more than WD_MAX_WATCHES
 * directories, deeper than WD_MAX_DEPTH levels, the kernel's watch limit,
 * a directory that cannot be opened), later an `overflow` after the event
 * whose directory could not be covered.
 *
 * Then an item job resolves each item's watch to its relative name, stats
 * the entry (fstatat from the directory reopened by descriptor from the
 * root: CREATE, WRITE, CHMOD, RENAME-to) and, with `recursive`, watches
 * directories created or moved in (a created one is also scanned: what it
 * already holds is reported as CREATE, so `mkdir -p a/b/c` is seen whole;
 * an entry created at that very instant may be reported twice).  A
 * directory renamed inside the tree keeps its watches under the new name;
 * one moved out loses them.  A new directory whose parent was renamed
 * before its event was read (so the parent cannot be reopened by the name
 * the tree has) is picked up once that rename is followed (WD_LOST_MAX).
 * The stream's end drops its watches in a last job.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"
#include "fs/path.h"
#include "fs/watch_int.h"
#include "proto/agent.pb-c.h"

static void seen_add(fs_watch *w, const char *rel) {
  if (w->nseen == WD_SEEN_MAX) return; /* reported twice at worst */
  char *r = strdup(rel);
  if (!r) return;
  w->seen[w->nseen].rel = r;
  w->seen[w->nseen].until = w->items_seen + WD_SEEN_WINDOW;
  w->nseen++;
}

/* 1 when rel was reported by a scan (and forget it); expired ones go. */
static int seen_take(fs_watch *w, const char *rel) {
  int hit = 0;
  for (size_t i = 0; i < w->nseen;) {
    if (!hit && strcmp(w->seen[i].rel, rel) == 0) hit = 1;
    else if (w->seen[i].until >= w->items_seen) {
      i++;
      continue;
    }
    free(w->seen[i].rel);
    w->seen[i] = w->seen[--w->nseen];
  }
  return hit;
}

static int watch_canceled(fs_watch *w) { return atomic_load_explicit(&w->cancel, memory_order_relaxed); }

/* A directory that cannot be opened for the walk: gone or not a directory
 * (any more) is nothing to watch; anything else leaves it uncovered. */
static int open_failed(fs_watch *w, const char *rel, int e) {
  if (e == ENOENT || e == ENOTDIR || e == ELOOP) return 0;
  char *full = wd_join_full(w, rel);
  fs_status_os(&w->st, "watch directory", full ? full : w->root, e);
  if (e == EMFILE || e == ENFILE || e == ENOMEM) w->st.code = RPC_RESOURCE_EXHAUSTED;
  free(full);
  return -1;
}

/* A synthetic CREATE for entry `name` (lstat'ed as sb) of the directory
 * open at dfd, whose relative name is crel. */
static void scan_report(fs_watch *w, int dfd, const char *name, const char *crel, const struct stat *sb,
                        wd_item ***out, wd_item *owner) {
  if (w->scan_left == 0) {
    owner->ovf_after = 1;
    return;
  }
  wd_item *x = calloc(1, sizeof *x);
  if (x) x->full = wd_join_full(w, crel);
  if (!x || !x->full) {
    free(x);
    return;
  }
  w->scan_left--;
  x->kind = WI_FS;
  x->type = PB__EVENT_TYPE__EVENT_TYPE_CREATE;
  x->rel = x->full + (strlen(x->full) - strlen(crel));
  struct stat fb;
  if (fstatat(dfd, name, &fb, 0) != 0) fb = *sb; /* a link to nowhere: itself */
  fs_entry_fill(&x->e, &fb);
  x->e.path = x->full;
  x->e.name = fs_path_base(x->full);
  x->has_entry = 1;
  seen_add(w, x->rel);
  **out = x;
  *out = &x->next;
}

/* Watch the directory open at dfd (taken: closed here), `depth` levels
 * below the root, as `name` under `parent` (NULL: the root itself), and,
 * recursive, every directory below it; with `out`, append a synthetic
 * CREATE for each entry found (a new directory's contents).  0 when all of
 * it is watched, -1 when some of it could not be (w->st says why; the
 * rest is watched). */
static int watch_dir(fs_watch *w, int dfd, wnode *parent, const char *name, size_t depth, wd_item ***out,
                     wd_item *owner) {
  if (depth > WD_MAX_DEPTH) {
    close(dfd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: directory tree deeper than %d levels",
                  w->root, WD_MAX_DEPTH);
    return -1;
  }
  if (w->nnodes >= WD_MAX_WATCHES) {
    close(dfd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: more than %d directories", w->root,
                  WD_MAX_WATCHES);
    return -1;
  }
  char proc[40];
  snprintf(proc, sizeof proc, "/proc/self/fd/%d", dfd);
  int wd = wd_hub_add(w, proc, parent == NULL);
  if (wd < 0) {
    int e = errno;
    close(dfd);
    if (e == ENOSPC)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "watch directory %s: inotify watch limit reached", w->root);
    else if (e == ENOMEM)
      fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    else
      fs_status_os(&w->st, "watch directory", w->root, e);
    return -1;
  }
  wnode *n = wd_node_by_wd(w, wd);
  if (n) {
    /* this directory is in the tree already (moved without our seeing
     * both halves, or a bind mount): it takes the new name unless that
     * would put it inside itself; its subtree is watched already */
    close(dfd);
    if (parent && n->parent) wd_node_move(w, n, parent, name);
    return 0;
  }
  n = wd_node_add(w, parent, name, wd);
  if (!n) {
    close(dfd);
    wd_hub_drop(w, wd);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    return -1;
  }
  if (!parent) w->rootn = n;
  if (!w->recursive && !parent) {
    close(dfd);
    return 0;
  }
  DIR *d = fdopendir(dfd);
  if (!d) {
    int e = errno;
    close(dfd);
    fs_status_os(&w->st, "watch directory", w->root, e);
    return -1;
  }
  char *rel = wd_node_rel(n);
  if (!rel) {
    closedir(d);
    fs_status_set(&w->st, RPC_RESOURCE_EXHAUSTED, "out of memory watching %s", w->root);
    return -1;
  }
  int rc = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *cn = de->d_name;
    if (cn[0] == '.' && (!cn[1] || (cn[1] == '.' && !cn[2]))) continue;
    if (watch_canceled(w)) break;
    struct stat sb;
    if (fstatat(dirfd(d), cn, &sb, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone */
    int isdir = S_ISDIR(sb.st_mode);
    if (!out && !(isdir && w->recursive)) continue;
    char *crel = wd_join_rel(rel, cn, strlen(cn));
    if (!crel) break;
    if (out) scan_report(w, dirfd(d), cn, crel, &sb, out, owner);
    if (isdir && w->recursive) {
      int cfd = openat(dirfd(d), cn, WD_OPEN_DIR);
      if (cfd < 0) {
        if (open_failed(w, crel, errno) != 0) rc = -1;
      } else if (watch_dir(w, cfd, n, cn, depth + 1, out, owner) != 0) {
        rc = -1;
      }
    }
    free(crel);
    if (rc != 0 && !out) break; /* setup fails anyway */
  }
  free(rel);
  closedir(d);
  return rc;
}

void watch_setup_work(void *data) {
  fs_watch *w = data;
  /* the root's own path may hold symlinks (the client named it); below it
   * nothing is followed */
  w->rootfd = open(w->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NONBLOCK);
  if (w->rootfd < 0) {
    int e = errno;
    struct stat sb;
    if (e == ENOTDIR && stat(w->root, &sb) == 0 && !S_ISDIR(sb.st_mode))
      fs_status_set(&w->st, RPC_INVALID_ARGUMENT, "path is not a directory: %s", w->root);
    else if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&w->st, RPC_NOT_FOUND, "path not found: %s", w->root);
    else
      fs_status_os(&w->st, "stat path", w->root, e);
    return;
  }
  struct stat sb;
  if (fstat(w->rootfd, &sb) != 0) {
    fs_status_os(&w->st, "stat path", w->root, errno);
    wd_job_release(w);
    return;
  }
  w->root_dev = sb.st_dev;
  w->root_ino = sb.st_ino;
  fs_status_clear(&w->st);
  int fd = fcntl(w->rootfd, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) fs_status_os(&w->st, "watch directory", w->root, errno);
  else watch_dir(w, fd, NULL, "", 0, NULL, NULL);
  wd_job_release(w);
}

/* A directory created or moved in, `name` in dir (open at dfd): watch it
 * and below (with out: report what it holds).  -1 when some of it could
 * not be watched. */
static int watch_new_dir(fs_watch *w, wnode *dir, int dfd, const char *name, const char *rel, wd_item ***out,
                         wd_item *owner) {
  int cfd = openat(dfd, name, WD_OPEN_DIR);
  int rc = cfd < 0 ? open_failed(w, rel, errno) : watch_dir(w, cfd, dir, name, wd_node_depth(dir) + 1, out, owner);
  if (rc != 0) LOG_DEBUG("watch: %s", w->st.msg ? w->st.msg : "out of memory");
  fs_status_clear(&w->st);
  return rc;
}

/* The subdirectories of n (open at dfd) not in the tree yet: watched, what
 * they hold reported.  -1 when some could not be. */
static int watch_missing(fs_watch *w, wnode *n, int dfd, wd_item ***out, wd_item *owner) {
  int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (!d) {
    if (fd >= 0) close(fd);
    return -1;
  }
  char *rel = wd_node_rel(n);
  int rc = rel ? 0 : -1;
  struct dirent *de;
  while (rel && (de = readdir(d)) != NULL) {
    const char *cn = de->d_name;
    struct stat sb;
    if (cn[0] == '.' && (!cn[1] || (cn[1] == '.' && !cn[2]))) continue;
    if (fstatat(dirfd(d), cn, &sb, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(sb.st_mode) || wd_node_child(w, n, cn))
      continue;
    char *crel = wd_join_rel(rel, cn, strlen(cn));
    if (!crel || watch_new_dir(w, n, dirfd(d), cn, crel, out, owner) != 0) rc = -1;
    free(crel);
  }
  free(rel);
  closedir(d);
  return rc;
}

/* A rename was followed: the lost directories that can be reopened now get
 * their missing subdirectories watched (reported after `it`). */
static void lost_retry(fs_watch *w, wd_item *it) {
  wd_item **out = &it->extra;
  while (*out) out = &(*out)->next;
  for (;;) {
    size_t i = 0;
    int dfd = -1;
    for (; i < w->nlost && (dfd = wd_node_dirfd(w, w->lost[i])) < 0; i++) {
    }
    if (i == w->nlost) return;
    wnode *n = w->lost[i];
    w->lost[i] = w->lost[--w->nlost];
    if (watch_missing(w, n, dfd, &out, it) != 0) it->ovf_after = 1;
  }
}

/* Resolve, stat and (recursive) follow one item; pool thread. */
static void watch_item_work(fs_watch *w, wd_item *it) {
  if (it->kind != WI_FS) return;
  if (w->from_pending && !((it->mask & IN_MOVED_TO) && it->cookie == w->from_cookie)) {
    if (w->from_node) wd_node_drop(w, w->from_node); /* that directory left the tree */
    w->from_node = NULL;
    w->from_pending = 0;
  }
  wnode *dir = wd_node_by_wd(w, it->wd);
  if (!dir) {
    it->kind = WI_SKIP; /* a watch already dropped */
    return;
  }
  uint32_t m = it->mask;
  if (m & IN_IGNORED) {
    int is_root = dir == w->rootn;
    if (!is_root) wd_node_drop(w, dir); /* (the root's go with the stream) */
    it->kind = is_root ? WI_END : WI_SKIP;
    return;
  }
  if (m & (IN_DELETE_SELF | IN_MOVE_SELF)) {
    if (dir != w->rootn) {
      it->kind = WI_SKIP; /* the parent's event tells */
      return;
    }
    it->rel = ".";
    it->type = (m & IN_DELETE_SELF) ? PB__EVENT_TYPE__EVENT_TYPE_REMOVE : PB__EVENT_TYPE__EVENT_TYPE_RENAME;
    if (m & IN_MOVE_SELF) it->end_after = 1; /* (DELETE_SELF: IN_IGNORED follows) */
    return;
  }
  if (!it->namelen) {
    it->kind = WI_SKIP; /* IN_UNMOUNT and the like: IN_IGNORED follows */
    return;
  }
  char *drel = wd_node_rel(dir);
  char *rel = drel ? wd_join_rel(drel, it->name, it->namelen) : NULL;
  free(drel);
  it->full = rel ? wd_join_full(w, rel) : NULL;
  if (!it->full) {
    free(rel);
    it->kind = WI_SKIP;
    return;
  }
  it->rel = it->full + (strlen(it->full) - strlen(rel));
  if (w->nseen && (m & (IN_CREATE | IN_DELETE | IN_MOVED_FROM)) && seen_take(w, it->rel) &&
      (m & IN_CREATE)) {
    it->kind = WI_SKIP; /* a scan reported it already */
    free(rel);
    return;
  }
  int want_entry = 1;
  if (m & IN_CREATE) it->type = PB__EVENT_TYPE__EVENT_TYPE_CREATE;
  else if (m & IN_MODIFY) it->type = PB__EVENT_TYPE__EVENT_TYPE_WRITE;
  else if (m & IN_ATTRIB) it->type = PB__EVENT_TYPE__EVENT_TYPE_CHMOD;
  else if (m & IN_DELETE) it->type = PB__EVENT_TYPE__EVENT_TYPE_REMOVE, want_entry = 0;
  else if (m & IN_MOVED_FROM) it->type = PB__EVENT_TYPE__EVENT_TYPE_RENAME, want_entry = 0;
  else if (m & IN_MOVED_TO) it->type = PB__EVENT_TYPE__EVENT_TYPE_RENAME;
  else it->kind = WI_SKIP;
  int follow = w->recursive && (m & IN_ISDIR) && it->kind == WI_FS;
  /* the directory is reached from the root by descriptor, never by path */
  int dfd = (want_entry && it->kind == WI_FS) || (follow && !(m & IN_MOVED_FROM)) ? wd_node_dirfd(w, dir) : -1;
  if (want_entry && it->kind == WI_FS && dfd >= 0) {
    struct stat sb;
    if (fstatat(dfd, it->name, &sb, 0) == 0 || fstatat(dfd, it->name, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
      fs_entry_fill(&it->e, &sb);
      it->e.path = it->full;
      it->e.name = fs_path_base(it->full);
      it->has_entry = 1;
    }
  }
  if (follow) {
    if (m & IN_MOVED_FROM) {
      w->from_pending = 1;
      w->from_cookie = it->cookie;
      w->from_node = wd_node_child(w, dir, it->name);
    } else if ((m & IN_MOVED_TO) && w->from_pending && it->cookie == w->from_cookie && w->from_node) {
      /* moved inside the tree: the subtree keeps its watches */
      if (wd_node_move(w, w->from_node, dir, it->name) != 0) wd_node_drop(w, w->from_node);
      w->from_node = NULL;
      w->from_pending = 0;
      if (w->nlost) lost_retry(w, it);
    } else if (m & (IN_CREATE | IN_MOVED_TO)) {
      w->from_pending = 0; /* (a pending one whose directory was not watched) */
      wd_item **out = &it->extra;
      /* a part that cannot be watched: say events may be lost */
      if (dfd < 0) {
        /* the parent is not where the tree says: removed or moved, and its
         * own events follow — if it was renamed, retry after that */
        size_t i = 0;
        while (i < w->nlost && w->lost[i] != dir) i++;
        if (i == w->nlost && w->nlost < WD_LOST_MAX) w->lost[w->nlost++] = dir;
        else if (i == w->nlost) it->ovf_after = 1;
      } else if (watch_new_dir(w, dir, dfd, it->name, rel, (m & IN_CREATE) ? &out : NULL, it) != 0) {
        it->ovf_after = 1;
      }
    }
  }
  free(rel);
}

void watch_items_work(void *data) {
  fs_watch *w = data;
  w->scan_left = WD_SCAN_MAX;
  wd_item *it = w->job_first;
  for (size_t i = 0; i < w->job_n; i++) {
    w->items_seen++;
    watch_item_work(w, it);
    if (i + 1 < w->job_n) it = it->next; /* the last one's next is the loop's */
  }
  wd_job_release(w);
}

void watch_close_work(void *data) {
  fs_watch *w = data;
  wd_job_release(w);
  if (w->rootn) wd_node_drop(w, w->rootn);
  free(w->by_wd);
  free(w->by_name);
  w->by_wd = w->by_name = NULL;
  w->tab_cap = 0;
}
