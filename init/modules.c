/* modules — kernel module loading; see modules.h. */
#include "init/modules.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "init/bootutil.h"

#ifndef MODULE_INIT_COMPRESSED_FILE
#define MODULE_INIT_COMPRESSED_FILE 4
#endif
#define MODULES_MAX_DEPTH 64
#define MODULES_NAME_MAX 64

/* One line of modules.dep (or of modules.builtin: builtin set, no deps). */
typedef struct mod_entry {
  char name[MODULES_NAME_MAX]; /* normalised: basename, no .ko…, '-' → '_' */
  const char *path;            /* into the plan's private copy of the text */
  const char **deps;
  size_t ndeps;
  int builtin;
  int state; /* 0 new, 1 on the current descent, 2 planned */
} mod_entry;

typedef struct plan {
  mod_entry *e;
  size_t n;
  const modules_plan_ops *ops;
  int planned;
} plan;

/* The module name of a path or a requested name (truncated names cannot
 * match a real module, whose names are shorter than MODULES_NAME_MAX). */
static void mod_name(const char *s, size_t len, char out[MODULES_NAME_MAX]) {
  const char *slash = memrchr(s, '/', len);
  if (slash) {
    len -= (size_t)(slash + 1 - s);
    s = slash + 1;
  }
  for (size_t i = 0; i + 3 <= len; i++)
    if (memcmp(s + i, ".ko", 3) == 0 && (i + 3 == len || s[i + 3] == '.')) {
      len = i;
      break;
    }
  if (len >= MODULES_NAME_MAX) len = MODULES_NAME_MAX - 1;
  for (size_t i = 0; i < len; i++) out[i] = s[i] == '-' ? '_' : s[i];
  out[len] = 0;
}

static int entry_cmp(const void *a, const void *b) {
  const mod_entry *x = a, *y = b;
  int c = strcmp(x->name, y->name);
  if (c) return c;
  return (x->builtin > y->builtin) - (x->builtin < y->builtin); /* a module before a builtin */
}

