"""The body of tests/bench/vm-arch.sh: boot-to-ready of the arm64 guest
(qemu-system-aarch64, virt) against the x86-64 guest (qemu-system-x86_64,
q35), both TCG, blk layout, 1 vCPU, 512 MiB, alternating boots.  The end
point is the first `ready` answer to the init message over vsock."""
import os
import secrets
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import vm as vmmod  # noqa: E402


def boot(workdir, arch, i):
    v = vmmod.VM("blk", workdir=workdir, name=f"{arch}-{i}", arch=arch)
    t0 = time.time()
    v.start()
    try:
        v.wait_log("waiting for the init message", timeout=600)
        v.ready(secrets.token_hex(8))
        return time.time() - t0
    finally:
        v.close()


def main():
    runs = int(os.environ.get("VM_BOOT_RUNS", "5"))
    workdir = tempfile.mkdtemp(prefix="vm-arch-")
    vmmod.accel()  # the KVM probe (up to 30 s) before the first timed boot
    x, a = [], []
    for i in range(runs):
        x.append(boot(workdir, "x86_64", i))
        a.append(boot(workdir, "aarch64", i))
    shutil.rmtree(workdir)
    mx, ma = statistics.median(x), statistics.median(a)
    print(f"boot to ready, {runs} boots each (medians): x86-64 ({vmmod.accel()}) {mx:.2f} s   "
          f"arm64 (tcg) {ma:.2f} s   ratio arm64/x86-64 {ma / mx:.2f}")


if __name__ == "__main__":
    main()
