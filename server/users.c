/* users — see users.h. */
#include "server/users.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include "core/daemon.h"
#include "core/log.h"
#include "core/pool.h"
#include "server/ident.h"

#define PASSWD_PATH "/etc/passwd"
#define GROUP_PATH "/etc/group"

/* ------------------------------------------------------------ the header */

static int parse_id(const char *s, size_t n, uint32_t *out) {
  if (n == 0 || n > 10) return -1;
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -1;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v > 4294967294u) return -1; /* (uid_t)-1 means "unchanged" to the kernel */
  *out = (uint32_t)v;
  return 0;
}

int users_spec_parse(const char *text, users_spec *out) {
  size_t n = strlen(text);
  if (n == 0 || n > USERS_MAX_SPEC - 1) return -1;
  out->text = text;
  const char *colon = strchr(text, ':');
  if (colon) {
    out->form = USERS_UIDGID;
    return parse_id(text, (size_t)(colon - text), &out->uid) ||
                   parse_id(colon + 1, n - (size_t)(colon - text) - 1, &out->gid)
               ? -1
               : 0;
  }
  if (parse_id(text, n, &out->uid) == 0) {
    out->form = USERS_UID;
    return 0;
  }
  int digits = 1;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)text[i];
    if (ch <= ' ' || ch == 0x7f || ch == ',' || ch == '/') return -1;
    if (ch < '0' || ch > '9') digits = 0;
  }
  if (digits || text[0] == '-') return -1; /* a uid out of range, an option-like name */
  out->form = USERS_NAME;
  return 0;
}

/* ------------------------------------------------------------ the table */

typedef struct pw_ent {
  const char *name, *home;
  uint32_t uid, gid;
} pw_ent;

typedef struct gr_ent {
  const char *members; /* "a,b,c" */
  uint32_t gid;
} gr_ent;

struct users_tab {
  char *pbuf, *gbuf;
  pw_ent *pw;
  size_t npw;
  gr_ent *gr;
  size_t ngr;
};

/* Split buf (NUL-terminated copy) into lines of at least nf ':' fields;
 * calls add(fields) for each; -1 when out of memory. */
static size_t split_fields(char *line, char **f, size_t max) {
  size_t n = 0;
  f[n++] = line;
  for (char *p = line; *p && n < max; p++)
    if (*p == ':') {
      *p = 0;
      f[n++] = p + 1;
    }
  return n;
}

static char *copy_buf(const char *s, size_t n) {
  char *b = malloc(n + 1);
  if (!b) return NULL;
  if (n) memcpy(b, s, n);
  b[n] = 0;
  return b;
}

/* The lines of b, each NUL-terminated in place; *n of them. */
static char **lines_of(char *b, size_t *n) {
  size_t cap = 1;
  for (char *p = b; *p; p++) cap += *p == '\n';
  char **v = malloc(cap * sizeof *v);
  if (!v) return NULL;
  *n = 0;
  for (char *p = b; *p;) {
    char *e = strchr(p, '\n');
    if (e) *e = 0;
    v[(*n)++] = p;
    if (!e) break;
    p = e + 1;
  }
  return v;
}

users_tab *users_tab_new(const char *passwd, size_t plen, const char *group, size_t glen) {
  users_tab *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  t->pbuf = copy_buf(passwd ? passwd : "", passwd ? plen : 0);
  t->gbuf = copy_buf(group ? group : "", group ? glen : 0);
  size_t np = 0, ng = 0;
  char **pl = t->pbuf ? lines_of(t->pbuf, &np) : NULL, **gl = t->gbuf ? lines_of(t->gbuf, &ng) : NULL;
  t->pw = calloc(np + 1, sizeof *t->pw);
  t->gr = calloc(ng + 1, sizeof *t->gr);
  if (!pl || !gl || !t->pw || !t->gr) {
    free(pl);
    free(gl);
    users_tab_free(t);
    return NULL;
  }
  for (size_t i = 0; i < np; i++) { /* name:passwd:uid:gid:gecos:home:shell */
    char *f[7];
    uint32_t uid, gid;
    if (split_fields(pl[i], f, 7) < 6 || !f[0][0] || f[0][0] == '+' || f[0][0] == '-' ||
        parse_id(f[2], strlen(f[2]), &uid) || parse_id(f[3], strlen(f[3]), &gid))
      continue;
    t->pw[t->npw++] = (pw_ent){.name = f[0], .home = f[5][0] ? f[5] : "/", .uid = uid, .gid = gid};
  }
  for (size_t i = 0; i < ng; i++) { /* name:passwd:gid:members */
    char *f[4];
    uint32_t gid;
    if (split_fields(gl[i], f, 4) < 4 || !f[0][0] || f[0][0] == '+' || f[0][0] == '-' ||
        parse_id(f[2], strlen(f[2]), &gid))
      continue;
    t->gr[t->ngr++] = (gr_ent){.members = f[3], .gid = gid};
  }
  free(pl);
  free(gl);
  return t;
}

