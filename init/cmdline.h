/* cmdline — the conch.* keys of the kernel command line (boot.md §2 step 4).
 *
 * Sources, in precedence order ("first occurrence wins" across both):
 *   1. PID 1's own argv words of the form conch.KEY=VALUE.  The kernel passes
 *      everything after "--" on its command line to init as argv, so
 *      `… -- conch.layers=/dev/vdb` works on any VMM; a test (or a container
 *      runtime) that starts conch-init as PID 1 passes them the same way.
 *   2. /proc/cmdline (whitespace separated; "…" quotes group spaces as the
 *      kernel does and are removed).
 * Unknown conch.* keys and all other words are ignored.
 *
 * Keys:
 *   conch.sandbox_id=<id>      log prefix, CONCH_SANDBOX_ID fallback
 *   conch.sharefs=virtiofs     enable volumes (boot.md §5)
 *   conch.layers=<dev>[,<dev>…] read-only erofs layers, newest first, instead
 *                              of scanning /dev/pmem* (VMMs without pmem:
 *                              virtio-blk, loop devices); absolute paths,
 *                              at most INIT_CMDLINE_MAX_LAYERS
 *   conch.disk=<dev>|none      the writable ext4 layer instead of /dev/vda;
 *                              "none" = RAM upper layer
 *   conch.init_listen=<spec>[,<spec>…]  the init-message listeners instead of
 *                              the default vsock:4065; each "vsock:PORT" or
 *                              "unix:/PATH" (at most INIT_CMDLINE_MAX_LISTEN).
 *                              unix: listeners are bound just before the
 *                              chroot, so PATH names a file of the boot root
 *                              (a container runtime or a namespace test can
 *                              reach it from outside the sandbox root)
 *   conch.modules=<name>[,<name>…]  kernel modules to load (boot.md §9),
 *                              before those of /etc/conch/modules
 *   conch.console_level=debug|info|warn|error  the console's level once the
 *                              sandbox is ready (default warn; api.md §9)
 *   conch.log_port=<N>         stream the log to the host's vsock port N
 *   conch.log_cid=<N>          ... of this CID instead of 2 (the host; tests)
 * An invalid value is logged and the key ignored (as if absent).
 */
#ifndef CONCH_INIT_CMDLINE_H
#define CONCH_INIT_CMDLINE_H

#include <stddef.h>

#define INIT_CMDLINE_MAX_LAYERS 32
#define INIT_CMDLINE_DEV_MAX 128
#define INIT_CMDLINE_MAX_LISTEN 4
#define INIT_CMDLINE_LISTEN_MAX 108

typedef struct init_cmdline {
  int have_sandbox_id;
  char sandbox_id[256];
  int have_sharefs;
  int sharefs_virtiofs;
  int have_layers;
  size_t nlayers;
  char layers[INIT_CMDLINE_MAX_LAYERS][INIT_CMDLINE_DEV_MAX];
  int have_disk;
  char disk[INIT_CMDLINE_DEV_MAX]; /* "none" or a device path */
  int have_modules;
  char modules[1024]; /* [A-Za-z0-9_,-] */
  int have_console_level;
  int console_level; /* log_level */
  int have_log_port, have_log_cid;
  unsigned log_port, log_cid;
  int have_listen;
  size_t nlisten;
  char listen[INIT_CMDLINE_MAX_LISTEN][INIT_CMDLINE_LISTEN_MAX];
} init_cmdline;

void init_cmdline_reset(init_cmdline *c);
/* Apply one word ("conch.key=value"); anything else is ignored.
 * Returns 1 if the word set a key, 0 otherwise. */
int init_cmdline_word(init_cmdline *c, const char *w, size_t n);
/* Split a kernel command line into words (quotes as the kernel does) and
 * apply each. */
void init_cmdline_parse(init_cmdline *c, const char *text, size_t n);

#endif
