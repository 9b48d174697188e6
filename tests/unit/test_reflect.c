/* test_reflect — reflect/descdb: the embedded descriptor set (agent.proto
 * and the two reflection protos) indexed by file, symbol of every kind and
 * extension; imports and extensions in a set built here by hand; malformed
 * sets (truncated at every byte, bytes flipped, bad names, groups, a file
 * twice) refused without reading past the input. */
#include <stdlib.h>

#include "reflect/descdb.h"
#include "test.h"

extern const unsigned char reflect_descriptor_set[];
extern const size_t reflect_descriptor_set_len;

/* ---- a tiny protobuf writer for hand-built sets */
typedef struct wbuf {
  uint8_t b[4096];
  size_t n;
} wbuf;

static void w_varint(wbuf *w, uint64_t v) {
  do {
    uint8_t c = v & 0x7f;
    v >>= 7;
    w->b[w->n++] = c | (v ? 0x80 : 0);
  } while (v);
}
static void w_bytes(wbuf *w, unsigned field, const void *p, size_t n) {
  w_varint(w, (uint64_t)field << 3 | 2);
  w_varint(w, n);
  memcpy(w->b + w->n, p, n);
  w->n += n;
}
static void w_str(wbuf *w, unsigned field, const char *s) { w_bytes(w, field, s, strlen(s)); }
static void w_msg(wbuf *w, unsigned field, const wbuf *m) { w_bytes(w, field, m->b, m->n); }
static void w_int(wbuf *w, unsigned field, uint64_t v) {
  w_varint(w, (uint64_t)field << 3);
  w_varint(w, v);
}

static const descdb_sym *sym(const descdb *db, const char *name, descdb_kind kind, const char *file) {
  const descdb_sym *s = descdb_symbol(db, name);
  if (!s) TEST_FAIL_("symbol %s not found", name);
  if (s->kind != kind) TEST_FAIL_("symbol %s: kind %d, want %d", name, (int)s->kind, (int)kind);
  if (strcmp(db->files[s->file].name, file) != 0)
    TEST_FAIL_("symbol %s in %s, want %s", name, db->files[s->file].name, file);
  return s;
}

TEST(embedded_set) {
  descdb db;
  ASSERT_EQ(descdb_load(&db, reflect_descriptor_set, reflect_descriptor_set_len), 0);
  ASSERT_EQ(db.nfiles, 3);
  int agent = descdb_file_by_name(&db, "agent.proto");
  ASSERT(agent >= 0);
  ASSERT(descdb_file_by_name(&db, "reflection.proto") >= 0);
  ASSERT(descdb_file_by_name(&db, "reflection_v1alpha.proto") >= 0);
  ASSERT_EQ(descdb_file_by_name(&db, "proto/agent.proto"), -1);
  ASSERT_EQ(descdb_file_by_name(&db, ""), -1);
  /* the file's bytes are the set's own, not a copy */
  const uint8_t *f = db.files[agent].data;
  ASSERT(f > reflect_descriptor_set && f + db.files[agent].len <= reflect_descriptor_set + reflect_descriptor_set_len);
  ASSERT_EQ(db.files[agent].ndeps, 0);

  sym(&db, "pb.ProcessService", DESCDB_SERVICE, "agent.proto");
  sym(&db, "pb.FileService", DESCDB_SERVICE, "agent.proto");
  sym(&db, "pb.ProcessService.StartProcess", DESCDB_METHOD, "agent.proto");
  sym(&db, "pb.FileService.WatchDir", DESCDB_METHOD, "agent.proto");
  sym(&db, "pb.NetworkService.WatchPorts", DESCDB_METHOD, "agent.proto");
  sym(&db, "pb.StartProcessRequest", DESCDB_MESSAGE, "agent.proto");
  sym(&db, "pb.StartProcessRequest.EnvEntry", DESCDB_MESSAGE, "agent.proto"); /* nested (a map entry) */
  sym(&db, "pb.StartProcessRequest.EnvEntry.value", DESCDB_FIELD, "agent.proto");
  sym(&db, "pb.StartProcessRequest.cmd", DESCDB_FIELD, "agent.proto");
  sym(&db, "pb.ProcessEvent.event", DESCDB_ONEOF, "agent.proto");
  sym(&db, "pb.EventType", DESCDB_ENUM, "agent.proto");
  sym(&db, "pb.EVENT_TYPE_CREATE", DESCDB_ENUM_VALUE, "agent.proto"); /* beside its enum */
  ASSERT(descdb_symbol(&db, "pb.EventType.EVENT_TYPE_CREATE") == NULL);
  sym(&db, "grpc.reflection.v1.ServerReflection", DESCDB_SERVICE, "reflection.proto");
  sym(&db, "grpc.reflection.v1alpha.ServerReflection.ServerReflectionInfo", DESCDB_METHOD,
      "reflection_v1alpha.proto");
  sym(&db, "grpc.reflection.v1.ServerReflectionRequest.message_request", DESCDB_ONEOF, "reflection.proto");
  const char *unknown[] = {"pb", "pb.", "pb.Process", "pb.ProcessService.", ".pb.ProcessService",
                           "pb.ProcessService.Nope", "", "grpc.reflection", "PB.ProcessService"};
  for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++)
    if (descdb_symbol(&db, unknown[i])) TEST_FAIL_("found %s", unknown[i]);

  /* the symbols are sorted and each is there once */
  size_t services = 0;
  for (size_t i = 0; i < db.nsyms; i++) {
    if (i) ASSERT(strcmp(db.syms[i - 1].name, db.syms[i].name) < 0);
    services += db.syms[i].kind == DESCDB_SERVICE;
  }
  ASSERT_EQ(services, 6); /* ProcessService, FileService, NetworkService, AgentService, reflection v1 and v1alpha */

  int32_t nums[4];
  ASSERT_EQ(descdb_extension_numbers(&db, "pb.FileEntry", nums, 4), 0);
  ASSERT_EQ(descdb_extension_numbers(&db, "pb.EventType", nums, 4), -1); /* an enum */
  ASSERT_EQ(descdb_extension_numbers(&db, "pb.Nope", nums, 4), -1);
  ASSERT_EQ(descdb_file_by_extension(&db, "pb.FileEntry", 100), -1);
  descdb_free(&db);
  ASSERT_EQ(db.nfiles, 0);
}