void users_tab_free(users_tab *t) {
  if (!t) return;
  free(t->pbuf);
  free(t->gbuf);
  free(t->pw);
  free(t->gr);
  free(t);
}

static int cmp_u32(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

/* 1 when the comma-separated list names name. */
static int lists(const char *list, const char *name, size_t nl) {
  for (const char *p = list; *p;) {
    const char *e = strchr(p, ',');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == nl && memcmp(p, name, nl) == 0) return 1;
    if (!e) break;
    p = e + 1;
  }
  return 0;
}

rpc_ident *users_tab_resolve(const users_tab *t, const users_spec *sp, int *unknown, int *miss) {
  *unknown = *miss = 0;
  const pw_ent *e = NULL;
  for (size_t i = 0; i < t->npw && !e; i++)
    if (sp->form == USERS_NAME ? strcmp(t->pw[i].name, sp->text) == 0 : t->pw[i].uid == sp->uid)
      e = &t->pw[i];
  if (!e && sp->form == USERS_NAME) {
    *unknown = 1;
    return NULL;
  }
  *miss = e == NULL;
  uint32_t uid = e ? e->uid : sp->uid;
  uint32_t gid = sp->form == USERS_UIDGID ? sp->gid : e ? e->gid : sp->uid;
  const char *name = e ? e->name : sp->text, *home = e ? e->home : "/";
  uint32_t *groups = NULL;
  size_t ng = 0;
  if (e && sp->form != USERS_UIDGID) { /* uid:gid: as given, no supplementary groups */
    size_t nl = strlen(e->name);
    groups = malloc((t->ngr + 1) * sizeof *groups);
    if (!groups) return NULL;
    for (size_t i = 0; i < t->ngr; i++)
      if (lists(t->gr[i].members, e->name, nl)) groups[ng++] = t->gr[i].gid;
    /* each gid once: sorted, then adjacent duplicates dropped (linear
     * after the sort, whatever a hostile /etc/group holds) */
    qsort(groups, ng, sizeof *groups, cmp_u32);
    size_t k = 0;
    for (size_t i = 0; i < ng; i++)
      if (k == 0 || groups[k - 1] != groups[i]) groups[k++] = groups[i];
    ng = k < USERS_MAX_GROUPS ? k : USERS_MAX_GROUPS;
  }
  rpc_ident *id = ident_new(uid, gid, name, home, groups, ng);
  free(groups);
  if (id) id->has_entry = e != NULL;
  return id;
}

/* ------------------------------------------------------------ reading the files */

typedef struct file_sig {
  int ok; /* stat succeeded */
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
} file_sig;

typedef struct snap {
  file_sig ps, gs;
} snap;

static void sig_of(const char *path, file_sig *s) {
  struct stat st;
  memset(s, 0, sizeof *s);
  if (stat(path, &st) != 0) return;
  *s = (file_sig){1, st.st_dev, st.st_ino, st.st_size, st.st_mtim, st.st_ctim};
}

