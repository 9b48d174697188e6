#!/usr/bin/env bash
# Boot benchmark in a real microVM (Debian's stock cloud kernel under qemu,
# the image of `make vm-image`, pmem layout), root only.  VM_BOOT_RUNS
# (default 5) boots of each, alternating:
#   conch-init  qemu start → first `ready` answer over vsock, and PID 1 exec
#               → vsock:4065 listening (conch-init's own log)
#   baseline    a busybox-static /init doing the same module loads
#               (modprobe of /etc/conch/modules with modules.dep), mounts,
#               erofs layers and overlay, then printing a marker
# Prints medians and the ratios.
set -eu
cd "$(dirname "$0")/../.."
make -s vm-image >/dev/null
exec /usr/bin/python3 tests/bench/vm_boot.py
