/* test_init_boot — the pure parts of the PID 1 boot (boot.md §2, §4, §5):
 * kernel command line, pmem name filtering/sorting, overlay options, passwd
 * fix-up, mountinfo lookup, volume config validation, path cleaning,
 * symlink-safe mkdir, volume rollback order, resolv.conf file install. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "init/bootutil.h"
#include "core/log.h"
#include "init/cmdline.h"
#include "init/layers.h"
#include "init/network.h"
#include "init/volumes.h"
#include "test.h"

static char tmpdir[64];

TEST(cmdline_keys_and_precedence) {
  init_cmdline c;
  init_cmdline_reset(&c);
  /* argv words first: they win over /proc/cmdline */
  ASSERT_EQ(init_cmdline_word(&c, "conch.sandbox_id=from-argv", 26), 1);
  ASSERT_EQ(init_cmdline_word(&c, "quiet", 5), 0);
  const char *cl = "console=ttyS0 conch.sandbox_id=from-kernel conch.sharefs=virtiofs "
                   "conch.layers=/dev/vdb,/dev/vdc conch.disk=none conch.sharefs=no "
                   "conch.init_listen=vsock:4065,unix:/run/init.sock conch.unknown=1 -- x\n";
  init_cmdline_parse(&c, cl, strlen(cl));
  ASSERT_STR_EQ(c.sandbox_id, "from-argv");
  ASSERT(c.sharefs_virtiofs);
  ASSERT(c.have_layers);
  ASSERT_EQ(c.nlayers, 2);
  ASSERT_STR_EQ(c.layers[0], "/dev/vdb");
  ASSERT_STR_EQ(c.layers[1], "/dev/vdc");
  ASSERT_STR_EQ(c.disk, "none");
  ASSERT_EQ(c.nlisten, 2);
  ASSERT_STR_EQ(c.listen[1], "unix:/run/init.sock");
  ASSERT(!c.have_modules);
  /* api.md §9 "Operators": the console's level, the host stream's port and CID */
  ASSERT(!c.have_console_level && !c.have_log_port && !c.have_log_cid);
  const char *o = "conch.console_level=loud conch.console_level=error conch.log_port=x conch.log_port=4294967295 "
                  "conch.log_cid=4294967296 conch.log_cid=1 conch.log_port=9";
  init_cmdline_parse(&c, o, strlen(o));
  ASSERT(c.have_console_level && c.console_level == LOG_LVL_ERROR);
  ASSERT(c.have_log_port && c.log_port == 4294967295u);
  ASSERT(c.have_log_cid && c.log_cid == 1);
  /* conch.modules (boot.md §9): names only; an invalid list is ignored */
  const char *m = "conch.modules=virtio_pci,vsock-loopback conch.modules=erofs";
  init_cmdline_parse(&c, m, strlen(m));
  ASSERT_STR_EQ(c.modules, "virtio_pci,vsock-loopback");
  init_cmdline_reset(&c);
  m = "conch.modules=a/../../x conch.modules=erofs";
  init_cmdline_parse(&c, m, strlen(m));
  ASSERT_STR_EQ(c.modules, "erofs");
  /* an argv word is exactly its own length: an invalid one is never read past */
  init_cmdline_reset(&c);
  const char *bad[] = {"conch.modules=a.b", "conch.modules=x y", "conch.modules=\xff"};
  for (size_t i = 0; i < 3; i++) {
    size_t bl = strlen(bad[i]);
    char *w = malloc(bl);
    memcpy(w, bad[i], bl);
    ASSERT_EQ(init_cmdline_word(&c, w, bl), 0);
    free(w);
  }
  ASSERT(!c.have_modules);
  char *big = malloc(1100);
  memcpy(big, "conch.modules=", 14);
  memset(big + 14, 'a', 1100 - 14);
  ASSERT_EQ(init_cmdline_word(&c, big, 1100), 0); /* too long */
  free(big);
}

TEST(cmdline_quotes_whitespace_and_invalid) {
  init_cmdline c;
  init_cmdline_reset(&c);
  const char *cl = "\tconch.sandbox_id=\"a b\"  conch.sharefs=9p conch.sharefs=virtiofs "
                   "conch.layers=dev/x conch.layers=/dev/ok conch.disk=/dev/a,b conch.disk=/dev/vdd "
                   "conch.init_listen=tcp:1 conch.init_listen=unix:/x";
  init_cmdline_parse(&c, cl, strlen(cl));
  ASSERT_STR_EQ(c.sandbox_id, "a b");
  ASSERT(!c.sharefs_virtiofs); /* first occurrence wins, even when not virtiofs */
  ASSERT_EQ(c.nlayers, 1);     /* an invalid value is ignored (as if absent) */
  ASSERT_STR_EQ(c.layers[0], "/dev/ok");
  ASSERT_STR_EQ(c.disk, "/dev/vdd");
  ASSERT_STR_EQ(c.listen[0], "unix:/x");
  /* too many layers → ignored */
  init_cmdline_reset(&c);
  char many[64 * 12] = "conch.layers=";
  for (int i = 0; i < INIT_CMDLINE_MAX_LAYERS + 1; i++) strcat(many, i ? ",/dev/l" : "/dev/l");
  init_cmdline_parse(&c, many, strlen(many));
  ASSERT(!c.have_layers);
  init_cmdline_reset(&c);
  init_cmdline_parse(&c, "", 0);
  ASSERT(!c.have_sandbox_id);
}