static int sig_eq(const file_sig *a, const file_sig *b) {
  return a->ok == b->ok && a->dev == b->dev && a->ino == b->ino && a->size == b->size &&
         a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
         a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

/* At most USERS_MAX_FILE bytes of path (malloc'd, *n): 0; -1 when the
 * file is missing (*buf NULL: an empty table); -2 on any other failure (a
 * descriptor limit, memory, a read error), which must not pass for an
 * empty file.  A file cut at the limit loses its partial last line. */
static int read_file(const char *path, char **buf, size_t *n) {
  *buf = NULL;
  *n = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return errno == ENOENT || errno == ENOTDIR ? -1 : -2;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return -2;
  }
  size_t cap = st.st_size > 0 && (size_t)st.st_size < USERS_MAX_FILE ? (size_t)st.st_size + 1 : 65536;
  char *b = malloc(cap);
  size_t len = 0;
  int rc = b ? 0 : -2;
  while (b && len < USERS_MAX_FILE) {
    if (len == cap) {
      size_t nc = cap * 2 > USERS_MAX_FILE ? USERS_MAX_FILE : cap * 2;
      char *q = realloc(b, nc);
      if (!q) {
        rc = -2;
        break;
      }
      b = q;
      cap = nc;
    }
    ssize_t r = read(fd, b + len, cap - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) rc = -2;
    if (r <= 0) break;
    len += (size_t)r;
  }
  close(fd);
  if (rc != 0) {
    free(b);
    return rc;
  }
  if (len == USERS_MAX_FILE) /* cut: the last line may be partial */
    while (len && b[len - 1] != '\n') len--;
  *buf = b;
  *n = len;
  return 0;
}

/* Read both files: the table and their signatures (pool, or the caller's
 * thread); NULL when either could not be read whole (not when missing). */
static users_tab *load(snap *s) {
  sig_of(PASSWD_PATH, &s->ps);
  sig_of(GROUP_PATH, &s->gs);
  size_t pn = 0, gn = 0;
  char *p, *g;
  int pr = read_file(PASSWD_PATH, &p, &pn), gr = read_file(GROUP_PATH, &g, &gn);
  users_tab *t = pr == -2 || gr == -2 ? NULL : users_tab_new(p, pn, g, gn);
  free(p);
  free(g);
  return t;
}

/* ------------------------------------------------------------ the loop's cache */

static struct {
  users_tab *tab;          /* NULL: never read */
  snap sig;                /* of tab */
  int stale;               /* an fs event named a file since tab was read */
  unsigned gen;            /* fs events seen */
  int watching;            /* the fs_event on /etc runs */
  int job;                 /* a read is in the pool */
  unsigned started;        /* reads started: a waiter is answered by one that started after it queued */
  uint64_t verified_at;    /* uv_now when the files were last compared */
  list_node queue;         /* waiting for it, oldest first */
  uv_fs_event_t ev;
} U;

static void queue_add(users_wait *w) { list_insert_tail(&U.queue, &w->link); }

void users_cancel(users_wait *w) { list_remove(&w->link); }

static void on_etc_event(uv_fs_event_t *h, const char *name, int events, int status) {
  (void)h;
  (void)events;
  /* passwd, group and their siblings (passwd+, group.lock, …): a rename
   * into place shows as one of them */
  if (status < 0 || !name || !strncmp(name, "passwd", 6) || !strncmp(name, "group", 5)) {
    U.stale = 1;
    U.gen++;
  }
}

/* The watch on /etc, once (after PID 1's chroot: the first request). */
static void watch_etc(void) {
  if (U.watching) return;
  U.watching = 2; /* no events: the recheck alone */
  if (uv_fs_event_init(conch.loop, &U.ev) != 0) {
    LOG_WARN("cannot watch /etc: users are compared with the files every %d ms", USERS_RECHECK_MS);
    return;
  }
  if (uv_fs_event_start(&U.ev, on_etc_event, "/etc", 0) != 0) {
    LOG_WARN("cannot watch /etc: users are compared with the files every %d ms", USERS_RECHECK_MS);
    uv_close((uv_handle_t *)&U.ev, NULL);
    return;
  }
  uv_unref((uv_handle_t *)&U.ev);
  U.watching = 1;
}

typedef struct read_job {
  pool_job job; /* first */
  unsigned gen; /* U.gen when it started */
  unsigned no;  /* its number (U.started) */
  snap old, now;
  int had;
  int failed;     /* the files could not be read: the old table stays */
  users_tab *tab; /* read anew, or NULL: unchanged (or failed) */
} read_job;

