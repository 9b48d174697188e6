/* reflect/descdb — see descdb.h. */
#include "reflect/descdb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- wire reader */

typedef struct wr {
  const uint8_t *p, *end;
} wr;

static int wr_varint(wr *r, uint64_t *v) {
  uint64_t x = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (r->p == r->end) return -1;
    uint8_t b = *r->p++;
    x |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = x;
      return 0;
    }
  }
  return -1;
}

/* The next field: 1 (num, and for wire type 2 its bytes in *val and *vlen, for
 * a varint its value in *iv), 0 at the end, -1 when malformed. */
static int wr_next(wr *r, uint32_t *num, const uint8_t **val, size_t *vlen, uint64_t *iv) {
  if (r->p == r->end) return 0;
  uint64_t key, n;
  if (wr_varint(r, &key) != 0 || (key >> 3) == 0 || (key >> 3) > 0x1fffffff) return -1;
  *num = (uint32_t)(key >> 3);
  *val = NULL;
  *vlen = 0;
  *iv = 0;
  switch (key & 7) {
    case 0: return wr_varint(r, iv) == 0 ? 1 : -1;
    case 1: n = 8; break;
    case 5: n = 4; break;
    case 2:
      if (wr_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p)) return -1;
      *val = r->p;
      *vlen = (size_t)n;
      r->p += n;
      return 1;
    default: return -1; /* groups: descriptor.proto has none */
  }
  if (n > (uint64_t)(r->end - r->p)) return -1;
  r->p += n;
  return 1;
}

/* A reader over the bytes [p, p+n). */
#define WR_INIT(p, n) {(p), (p) + (n)}

/* ---------------------------------------------------------------- building */

typedef struct build {
  descdb *db;
  size_t symcap, extcap;
  int file;
} build;

/* "scope.name" (or "name" for the empty scope); NULL when out of memory. */
static char *join(const char *scope, const uint8_t *name, size_t nlen) {
  size_t sl = strlen(scope);
  char *s = malloc(sl + 1 + nlen + 1);
  if (!s) return NULL;
  size_t o = 0;
  if (sl) {
    memcpy(s, scope, sl);
    s[sl] = '.';
    o = sl + 1;
  }
  memcpy(s + o, name, nlen);
  s[o + nlen] = 0;
  return s;
}

/* A name must be a non-empty string without NUL or dots. */
static int name_ok(const uint8_t *n, size_t l) {
  if (!n || !l) return 0;
  for (size_t i = 0; i < l; i++)
    if (n[i] == 0 || n[i] == '.') return 0;
  return 1;
}

/* Add scope.name as a symbol; its full name in *out (owned by the db). */
static int add_sym(build *b, const char *scope, const uint8_t *name, size_t nlen, descdb_kind kind,
                   const char **out) {
  if (!name_ok(name, nlen)) return -1;
  descdb *db = b->db;
  if (db->nsyms == b->symcap) {
    size_t cap = b->symcap ? b->symcap * 2 : 64;
    descdb_sym *q = realloc(db->syms, cap * sizeof *q);
    if (!q) return -1;
    db->syms = q;
    b->symcap = cap;
  }
  char *full = join(scope, name, nlen);
  if (!full) return -1;
  db->syms[db->nsyms++] = (descdb_sym){full, b->file, kind};
  if (out) *out = full;
  return 0;
}

/* The name field (1) of a descriptor message, or -1. */
static int find_name(const uint8_t *p, size_t n, const uint8_t **name, size_t *nlen) {
  wr r = WR_INIT(p, n);
  uint32_t num;
  const uint8_t *v;
  size_t vl;
  uint64_t iv;
  int k;
  *name = NULL;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1)
    if (num == 1 && v) *name = v, *nlen = vl;
  return k == 0 && *name ? 0 : -1;
}

/* FieldDescriptorProto as an extension: 2 extendee, 3 number. */
static int add_extension(build *b, const char *scope, const uint8_t *p, size_t n) {
  const uint8_t *name, *ext = NULL;
  size_t nlen, elen = 0;
  if (find_name(p, n, &name, &nlen) != 0 || add_sym(b, scope, name, nlen, DESCDB_EXTENSION, NULL) != 0)
    return -1;
  wr r = WR_INIT(p, n);
  uint32_t num;
  const uint8_t *v;
  size_t vl;
  uint64_t iv, number = 0;
  int k;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
    if (num == 2 && v) ext = v, elen = vl;
    if (num == 3 && !v) number = iv;
  }
  if (k != 0 || !ext || elen < 2 || ext[0] != '.' || memchr(ext, 0, elen) || number == 0 || number > 0x1fffffff)
    return -1;
  descdb *db = b->db;
  if (db->nexts == b->extcap) {
    size_t cap = b->extcap ? b->extcap * 2 : 8;
    descdb_ext *q = realloc(db->exts, cap * sizeof *q);
    if (!q) return -1;
    db->exts = q;
    b->extcap = cap;
  }
  char *e = malloc(elen);
  if (!e) return -1;
  memcpy(e, ext + 1, elen - 1); /* protoc writes it fully qualified: ".pkg.Msg" */
  e[elen - 1] = 0;
  db->exts[db->nexts++] = (descdb_ext){e, (int32_t)number, b->file};
  return 0;
}