TEST(pmem_filter_and_sort) {
  unsigned idx;
  ASSERT(layers_pmem_index("pmem0", &idx) && idx == 0);
  ASSERT(layers_pmem_index("pmem12", &idx) && idx == 12);
  const char *bad[] = {"pmem", "pmem01", "pmem0p1", "pmemx", "pmem-1", "pmem1 ", "xpmem1", "pmem999999"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) ASSERT(!layers_pmem_index(bad[i], &idx));
  const char *names[] = {"pmem10", "pmem2", "pmem01", "null", "pmem0", "pmem0p1", "pmem1", "pmemx", "pmem2"};
  unsigned out[8];
  size_t n = layers_pmem_select(names, 9, out, 8);
  ASSERT_EQ(n, 4);
  ASSERT_EQ(out[0], 0);
  ASSERT_EQ(out[1], 1);
  ASSERT_EQ(out[2], 2);
  ASSERT_EQ(out[3], 10);
}

TEST(overlay_options) {
  const char *lower[] = {"/mnt/conch/pmem0", "/mnt/conch/pmem1"};
  char o[256];
  ASSERT_EQ(layers_overlay_opts(o, sizeof o, lower, 2, "/mnt/disk/upper", "/mnt/disk/work"), 0);
  ASSERT_STR_EQ(o, "lowerdir=/mnt/conch/pmem0:/mnt/conch/pmem1,upperdir=/mnt/disk/upper,workdir=/mnt/disk/work");
  ASSERT_EQ(layers_overlay_opts(o, sizeof o, lower, 0, "/u", "/w"), -1);
  ASSERT_EQ(layers_overlay_opts(o, 40, lower, 2, "/u", "/w"), -1);
  const char *colon[] = {"/a:b"};
  ASSERT_EQ(layers_overlay_opts(o, sizeof o, colon, 1, "/u", "/w"), -1);
}

TEST(passwd_fix) {
  const char *in = "root:x:0:0:root:/home/root:/bin/sh\nbin:x:1:1::/bin:/sbin/nologin\n";
  char *out;
  size_t n;
  ASSERT_EQ(boot_passwd_fix(in, strlen(in), &out, &n), 1);
  ASSERT_STR_EQ(out, "root:x:0:0:root:/root:/bin/sh\nbin:x:1:1::/bin:/sbin/nologin\n");
  ASSERT_EQ(n, strlen(out));
  free(out);
  /* root not first, empty home, no trailing newline, CRLF elsewhere kept */
  in = "a:b\r\nrootx:1:2:3:4:/nope:/x\nroot:x:0:0:::/bin/bash";
  ASSERT_EQ(boot_passwd_fix(in, strlen(in), &out, &n), 1);
  ASSERT_STR_EQ(out, "a:b\r\nrootx:1:2:3:4:/nope:/x\nroot:x:0:0::/root:/bin/bash");
  free(out);
  /* home is the last field */
  in = "root:x:0:0:r:/";
  ASSERT_EQ(boot_passwd_fix(in, strlen(in), &out, &n), 1);
  ASSERT_STR_EQ(out, "root:x:0:0:r:/root");
  free(out);
  in = "root:x:0:0:root:/root:/bin/sh\n";
  ASSERT_EQ(boot_passwd_fix(in, strlen(in), &out, &n), 0);
  in = "root:x:0\nnobody:x:65534:65534::/:/x\n";
  ASSERT_EQ(boot_passwd_fix(in, strlen(in), &out, &n), 0);
  ASSERT_EQ(boot_passwd_fix("", 0, &out, &n), 0);
}

