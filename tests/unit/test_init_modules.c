/* test_init_modules — the kernel module load order of boot.md §9:
 * dependencies first, each file once, cycles broken with a warning,
 * missing names and entries warned about, built-ins skipped, '-' = '_',
 * and the name-list syntax of conch.modules= and /etc/conch/modules. */
#include <stdlib.h>

#include "init/modules.h"
#include "test.h"

typedef struct rec {
  char out[4096]; /* "L:path W:name:why B:name " */
} rec;

static void r_load(void *arg, const char *path) {
  rec *r = arg;
  snprintf(r->out + strlen(r->out), sizeof r->out - strlen(r->out), "L:%s ", path);
}
static void r_builtin(void *arg, const char *name) {
  rec *r = arg;
  snprintf(r->out + strlen(r->out), sizeof r->out - strlen(r->out), "B:%s ", name);
}
static void r_warn(void *arg, const char *name, const char *why) {
  rec *r = arg;
  snprintf(r->out + strlen(r->out), sizeof r->out - strlen(r->out), "W:%s:%s ", name, why);
}

static const char *plan(const char *dep, const char *builtin, const char *names, int *count) {
  static rec r;
  memset(&r, 0, sizeof r);
  const char *v[32];
  size_t n = 0;
  static char buf[512];
  snprintf(buf, sizeof buf, "%s", names);
  for (char *s = strtok(buf, " "); s && n < 32; s = strtok(NULL, " ")) v[n++] = s;
  modules_plan_ops ops = {r_load, r_builtin, r_warn, &r};
  int rc = modules_plan(dep, dep ? strlen(dep) : 0, builtin, builtin ? strlen(builtin) : 0, v, n, &ops);
  if (count) *count = rc;
  return r.out;
}

/* A slice of a real modules.dep (Debian 6.1 cloud kernel). */
static const char *const DEP =
    "kernel/fs/overlayfs/overlay.ko:\n"
    "kernel/fs/erofs/erofs.ko: kernel/lib/lz4/lz4_decompress.ko\n"
    "kernel/lib/lz4/lz4_decompress.ko:\n"
    "kernel/net/vmw_vsock/vsock.ko:\n"
    "kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko: kernel/net/vmw_vsock/vsock.ko\n"
    "kernel/net/vmw_vsock/vsock_loopback.ko: kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko "
    "kernel/net/vmw_vsock/vsock.ko\n"
    "kernel/drivers/nvdimm/nd_pmem.ko: kernel/drivers/nvdimm/nd_btt.ko kernel/drivers/dax/dax_pmem.ko "
    "kernel/drivers/nvdimm/libnvdimm.ko\n"
    "kernel/drivers/nvdimm/nd_btt.ko: kernel/drivers/nvdimm/libnvdimm.ko\n"
    "kernel/drivers/dax/dax_pmem.ko: kernel/drivers/nvdimm/libnvdimm.ko\n"
    "kernel/drivers/nvdimm/libnvdimm.ko:\n"
    "kernel/drivers/nvdimm/virtio_pmem.ko: kernel/drivers/nvdimm/libnvdimm.ko\n"
    "kernel/drivers/block/virtio-blk.ko.xz:\n";

TEST(dependencies_first_each_once) {
  int n;
  const char *o = plan(DEP, NULL, "vsock_loopback erofs vsock", &n);
  ASSERT_STR_EQ(o, "L:kernel/net/vmw_vsock/vsock.ko "
                   "L:kernel/net/vmw_vsock/vmw_vsock_virtio_transport_common.ko "
                   "L:kernel/net/vmw_vsock/vsock_loopback.ko "
                   "L:kernel/lib/lz4/lz4_decompress.ko L:kernel/fs/erofs/erofs.ko ");
  ASSERT_EQ(n, 5);
  /* deps listed so that the last loads first (modprobe's reading) */
  o = plan(DEP, NULL, "nd_pmem virtio_pmem", &n);
  ASSERT_STR_EQ(o, "L:kernel/drivers/nvdimm/libnvdimm.ko L:kernel/drivers/dax/dax_pmem.ko "
                   "L:kernel/drivers/nvdimm/nd_btt.ko L:kernel/drivers/nvdimm/nd_pmem.ko "
                   "L:kernel/drivers/nvdimm/virtio_pmem.ko ");
  ASSERT_EQ(n, 5);
}

TEST(duplicates_and_dash_underscore) {
  int n;
  const char *o = plan(DEP, NULL, "virtio_blk virtio-blk overlay overlay", &n);
  ASSERT_STR_EQ(o, "L:kernel/drivers/block/virtio-blk.ko.xz L:kernel/fs/overlayfs/overlay.ko ");
  ASSERT_EQ(n, 2);
  o = plan(DEP, NULL, "virtio-blk.ko", &n); /* a file name is a name too */
  ASSERT_STR_EQ(o, "L:kernel/drivers/block/virtio-blk.ko.xz ");
}