static mod_entry *lookup(plan *p, const char *name) {
  mod_entry key;
  snprintf(key.name, sizeof key.name, "%s", name);
  size_t lo = 0, hi = p->n;
  while (lo < hi) { /* the first entry of that name */
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(p->e[mid].name, key.name) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo < p->n && strcmp(p->e[lo].name, key.name) == 0 ? &p->e[lo] : NULL;
}

static size_t count_lines(const char *t, size_t n) {
  size_t c = 1;
  for (size_t i = 0; i < n; i++) c += t[i] == '\n';
  return c;
}

/* Tokenise text (a private, writable copy) into entries.  A modules.dep
 * line is "path: dep dep …"; a modules.builtin line is "path". */
static int add_lines(plan *p, char *t, size_t n, int builtin) {
  char *end = t + n;
  while (t < end) {
    char *nl = memchr(t, '\n', (size_t)(end - t));
    char *le = nl ? nl : end;
    *le = 0;
    char *colon = builtin ? NULL : strchr(t, ':');
    char *pe = colon ? colon : le;
    while (pe > t && (pe[-1] == ' ' || pe[-1] == '\t' || pe[-1] == '\r')) pe--;
    if (pe > t && (builtin || colon)) {
      mod_entry *e = &p->e[p->n++];
      memset(e, 0, sizeof *e);
      *pe = 0;
      mod_name(t, (size_t)(pe - t), e->name);
      e->path = t;
      e->builtin = builtin;
      if (colon) {
        size_t cap = 1; /* at most one dependency per blank, plus one */
        for (char *q = colon + 1; *q; q++) cap += *q == ' ' || *q == '\t';
        if (cap) {
          e->deps = calloc(cap, sizeof *e->deps);
          if (!e->deps) return -1;
          for (char *s = strtok(colon + 1, " \t\r"); s && e->ndeps < cap; s = strtok(NULL, " \t\r"))
            e->deps[e->ndeps++] = s;
        }
      }
    }
    t = le + 1;
  }
  return 0;
}

/* Plan e: its dependencies (modules.dep lists them so that the last loads
 * first, as modprobe reads it), then e itself. */
static void visit(plan *p, mod_entry *e, int depth) {
  if (e->state == 2) return;
  if (e->state == 1) {
    p->ops->warn(p->ops->arg, e->name, "dependency cycle");
    return;
  }
  if (depth > MODULES_MAX_DEPTH) {
    p->ops->warn(p->ops->arg, e->name, "dependencies nested too deep");
    return;
  }
  e->state = 1;
  for (size_t i = e->ndeps; i-- > 0;) {
    char dn[MODULES_NAME_MAX];
    mod_name(e->deps[i], strlen(e->deps[i]), dn);
    mod_entry *d = lookup(p, dn);
    if (!d || d->builtin) {
      if (!d) p->ops->warn(p->ops->arg, dn, "dependency not in modules.dep");
      continue;
    }
    visit(p, d, depth + 1);
  }
  e->state = 2;
  if (p->planned < MODULES_MAX_LOAD) {
    p->planned++;
    p->ops->load(p->ops->arg, e->path);
  } else {
    p->ops->warn(p->ops->arg, e->name, "too many modules");
  }
}

int modules_plan(const char *dep, size_t deplen, const char *builtin, size_t builtinlen,
                 const char *const *names, size_t n, const modules_plan_ops *ops) {
  if (!dep) deplen = 0;
  if (!builtin) builtinlen = 0;
  plan p = {.ops = ops};
  int rc = -1;
  char *copy = malloc(deplen + builtinlen + 2);
  p.e = calloc(count_lines(dep, deplen) + count_lines(builtin, builtinlen), sizeof *p.e);
  if (!copy || !p.e) goto out;
  if (deplen) memcpy(copy, dep, deplen);
  copy[deplen] = 0;
  if (builtinlen) memcpy(copy + deplen + 1, builtin, builtinlen);
  copy[deplen + 1 + builtinlen] = 0;
  if (add_lines(&p, copy, deplen, 0) != 0 ||
      add_lines(&p, copy + deplen + 1, builtinlen, 1) != 0)
    goto out;
  qsort(p.e, p.n, sizeof *p.e, entry_cmp);
  for (size_t i = 0; i < n; i++) {
    char nm[MODULES_NAME_MAX];
    mod_name(names[i], strlen(names[i]), nm);
    mod_entry *e = lookup(&p, nm);
    if (!e) ops->warn(ops->arg, names[i], "not found");
    else if (e->builtin) ops->builtin(ops->arg, nm);
    else visit(&p, e, 0);
  }
  rc = p.planned;
out:
  if (p.e)
    for (size_t i = 0; i < p.n; i++) free(p.e[i].deps);
  free(p.e);
  free(copy);
  return rc;
}

size_t modules_split(const char *t, size_t len, void (*fn)(void *arg, const char *name, size_t n),
                     void *arg) {
  size_t cnt = 0, i = 0;
  while (i < len) {
    char c = t[i];
    if (c == '#') {
      while (i < len && t[i] != '\n') i++;
      continue;
    }
    if (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      i++;
      continue;
    }
    size_t s = i;
    while (i < len && !strchr(",# \t\n\r", t[i]) && t[i]) i++;
    if (i == s) { /* a NUL byte */
      i++;
      continue;
    }
    fn(arg, t + s, i - s);
    cnt++;
  }
  return cnt;
}

/* ------------------------------------------------------------ loading */

typedef struct load_ctx {
  const char *moddir;
  char *names[MODULES_MAX_LOAD];
  size_t nnames;
  int loaded, present, failed;
} load_ctx;

static void add_name(void *arg, const char *name, size_t n) {
  load_ctx *c = arg;
  if (c->nnames == MODULES_MAX_LOAD) return;
  char *s = strndup(name, n);
  if (s) c->names[c->nnames++] = s;
}

static int has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

static void load_one(void *arg, const char *path) {
  load_ctx *c = arg;
  char full[512];
  char nm[MODULES_NAME_MAX];
  mod_name(path, strlen(path), nm);
  if (snprintf(full, sizeof full, "%s/%s", c->moddir, path) >= (int)sizeof full) {
    LOG_WARN("kernel module %s: path too long", nm);
    c->failed++;
    return;
  }
  int fd = open(full, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    LOG_WARN("kernel module %s: open %s: %s", nm, full, strerror(errno));
    c->failed++;
    return;
  }
  int flags = (has_suffix(path, ".xz") || has_suffix(path, ".zst") || has_suffix(path, ".gz"))
                  ? MODULE_INIT_COMPRESSED_FILE
                  : 0;
  long r = syscall(SYS_finit_module, fd, "", flags);
  int e = errno;
  close(fd);
  if (r == 0) c->loaded++;
  else if (e == EEXIST) c->present++;
  else {
    LOG_WARN("kernel module %s: load failed: %s", nm, strerror(e));
    c->failed++;
  }
}

static void on_builtin(void *arg, const char *name) { ((load_ctx *)arg)->present++; }

static void on_warn(void *arg, const char *name, const char *why) {
  ((load_ctx *)arg)->failed++;
  LOG_WARN("kernel module %s: %s", name, why);
}

int modules_load(const char *cmdline_list, const char *list_path, const char *moddir) {
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  load_ctx c = {0};
  if (cmdline_list) modules_split(cmdline_list, strlen(cmdline_list), add_name, &c);
  size_t n;
  char *list = list_path ? boot_read_file(list_path, &n) : NULL;
  if (list) {
    modules_split(list, n, add_name, &c);
    free(list);
  }
  if (c.nnames == 0) return 0; /* no module list: nothing to load */
  char dir[300];
  if (!moddir) {
    struct utsname u;
    uname(&u);
    snprintf(dir, sizeof dir, "/lib/modules/%s", u.release);
    moddir = dir;
  }
  c.moddir = moddir;
  char path[400];
  size_t deplen = 0, blen = 0;
  snprintf(path, sizeof path, "%s/modules.dep", moddir);
  char *dep = boot_read_file(path, &deplen);
  if (!dep) LOG_WARN("kernel modules: cannot read %s: %s", path, strerror(errno));
  snprintf(path, sizeof path, "%s/modules.builtin", moddir);
  char *builtin = boot_read_file(path, &blen);
  modules_plan_ops ops = {load_one, on_builtin, on_warn, &c};
  if (modules_plan(dep, deplen, builtin, blen, (const char *const *)c.names, c.nnames, &ops) < 0)
    LOG_WARN("kernel modules: out of memory planning the load order");
  free(dep);
  free(builtin);
  for (size_t i = 0; i < c.nnames; i++) free(c.names[i]);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
  LOG_INFO("kernel modules: %d loaded, %d built in or already loaded, %d failed (%zu named) in %.1f ms",
           c.loaded, c.present, c.failed, c.nnames, ms);
  return c.loaded;
}
