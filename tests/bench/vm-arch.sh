#!/usr/bin/env bash
# arm64 against x86-64 boot to ready in a real microVM (Debian's stock cloud
# kernels under qemu TCG, the images of `make vm-image` and
# `make vm-image-arm64`, blk layout), root only.  VM_BOOT_RUNS (default 5)
# boots of each, alternating.  Prints medians and the ratio.
set -eu
cd "$(dirname "$0")/../.."
make -s vm-image vm-image-arm64 >/dev/null
exec /usr/bin/python3 tests/bench/vm_arch.py