/* Every field `num` of the message p is a sub-message with a name (field
 * 1): one symbol of `kind` for each, under scope (enum values, methods). */
static int add_named(build *b, const char *scope, const uint8_t *p, size_t n, uint32_t want,
                     descdb_kind kind) {
  wr r = WR_INIT(p, n);
  uint32_t num;
  const uint8_t *v;
  size_t vl;
  uint64_t iv;
  int k;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
    if (num != want || !v) continue;
    const uint8_t *cn;
    size_t cnl;
    if (find_name(v, vl, &cn, &cnl) != 0 || add_sym(b, scope, cn, cnl, kind, NULL) != 0) return -1;
  }
  return k;
}

/* EnumDescriptorProto: 1 name, 2 value (EnumValueDescriptorProto, 1 name).
 * Values are scoped beside the enum, not inside it. */
static int add_enum(build *b, const char *scope, const uint8_t *p, size_t n) {
  const uint8_t *name;
  size_t nlen;
  if (find_name(p, n, &name, &nlen) != 0 || add_sym(b, scope, name, nlen, DESCDB_ENUM, NULL) != 0)
    return -1;
  return add_named(b, scope, p, n, 2, DESCDB_ENUM_VALUE);
}

/* DescriptorProto: 1 name, 2 field, 3 nested_type, 4 enum_type,
 * 6 extension, 8 oneof_decl. */
static int add_message(build *b, const char *scope, const uint8_t *p, size_t n, int depth) {
  const uint8_t *name;
  size_t nlen;
  const char *full;
  if (depth > 32 || find_name(p, n, &name, &nlen) != 0 ||
      add_sym(b, scope, name, nlen, DESCDB_MESSAGE, &full) != 0)
    return -1;
  wr r = WR_INIT(p, n);
  uint32_t num;
  const uint8_t *v;
  size_t vl;
  uint64_t iv;
  int k;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
    if (!v) continue;
    const uint8_t *cn;
    size_t cnl;
    int bad = 0;
    switch (num) {
      case 2:
        bad = find_name(v, vl, &cn, &cnl) != 0 || add_sym(b, full, cn, cnl, DESCDB_FIELD, NULL) != 0;
        break;
      case 8:
        bad = find_name(v, vl, &cn, &cnl) != 0 || add_sym(b, full, cn, cnl, DESCDB_ONEOF, NULL) != 0;
        break;
      case 3: bad = add_message(b, full, v, vl, depth + 1) != 0; break;
      case 4: bad = add_enum(b, full, v, vl) != 0; break;
      case 6: bad = add_extension(b, full, v, vl) != 0; break;
    }
    if (bad) return -1;
  }
  return k;
}

/* ServiceDescriptorProto: 1 name, 2 method (MethodDescriptorProto, 1 name). */
static int add_service(build *b, const char *scope, const uint8_t *p, size_t n) {
  const uint8_t *name;
  size_t nlen;
  const char *full;
  if (find_name(p, n, &name, &nlen) != 0 || add_sym(b, scope, name, nlen, DESCDB_SERVICE, &full) != 0)
    return -1;
  return add_named(b, full, p, n, 2, DESCDB_METHOD);
}

/* FileDescriptorProto: 1 name, 2 package, 4 message_type, 5 enum_type,
 * 6 service, 7 extension (3 dependency: resolved afterwards). */
static int add_file(build *b, const uint8_t *p, size_t n) {
  wr r = WR_INIT(p, n);
  uint32_t num;
  const uint8_t *v, *name = NULL, *pkg = NULL;
  size_t vl, nlen = 0, plen = 0;
  uint64_t iv;
  int k;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
    if (num == 1 && v) name = v, nlen = vl;
    if (num == 2 && v) pkg = v, plen = vl;
  }
  if (k != 0 || !name || !nlen || memchr(name, 0, nlen) || (pkg && memchr(pkg, 0, plen))) return -1;
  descdb *db = b->db;
  char *fname = malloc(nlen + 1), *scope = malloc(plen + 1);
  if (!fname || !scope) {
    free(fname);
    free(scope);
    return -1;
  }
  memcpy(fname, name, nlen);
  fname[nlen] = 0;
  if (plen) memcpy(scope, pkg, plen);
  scope[plen] = 0;
  db->files[db->nfiles++] = (descdb_file){fname, p, n, NULL, 0};
  b->file = (int)db->nfiles - 1;
  r = (wr)WR_INIT(p, n);
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
    if (!v) continue;
    int bad = 0;
    switch (num) {
      case 4: bad = add_message(b, scope, v, vl, 0) != 0; break;
      case 5: bad = add_enum(b, scope, v, vl) != 0; break;
      case 6: bad = add_service(b, scope, v, vl) != 0; break;
      case 7: bad = add_extension(b, scope, v, vl) != 0; break;
    }
    if (bad) k = -1;
    if (k < 0) break;
  }
  free(scope);
  return k;
}

