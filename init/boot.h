/* boot — the PID 1 boot steps of boot.md §2 (steps 2–11), synchronous
 * syscalls run before the loop serves anything.  pid1.c sequences them
 * (the 500 ms /dev/pmem* wait is a loop timer there, not a sleep).
 *
 * Seams (documented options, see cmdline.h): conch.layers names the
 * read-only layer devices (mounted on /mnt/conch/layer<i>, first = newest)
 * instead of /dev/pmem*; conch.disk names the writable ext4 device instead
 * of /dev/vda, or "none" for the RAM upper layer.
 *
 * Deviations, all deliberate and harmless: a step-7 file system whose
 * mount point is already a mount point is kept as it is (no stacked second
 * proc/devtmpfs); the entrypoint check runs right after the chroot so a
 * symlinked /etc/conch/entrypoint resolves inside the sandbox root.
 */
#ifndef CONCH_INIT_BOOT_H
#define CONCH_INIT_BOOT_H

#include <stddef.h>

#include "init/cmdline.h"
#include "init/layers.h"

#define BOOT_MERGE "/mnt/conch/merge"
#define BOOT_PATH_MAX 192

typedef struct boot_state {
  init_cmdline cmd;
  char upper[BOOT_PATH_MAX], work[BOOT_PATH_MAX];
  size_t nlower;
  char lower[LAYERS_MAX][BOOT_PATH_MAX];
  int merge_ready;       /* step 10 */
  int chrooted;
  int have_entrypoint;   /* step 11 */
  int services_required; /* boot.md §6 */
} boot_state;

/* Steps 2–8 (the caller did step 1).  argv words conch.KEY=V come before
 * /proc/cmdline.  Never fails (warnings only). */
void boot_early(boot_state *b, int argc, char **argv);
/* 1 if step 9 must wait for /dev/pmem*: no conch.layers, and no pmem
 * device yet or fewer than the NVDIMM regions in /sys/bus/nd/devices (the
 * devices of freshly loaded modules appear one by one). */
int boot_need_pmem_wait(const boot_state *b);
/* Step 9: mount the read-only layers and the overlay. */
void boot_layers(boot_state *b);
/* Steps 10–11.  bind_before_chroot(arg) runs right before the chroot
 * (unix: init listeners); it returns 0 or -1 (fatal, reason in err).
 * Returns 0, or -1 on a fatal failure with the reason in err. */
int boot_prepare_root(boot_state *b, int (*bind_before_chroot)(void *arg, char *err, size_t errlen),
                      void *arg, char *err, size_t errlen);

#endif