TEST(missing_names_and_entries) {
  int n;
  const char *o = plan(DEP, NULL, "nosuch overlay", &n);
  ASSERT_STR_EQ(o, "W:nosuch:not found L:kernel/fs/overlayfs/overlay.ko ");
  ASSERT_EQ(n, 1);
  /* a dependency without a line of its own: warned, the user still planned */
  o = plan("kernel/a.ko: kernel/gone.ko\n", NULL, "a", &n);
  ASSERT_STR_EQ(o, "W:gone:dependency not in modules.dep L:kernel/a.ko ");
  /* no modules.dep at all */
  o = plan(NULL, NULL, "a", &n);
  ASSERT_STR_EQ(o, "W:a:not found ");
  ASSERT_EQ(n, 0);
  o = plan(DEP, NULL, "", &n);
  ASSERT_STR_EQ(o, "");
  ASSERT_EQ(n, 0);
}

TEST(cycles_are_broken) {
  int n;
  const char *dep = "kernel/a.ko: kernel/b.ko\nkernel/b.ko: kernel/c.ko\nkernel/c.ko: kernel/a.ko\n";
  const char *o = plan(dep, NULL, "a", &n);
  ASSERT_STR_EQ(o, "W:a:dependency cycle L:kernel/c.ko L:kernel/b.ko L:kernel/a.ko ");
  ASSERT_EQ(n, 3);
  o = plan("kernel/s.ko: kernel/s.ko\n", NULL, "s s", &n); /* itself */
  ASSERT_STR_EQ(o, "W:s:dependency cycle L:kernel/s.ko ");
}

TEST(builtins_skipped) {
  int n;
  const char *o = plan(DEP, "kernel/drivers/virtio/virtio_pci.ko\nkernel/fs/ext4/ext4.ko\n",
                       "virtio_pci erofs ext4", &n);
  ASSERT_STR_EQ(o, "B:virtio_pci L:kernel/lib/lz4/lz4_decompress.ko L:kernel/fs/erofs/erofs.ko B:ext4 ");
  ASSERT_EQ(n, 2);
  /* a dependency that is built in is not loaded */
  o = plan("kernel/e.ko: kernel/lz4.ko\n", "kernel/lz4.ko\n", "e", &n);
  ASSERT_STR_EQ(o, "L:kernel/e.ko ");
}

TEST(hostile_dep_text) {
  int n;
  /* blank lines, no colon, CRLF, spaces, a very long name, no final newline */
  const char *dep = "\n\ngarbage line\r\nkernel/x.ko:  kernel/y.ko \r\nkernel/y.ko:\r\n"
                    "kernel/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.ko:";
  const char *o = plan(dep, NULL, "x", &n);
  ASSERT_STR_EQ(o, "L:kernel/y.ko L:kernel/x.ko ");
  /* a deep chain is cut, never a stack overflow */
  static char chain[200 * 40];
  size_t off = 0;
  for (int i = 0; i < 200; i++)
    off += (size_t)snprintf(chain + off, sizeof chain - off, "kernel/m%d.ko: kernel/m%d.ko\n", i, i + 1);
  o = plan(chain, NULL, "m0", &n);
  ASSERT(strstr(o, "dependencies nested too deep") != NULL);
  ASSERT(n > 0 && n < 200);
}

static char names[512];
static void collect(void *arg, const char *name, size_t n) {
  (void)arg;
  snprintf(names + strlen(names), sizeof names - strlen(names), "[%.*s]", (int)n, name);
}

TEST(list_syntax) {
  names[0] = 0;
  const char *t = "# modules for the stock kernel\nvirtio_pci\n  erofs  # the layers\n\noverlay,vsock\r\n";
  ASSERT_EQ(modules_split(t, strlen(t), collect, NULL), 4);
  ASSERT_STR_EQ(names, "[virtio_pci][erofs][overlay][vsock]");
  names[0] = 0;
  ASSERT_EQ(modules_split("a,,b,", 5, collect, NULL), 2);
  ASSERT_STR_EQ(names, "[a][b]");
  names[0] = 0;
  ASSERT_EQ(modules_split("a\0b", 3, collect, NULL), 2);
  ASSERT_STR_EQ(names, "[a][b]");
}

int main(void) {
  RUN(dependencies_first_each_once);
  RUN(duplicates_and_dash_underscore);
  RUN(missing_names_and_entries);
  RUN(cycles_are_broken);
  RUN(builtins_skipped);
  RUN(hostile_dep_text);
  RUN(list_syntax);
  return test_summary();
}