TEST(mountinfo_lookup) {
  const char *mi = "22 1 0:21 / /proc rw,nosuid - proc proc rw\n"
                   "30 22 0:5 / /mnt/conch/merge/dev/pts rw - devpts devpts rw\n"
                   "31 22 0:6 / /mnt/with\\040space rw - tmpfs t rw\n";
  size_t n = strlen(mi);
  ASSERT(boot_mountinfo_has(mi, n, "/proc"));
  ASSERT(boot_mountinfo_has(mi, n, "/mnt/conch/merge/dev/pts"));
  ASSERT(boot_mountinfo_has(mi, n, "/mnt/with space"));
  ASSERT(!boot_mountinfo_has(mi, n, "/mnt/conch/merge/dev"));
  ASSERT(!boot_mountinfo_has(mi, n, "/sys"));
}

TEST(path_clean) {
  const char *cases[][2] = {
      {"/workspace", "/workspace"}, {"/a/b/../c", "/a/c"},  {"/../../x", "/x"},  {"//a//b/", "/a/b"},
      {"/a/./b/.", "/a/b"},         {"", "."},              {"a/../..", ".."},   {"/", "/"},
      {"/proc/../data", "/data"},   {"../a/./b", "../a/b"}, {"/..", "/"},        {"a//b", "a/b"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char out[64];
    ASSERT_EQ(volumes_clean(cases[i][0], out, sizeof out), 0);
    if (strcmp(out, cases[i][1]) != 0) TEST_FAIL_("clean(%s) = %s, want %s", cases[i][0], out, cases[i][1]);
  }
}

TEST(volume_config_validation) {
  volume v[4];
  char err[128];
  const char *ok = "{\"version\":1,\"future\":true,\"mounts\":[{\"index\":0,\"path\":\"/workspace/../data/\","
                   "\"readonly\":false,\"extra\":\"x\"},{\"index\":3,\"path\":\"/opt/x\",\"readonly\":true}]}";
  ASSERT_EQ(volumes_parse(ok, strlen(ok), v, 4, err, sizeof err), 2);
  ASSERT_STR_EQ(v[0].path, "/data");
  ASSERT_EQ(v[0].index, 0);
  ASSERT_EQ(v[0].readonly, 0);
  ASSERT_STR_EQ(v[1].path, "/opt/x");
  ASSERT_EQ(v[1].index, 3);
  ASSERT_EQ(v[1].readonly, 1);
  ASSERT_EQ(volumes_parse("{\"version\":1}", 13, v, 4, err, sizeof err), 0);
  const char *invalid_paths[] = {"relative", "/", "/proc", "/proc/x", "/sys", "/dev/shm", "/run",
                                 "/run/conch", "/x/../run/a", "", "/a/../.."};
  for (size_t i = 0; i < sizeof invalid_paths / sizeof invalid_paths[0]; i++) {
    char cfg[256];
    snprintf(cfg, sizeof cfg, "{\"mounts\":[{\"index\":0,\"path\":\"%s\"}]}", invalid_paths[i]);
    if (volumes_parse(cfg, strlen(cfg), v, 4, err, sizeof err) != -1) TEST_FAIL_("accepted %s", invalid_paths[i]);
    ASSERT_STR_EQ(err, "Invalid volume mount config");
  }
  const char *allowed[] = {"/procx", "/running", "/devices/a", "/system"};
  for (size_t i = 0; i < 4; i++) ASSERT(volumes_path_allowed(allowed[i]));
  const char *broken[] = {"{", "[]", "{\"mounts\":{}}", "{\"mounts\":[1]}", "{\"mounts\":[{\"index\":-1,\"path\":\"/a\"}]}",
                          "{\"mounts\":[{\"index\":1.5,\"path\":\"/a\"}]}", "{\"mounts\":[{\"index\":0,\"path\":5}]}",
                          "{\"mounts\":[{\"index\":0,\"path\":\"/a\",\"readonly\":\"yes\"}]}",
                          "{\"mounts\":[{},{},{},{},{}]}"};
  for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++)
    if (volumes_parse(broken[i], strlen(broken[i]), v, 4, err, sizeof err) != -1) TEST_FAIL_("accepted %s", broken[i]);
}

TEST(mkdir_in_refuses_symlinks) {
  char root[128], p[256];
  snprintf(root, sizeof root, "%s/root", tmpdir);
  mkdir(root, 0755);
  ASSERT_EQ(volumes_mkdir_in(root, "/a/b/c"), 0);
  snprintf(p, sizeof p, "%s/a/b/c", root);
  struct stat st;
  ASSERT_EQ(stat(p, &st), 0);
  ASSERT(S_ISDIR(st.st_mode));
  ASSERT_EQ(volumes_mkdir_in(root, "/a/b/c"), 0); /* idempotent */
  snprintf(p, sizeof p, "%s/escape", root);
  ASSERT_EQ(symlink(tmpdir, p), 0);
  ASSERT(volumes_mkdir_in(root, "/escape/x") < 0);
  snprintf(p, sizeof p, "%s/x", tmpdir);
  ASSERT(stat(p, &st) != 0); /* nothing created outside the root */
}

