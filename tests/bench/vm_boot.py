"""The body of tests/bench/vm-boot.sh: conch-init against a busybox /init,
same kernel and images.  The end points differ in kind — conch-init's is
its first `ready` answer over vsock (network applied, API listening),
busybox's a console marker after the overlay mount — so the ratio is an
upper bound of conch-init's own cost."""
import os
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
import vm as vmmod  # noqa: E402

BUSYBOX_INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /mnt/l0 /mnt/l1 /mnt/up /mnt/merge
/bin/busybox mknod /dev/kmsg c 1 11
/bin/busybox echo "bench: exec" > /dev/kmsg
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev
/bin/busybox mount -t tmpfs tmpfs /mnt/up
/bin/busybox modprobe -a $(/bin/busybox grep -v '^#' /etc/conch/modules)
i=0
while [ ! -e /dev/pmem1 ] && [ $i -lt 500 ]; do /bin/busybox usleep 10000; i=$((i+1)); done
/bin/busybox mount -t erofs -o ro /dev/pmem0 /mnt/l0
/bin/busybox mount -t erofs -o ro /dev/pmem1 /mnt/l1
/bin/busybox mkdir -p /mnt/up/u /mnt/up/w
/bin/busybox mount -t overlay overlay -o lowerdir=/mnt/l0:/mnt/l1,upperdir=/mnt/up/u,workdir=/mnt/up/w /mnt/merge
[ -e /mnt/merge/usr ] && /bin/busybox echo "bench: ready" > /dev/kmsg
/bin/busybox poweroff -f
"""


def busybox_initrd(workdir):
    d = tempfile.mkdtemp(dir=workdir)
    subprocess.run(f"zcat {vmmod.IMAGES}/initramfs.cpio.gz | cpio -idm --quiet", shell=True, cwd=d, check=True)
    os.unlink(os.path.join(d, "init"))
    with open(os.path.join(d, "init"), "w") as f:
        f.write(BUSYBOX_INIT)
    os.chmod(os.path.join(d, "init"), 0o755)
    os.makedirs(os.path.join(d, "bin"), exist_ok=True)
    shutil.copy("/bin/busybox", os.path.join(d, "bin", "busybox"))
    out = os.path.join(workdir, "busybox-initrd")
    subprocess.run(f"find . | cpio -o -H newc --quiet -R 0:0 | gzip -1 > {out}", shell=True, cwd=d, check=True)
    shutil.rmtree(d)
    return out


def log_ts(line):
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S.%f").timestamp()


def run_conch(workdir, i):
    v = vmmod.VM("pmem", workdir=workdir, name=f"c{i}")
    try:
        v.start()
        v.wait_log("waiting for the init message", timeout=300)
        v.ready(secrets.token_hex(8))
    except BaseException:
        v.close()
        raise
    t_ready = time.time() - v.t_start
    lg = v.log()
    a = [ln for ln in lg.splitlines() if "starting as PID 1" in ln][0]
    b = [ln for ln in lg.splitlines() if "listening for init messages on vsock:4065" in ln][0]
    v.close()
    return t_ready, log_ts(b) - log_ts(a)


def run_busybox(workdir, initrd, i):
    v = vmmod.VM("pmem", workdir=workdir, name=f"b{i}")
    args = v.args()
    args[args.index("-initrd") + 1] = initrd
    con = v.console
    t0 = time.time()
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t_ready = None
    while p.poll() is None and time.time() - t0 < 300:
        if os.path.exists(con) and "bench: ready" in open(con, errors="replace").read():
            t_ready = time.time() - t0
            break
        time.sleep(0.02)
    p.kill()
    p.wait()
    txt = open(con, errors="replace").read()
    ts = dict((m.group(2), float(m.group(1))) for m in re.finditer(r"\[\s*([\d.]+)\] bench: (\w+)", txt))
    if t_ready is None or "ready" not in ts:
        raise SystemExit("busybox baseline did not reach its marker:\n" + txt[-2000:])
    return t_ready, ts["ready"] - ts["exec"]


def main():
    runs = int(os.environ.get("VM_BOOT_RUNS", "5"))
    workdir = tempfile.mkdtemp(prefix="vm-boot-")
    initrd = busybox_initrd(workdir)
    c, b = [], []
    for i in range(runs):  # alternate, so a slow phase of the machine hits both
        c.append(run_conch(workdir, i))
        b.append(run_busybox(workdir, initrd, i))
    shutil.rmtree(workdir)
    med = lambda xs: statistics.median(xs)  # noqa: E731
    cq, cp = med([x[0] for x in c]), med([x[1] for x in c])
    bq, bp = med([x[0] for x in b]), med([x[1] for x in b])
    print(f"accel {vmmod.accel()}, {runs} boots each (medians)")
    print(f"qemu start -> ready:  conch-init {cq:.3f} s (first `ready` over vsock)   "
          f"busybox {bq:.3f} s (marker)   ratio {cq / bq:.2f}x")
    print(f"PID 1 exec -> up:     conch-init {cp * 1000:.0f} ms (vsock listening)   "
          f"busybox {bp * 1000:.0f} ms (overlay mounted)   ratio {cp / bp:.2f}x")


if __name__ == "__main__":
    main()
