#!/usr/bin/python3
"""Boot-to-ready time of conch-init as PID 1 in namespaces (no real devices).

Each run: fresh erofs layers + ext4 disk on loop devices (not timed), then
  t0  exec of `unshare -pfmn --mount-proc chroot ROOT /sbin/conch-init …`
      PID 1 boots; meanwhile the host side puts a veth end into its netns
  t1  veth wired (host-side plumbing, what a VMM has ready before boot)
      init message sent the way conchd does (retry every 10 ms while not_ready)
  t2  `ready` received
and prints exec→ready (t2-t0) and the part after the wiring (t2-t1).
The sandbox has no rootfs entrypoint, so readiness = API serving.
Baseline, measured in the same run: the same unshare + chroot + exec of the
same binary with `--version` (namespaces, dynamic loading, exit) — the ratio
says how much a full boot costs over bare process start-up.
"""
import subprocess
import time
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ns"))
import sandbox as sbx  # noqa: E402


def main():
    binary = os.environ.get("CONCH_INIT_BIN", "build/dev/conch-init")
    runs = int(os.environ.get("BOOT_RUNS", "5"))
    if os.geteuid() != 0 or sbx.missing_tools():
        print("boot benchmark skipped: needs root and", sbx.missing_tools() or "namespaces")
        return 0
    total, after, base = [], [], []
    for i in range(runs):
        s = sbx.Sandbox(binary, entrypoint=False)
        try:
            s.build()
            s.boot()
            resp, _ = s.init_until_ready(s.request())
            t2 = time.monotonic()
            if '"ready"' not in (resp or ""):
                print("not ready:", resp, s.console()[-2000:])
                return 1
            total.append((t2 - s.t_exec) * 1000)
            after.append((t2 - s.t_wired) * 1000)
            t = time.monotonic()
            subprocess.run(["unshare", "-pfmn", "--mount-proc", "chroot", s.root, "/sbin/conch-init", "--version"],
                           check=True, capture_output=True)
            base.append((time.monotonic() - t) * 1000)
        finally:
            left = s.close()
            if left:
                print("leftovers:", left)
                return 1
    print(f"binary: {binary}  runs: {runs}")
    print(f"boot-to-ready (PID 1 exec -> ready response): median {statistics.median(total):.1f} ms  "
          f"min {min(total):.1f}  max {max(total):.1f}")
    print(f"  of which after the veth was wired:          median {statistics.median(after):.1f} ms")
    print(f"baseline (same unshare+chroot+exec, --version): median {statistics.median(base):.1f} ms  "
          f"ratio boot/baseline {statistics.median(total) / statistics.median(base):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