/* b.proto (package y) imports a.proto (package x) and extends x.M with 100
 * and 101; c.proto imports b.proto. */
static size_t build_set(uint8_t *out) {
  wbuf m = {0}, fa = {0}, ext = {0}, ext2 = {0}, nested = {0}, fb = {0}, fc = {0}, set = {0};
  w_str(&m, 1, "M");
  w_str(&nested, 1, "Inner");
  w_msg(&m, 3, &nested);
  w_str(&fa, 1, "a.proto");
  w_str(&fa, 2, "x");
  w_msg(&fa, 4, &m);
  w_str(&ext, 1, "ext");
  w_str(&ext, 2, ".x.M");
  w_int(&ext, 3, 100);
  w_str(&ext2, 1, "ext2");
  w_str(&ext2, 2, ".x.M");
  w_int(&ext2, 3, 101);
  w_str(&fb, 1, "b.proto");
  w_str(&fb, 2, "y");
  w_str(&fb, 3, "a.proto");
  w_str(&fb, 3, "google/protobuf/missing.proto"); /* not in the set: ignored */
  w_msg(&fb, 7, &ext);
  w_msg(&fb, 7, &ext2);
  w_str(&fc, 1, "c.proto");
  w_str(&fc, 3, "b.proto"); /* no package */
  wbuf svc = {0};
  w_str(&svc, 1, "S");
  w_msg(&fc, 6, &svc);
  w_msg(&set, 1, &fa);
  w_msg(&set, 1, &fb);
  w_msg(&set, 1, &fc);
  memcpy(out, set.b, set.n);
  return set.n;
}

TEST(imports_and_extensions) {
  uint8_t set[4096];
  size_t n = build_set(set);
  descdb db;
  ASSERT_EQ(descdb_load(&db, set, n), 0);
  ASSERT_EQ(db.nfiles, 3);
  int a = descdb_file_by_name(&db, "a.proto"), b = descdb_file_by_name(&db, "b.proto"),
      c = descdb_file_by_name(&db, "c.proto");
  ASSERT_EQ(db.files[b].ndeps, 1);
  ASSERT_EQ(db.files[b].deps[0], a);
  ASSERT_EQ(db.files[c].ndeps, 1);
  ASSERT_EQ(db.files[c].deps[0], b);
  sym(&db, "x.M.Inner", DESCDB_MESSAGE, "a.proto");
  sym(&db, "y.ext", DESCDB_EXTENSION, "b.proto");
  sym(&db, "S", DESCDB_SERVICE, "c.proto"); /* no package: no prefix */
  ASSERT_EQ(descdb_file_by_extension(&db, "x.M", 100), b);
  ASSERT_EQ(descdb_file_by_extension(&db, "x.M", 101), b);
  ASSERT_EQ(descdb_file_by_extension(&db, "x.M", 102), -1);
  ASSERT_EQ(descdb_file_by_extension(&db, ".x.M", 100), -1);
  int32_t nums[4] = {0};
  ASSERT_EQ(descdb_extension_numbers(&db, "x.M", nums, 4), 2);
  ASSERT_EQ(nums[0], 100);
  ASSERT_EQ(nums[1], 101);
  ASSERT_EQ(descdb_extension_numbers(&db, "x.M", nums, 1), 2); /* the count, even past cap */
  ASSERT_EQ(descdb_extension_numbers(&db, "x.M.Inner", nums, 4), 0);
  descdb_free(&db);
}