static void read_run(pool_job *pj) {
  read_job *j = (read_job *)pj;
  snap s;
  sig_of(PASSWD_PATH, &s.ps);
  sig_of(GROUP_PATH, &s.gs);
  if (j->had && sig_eq(&s.ps, &j->old.ps) && sig_eq(&s.gs, &j->old.gs)) return; /* unchanged */
  j->tab = load(&j->now);
  j->failed = j->tab == NULL;
}

static users_status resolve_in(const users_tab *t, const char *text, const rpc_ident **out, int *miss) {
  users_spec sp;
  if (users_spec_parse(text, &sp) != 0) return USERS_INVALID;
  int unknown;
  rpc_ident *id = users_tab_resolve(t, &sp, &unknown, miss);
  if (!id) return unknown ? USERS_UNKNOWN : USERS_ERROR;
  *out = id;
  return USERS_OK;
}

static int read_start(void);

/* Answer every waiter queued before job `no` started; the others wait for
 * the next read (started here). */
static void answer_waiters(unsigned no) {
  users_wait *w, *next;
  list_each_safe(w, next, &U.queue, link) {
    if (w->after < no) {
      users_cancel(w);
      const rpc_ident *id = NULL;
      int miss;
      users_status st = U.tab ? resolve_in(U.tab, w->spec, &id, &miss) : USERS_ERROR;
      w->done(w, st, st == USERS_OK ? id : NULL);
    }
  }
  if (!list_empty(&U.queue) && read_start() != 0)
    while ((w = list_first_entry(&U.queue, users_wait, link))) {
      users_cancel(w);
      w->done(w, USERS_ERROR, NULL);
    }
}

static void read_done(pool_job *pj, int canceled) {
  read_job *j = (read_job *)pj;
  unsigned gen = j->gen, no = j->no;
  int failed = j->failed || canceled;
  U.job = 0;
  if (j->tab) {
    users_tab_free(U.tab);
    U.tab = j->tab;
    U.sig = j->now;
  }
  free(j);
  if (failed) {
    LOG_WARN("cannot read %s and %s: %s", PASSWD_PATH, GROUP_PATH,
             U.tab ? "the last table read answers" : "requests that name a user fail");
  } else {
    U.verified_at = uv_now(conch.loop);
    if (U.gen == gen) U.stale = 0; /* no event since it started */
  }
  answer_waiters(no);
}

/* 0, or -1 when no job could be queued. */
static int read_start(void) {
  if (U.job) return 0;
  read_job *j = calloc(1, sizeof *j);
  if (!j) return -1;
  j->had = U.tab != NULL;
  j->old = U.sig;
  j->gen = U.gen;
  j->no = ++U.started;
  pool_submit(&j->job, read_run, read_done); /* as root, the loop's thread pool (core/pool.h) */
  U.job = 1;
  return 0;
}

users_status users_resolve(const char *text, const rpc_ident **out, users_wait *w) {
  users_spec sp;
  if (users_spec_parse(text, &sp) != 0) return USERS_INVALID;
  watch_etc();
  int fresh = U.tab && !U.stale && U.watching == 1 &&
              uv_now(conch.loop) - U.verified_at < USERS_RECHECK_MS;
  if (fresh) {
    int miss = 0;
    const rpc_ident *id = NULL;
    users_status st = resolve_in(U.tab, text, &id, &miss);
    if (st == USERS_OK && !miss) {
      *out = id;
      return USERS_OK;
    }
    if (st == USERS_OK) rpc_ident_release(id); /* no entry: ask the files first */
    else if (st != USERS_UNKNOWN) return st;  /* out of memory */
  }
  snprintf(w->spec, sizeof w->spec, "%s", text);
  queue_add(w);
  w->after = U.started; /* a read already out may have read the files before this request */
  if (read_start() != 0) {
    users_cancel(w);
    return USERS_ERROR;
  }
  return USERS_PENDING;
}

users_status users_resolve_now(const char *text, const rpc_ident **out) {
  users_spec sp;
  if (users_spec_parse(text, &sp) != 0) return USERS_INVALID;
  snap s;
  users_tab *t = load(&s);
  if (!t) return USERS_ERROR;
  int miss;
  users_status st = resolve_in(t, text, out, &miss);
  users_tab_free(t);
  return st;
}