/* Fake mount ops: record calls, fail at call number fail_at. */
static int calls, fail_at;
static char log_[1024];
static int fake_mount(const char *src, const char *dst, const char *type, unsigned long flags, const char *data) {
  (void)type;
  (void)data;
  calls++;
  char line[300];
  snprintf(line, sizeof line, "%s %s>%s;", (flags & MS_REMOUNT) ? "ro" : "bind", src ? src : "-",
           strrchr(dst, '/'));
  strcat(log_, line);
  return calls == fail_at ? -EPERM : 0;
}
static int fake_umount(const char *dst) {
  char line[300];
  snprintf(line, sizeof line, "umount %s;", strrchr(dst, '/'));
  strcat(log_, line);
  return 0;
}

TEST(volume_rollback_reverse_order) {
  char root[128];
  snprintf(root, sizeof root, "%s/merge", tmpdir);
  mkdir(root, 0755);
  volume v[3] = {{0, "/v0", 0}, {1, "/v1", 1}, {2, "/v2", 0}};
  volumes_ops ops = {fake_mount, fake_umount};
  char err[256];
  calls = 0;
  fail_at = 4; /* v0 bind, v1 bind, v1 ro, v2 bind fails */
  log_[0] = 0;
  ASSERT_EQ(volumes_mount_all(root, "/src", v, 3, &ops, err, sizeof err), -1);
  ASSERT_STR_EQ(log_, "bind /src/0>/v0;bind /src/1>/v1;ro ->/v1;bind /src/2>/v2;umount /v1;umount /v0;");
  ASSERT(strstr(err, "/v2") != NULL);
  calls = 0;
  fail_at = 3; /* the read-only remount of v1 fails: v1's bind is undone too */
  log_[0] = 0;
  ASSERT_EQ(volumes_mount_all(root, "/src", v, 3, &ops, err, sizeof err), -1);
  ASSERT_STR_EQ(log_, "bind /src/0>/v0;bind /src/1>/v1;ro ->/v1;umount /v1;umount /v0;");
  calls = 0;
  fail_at = 0;
  log_[0] = 0;
  ASSERT_EQ(volumes_mount_all(root, "/src", v, 3, &ops, err, sizeof err), 0);
  ASSERT_STR_EQ(log_, "bind /src/0>/v0;bind /src/1>/v1;ro ->/v1;bind /src/2>/v2;");
}

TEST(resolv_file_install) {
  char p[128], target[128];
  snprintf(p, sizeof p, "%s/resolv.conf", tmpdir);
  snprintf(target, sizeof target, "%s/does-not-exist", tmpdir);
  ASSERT_EQ(symlink(target, p), 0); /* dangling symlink is replaced */
  mode_t old = umask(077);
  const char *data = "# Generated by Conch\nnameserver 10.0.0.53\n";
  ASSERT_EQ(network_write_resolv(p, data, strlen(data)), 0);
  umask(old);
  struct stat st;
  ASSERT_EQ(lstat(p, &st), 0);
  ASSERT(S_ISREG(st.st_mode));
  ASSERT_EQ(st.st_mode & 07777, 0644);
  ASSERT(access(target, F_OK) != 0);
  char buf[128] = "";
  int fd = open(p, O_RDONLY);
  ssize_t r = read(fd, buf, sizeof buf - 1);
  close(fd);
  ASSERT_EQ(r, (ssize_t)strlen(data));
  ASSERT_STR_EQ(buf, data);
  /* rewriting replaces the bytes exactly (shorter content, no leftovers) */
  ASSERT_EQ(network_write_resolv(p, "# Generated by Conch\n", 21), 0);
  fd = open(p, O_RDONLY);
  r = read(fd, buf, sizeof buf - 1);
  close(fd);
  ASSERT_EQ(r, 21);
  snprintf(p, sizeof p, "%s/no-such-dir/resolv.conf", tmpdir);
  ASSERT_EQ(network_write_resolv(p, "x", 1), -ENOENT);
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/conch-initboot-XXXXXX");
  if (!mkdtemp(tmpdir)) return 2;
  RUN(cmdline_keys_and_precedence);
  RUN(cmdline_quotes_whitespace_and_invalid);
  RUN(pmem_filter_and_sort);
  RUN(overlay_options);
  RUN(passwd_fix);
  RUN(mountinfo_lookup);
  RUN(path_clean);
  RUN(volume_config_validation);
  RUN(mkdir_in_refuses_symlinks);
  RUN(volume_rollback_reverse_order);
  RUN(resolv_file_install);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd) != 0) return 2;
  return test_summary();
}