TEST(truncated_everywhere) {
  /* every prefix either is refused or ends on a file boundary (fewer files) */
  size_t ok = 0;
  for (size_t i = 0; i < reflect_descriptor_set_len; i++) {
    uint8_t *copy = malloc(i ? i : 1); /* exact size: ASan sees any read past it */
    memcpy(copy, reflect_descriptor_set, i);
    descdb db;
    if (descdb_load(&db, copy, i) == 0) {
      ok++;
      ASSERT(db.nfiles < 3);
      descdb_free(&db);
    } else {
      ASSERT_EQ(db.nfiles, 0);
    }
    free(copy);
  }
  ASSERT(ok <= 2);
}

TEST(flipped_bytes) {
  size_t n = reflect_descriptor_set_len;
  uint8_t *copy = malloc(n);
  srand(7);
  for (int round = 0; round < 3000; round++) {
    memcpy(copy, reflect_descriptor_set, n);
    for (int k = 0; k < 4; k++) copy[(size_t)rand() % n] = (uint8_t)rand();
    descdb db;
    if (descdb_load(&db, copy, n) == 0) {
      /* whatever loaded is consistent */
      for (size_t i = 0; i < db.nsyms; i++) ASSERT(db.syms[i].file >= 0 && (size_t)db.syms[i].file < db.nfiles);
      descdb_free(&db);
    }
  }
  free(copy);
}

static int load_one_file(const wbuf *file) {
  wbuf set = {0};
  w_msg(&set, 1, file);
  descdb db;
  int r = descdb_load(&db, set.b, set.n);
  if (r == 0) descdb_free(&db);
  return r;
}

TEST(bad_sets) {
  descdb db;
  ASSERT_EQ(descdb_load(&db, (const uint8_t *)"", 0), -1); /* no file */
  wbuf f = {0}, m = {0};
  ASSERT_EQ(load_one_file(&f), -1); /* a file without a name */
  w_str(&f, 1, "a.proto");
  ASSERT_EQ(load_one_file(&f), 0);
  wbuf g = f;
  w_str(&m, 1, "A.B"); /* a dot inside a name */
  w_msg(&g, 4, &m);
  ASSERT_EQ(load_one_file(&g), -1);
  g = f;
  m.n = 0;
  w_bytes(&m, 1, "A\0B", 3); /* a NUL inside a name */
  w_msg(&g, 4, &m);
  ASSERT_EQ(load_one_file(&g), -1);
  g = f;
  m.n = 0;
  w_int(&m, 2, 5); /* a message without a name */
  w_msg(&g, 4, &m);
  ASSERT_EQ(load_one_file(&g), -1);
  g = f;
  g.b[g.n++] = (9 << 3) | 3; /* a group */
  ASSERT_EQ(load_one_file(&g), -1);
  g = f;
  m.n = 0;
  w_str(&m, 1, "e");
  w_str(&m, 2, "x.M"); /* extendee not fully qualified */
  w_int(&m, 3, 100);
  w_msg(&g, 7, &m);
  ASSERT_EQ(load_one_file(&g), -1);
  /* one file twice */
  wbuf set = {0};
  w_msg(&set, 1, &f);
  w_msg(&set, 1, &f);
  ASSERT_EQ(descdb_load(&db, set.b, set.n), -1);
  /* a length past the end, a varint that never ends */
  uint8_t past[] = {0x0a, 0x7f, 0x0a, 0x01, 'a'};
  ASSERT_EQ(descdb_load(&db, past, sizeof past), -1);
  uint8_t endless[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
  ASSERT_EQ(descdb_load(&db, endless, sizeof endless), -1);
  /* deep nesting is refused, not recursed into without end */
  wbuf deep = {0};
  w_str(&deep, 1, "D");
  for (int i = 0; i < 40; i++) {
    wbuf outer = {0};
    w_str(&outer, 1, "D");
    w_msg(&outer, 3, &deep);
    deep = outer;
  }
  g = f;
  w_msg(&g, 4, &deep);
  ASSERT_EQ(load_one_file(&g), -1);
}

int main(void) {
  RUN(embedded_set);
  RUN(imports_and_extensions);
  RUN(truncated_everywhere);
  RUN(flipped_bytes);
  RUN(bad_sets);
  return test_summary();
}