/* Field 3 (dependency) of each file, as indices of files in the set. */
static int resolve_deps(descdb *db) {
  for (size_t i = 0; i < db->nfiles; i++) {
    descdb_file *f = &db->files[i];
    wr r = WR_INIT(f->data, f->len);
    uint32_t num;
    const uint8_t *v;
    size_t vl;
    uint64_t iv;
    int k;
    while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1) {
      if (num != 3 || !v) continue;
      for (size_t j = 0; j < db->nfiles; j++) {
        if (j == i || strlen(db->files[j].name) != vl || memcmp(db->files[j].name, v, vl) != 0) continue;
        int *q = realloc(f->deps, (f->ndeps + 1) * sizeof *q);
        if (!q) return -1;
        f->deps = q;
        f->deps[f->ndeps++] = (int)j;
        break;
      }
    }
    if (k != 0) return -1;
  }
  return 0;
}

static int sym_cmp(const void *a, const void *b) {
  return strcmp(((const descdb_sym *)a)->name, ((const descdb_sym *)b)->name);
}

int descdb_load(descdb *db, const uint8_t *set, size_t len) {
  memset(db, 0, sizeof *db);
  build b = {.db = db};
  /* FileDescriptorSet: 1 file (repeated FileDescriptorProto) */
  size_t nfiles = 0;
  wr r = WR_INIT(set, len);
  uint32_t num;
  const uint8_t *v;
  size_t vl;
  uint64_t iv;
  int k;
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1)
    if (num == 1 && v) nfiles++;
  if (k != 0 || nfiles == 0 || !(db->files = calloc(nfiles, sizeof *db->files))) goto fail;
  r = (wr)WR_INIT(set, len);
  while ((k = wr_next(&r, &num, &v, &vl, &iv)) == 1)
    if (num == 1 && v && add_file(&b, v, vl) != 0) goto fail;
  for (size_t i = 0; i < db->nfiles; i++)
    if (descdb_file_by_name(db, db->files[i].name) != (int)i) goto fail; /* a name twice */
  if (resolve_deps(db) != 0) goto fail;
  if (db->nsyms) qsort(db->syms, db->nsyms, sizeof *db->syms, sym_cmp);
  return 0;
fail:
  descdb_free(db);
  return -1;
}

void descdb_free(descdb *db) {
  for (size_t i = 0; i < db->nfiles; i++) {
    free(db->files[i].name);
    free(db->files[i].deps);
  }
  for (size_t i = 0; i < db->nsyms; i++) free(db->syms[i].name);
  for (size_t i = 0; i < db->nexts; i++) free(db->exts[i].extendee);
  free(db->files);
  free(db->syms);
  free(db->exts);
  memset(db, 0, sizeof *db);
}

/* ---------------------------------------------------------------- lookups */

int descdb_file_by_name(const descdb *db, const char *name) {
  for (size_t i = 0; i < db->nfiles; i++)
    if (strcmp(db->files[i].name, name) == 0) return (int)i;
  return -1;
}

const descdb_sym *descdb_symbol(const descdb *db, const char *name) {
  if (!db->nsyms) return NULL;
  descdb_sym key = {.name = (char *)name};
  /* the first of equal names is not guaranteed by bsearch, and one is enough:
   * a name declared twice would not have compiled */
  return bsearch(&key, db->syms, db->nsyms, sizeof *db->syms, sym_cmp);
}

int descdb_file_by_extension(const descdb *db, const char *type, int32_t number) {
  for (size_t i = 0; i < db->nexts; i++)
    if (db->exts[i].number == number && strcmp(db->exts[i].extendee, type) == 0) return db->exts[i].file;
  return -1;
}

long descdb_extension_numbers(const descdb *db, const char *type, int32_t *out, size_t cap) {
  const descdb_sym *s = descdb_symbol(db, type);
  if (!s || s->kind != DESCDB_MESSAGE) return -1;
  size_t n = 0;
  for (size_t i = 0; i < db->nexts; i++) {
    if (strcmp(db->exts[i].extendee, type) != 0) continue;
    if (n < cap) out[n] = db->exts[i].number;
    n++;
  }
  return (long)n;
}
