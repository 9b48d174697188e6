"""A fatal boot failure keeps PID 1 alive, logging why, and still reaping.

conch.sharefs=virtiofs on a machine without a virtiofs device: mounting the
volume share fails, which boot.md §5 makes fatal.  PID 1 must log it, never
chroot or listen, ignore SIGTERM, and keep reaping orphans of the namespace.
"""
import os
import time

import pytest

import sandbox as sbx
from test_pid1 import BIN, wait_for

@pytest.fixture(scope="module")
def sb():
    s = sbx.Sandbox(BIN, with_disk=False, entrypoint=False, extra_args=["conch.sharefs=virtiofs"])
    try:
        s.build()
        s.boot()
        yield s
    finally:
        print("\n---- PID 1 console ----\n" + s.console()[-4000:])
        assert s.close() == []


def test_fatal_logged_and_alive(sb):
    log = wait_for(lambda: "fatal:" in sb.console() and sb.console())
    assert "fatal: volumes: mount virtiofs conchfs on /run/conch/volume" in log, log
    assert "PID 1 stays alive" in log
    assert "listening for init messages" not in log  # step 12 never reached
    assert not os.path.exists(sb.sock)
    # not chrooted: PID 1's root is still the boot root
    assert os.path.exists(sb.in_root("/sbin/conch-init"))
    # nothing of the volume setup stays mounted (rolled back)
    assert "/run/conch/volume" not in open(f"/proc/{sb.pid1}/mountinfo").read()
    time.sleep(0.3)
    assert os.path.exists(f"/proc/{sb.pid1}")


def test_fatal_pid1_ignores_sigterm_and_reaps(sb):
    # a workload inside the namespaces (host shell: the boot root has none)
    r = sbx.run("nsenter", "-t", str(sb.pid1), "-p", "-m", "sh", "-c",
                "kill -TERM 1; kill -INT 1; i=0; while [ $i -lt 50 ]; do (sleep 0.2 &); i=$((i+1)); done; echo ok",
                check=False)
    assert r.stdout == "ok\n", r.stderr
    assert [p for p in sb.ns_processes() if p[1] == 1]
    def settled():
        ps = sb.ns_processes()
        return ps and not [p for p in ps if p[1] != 1]
    assert wait_for(settled, timeout=10), sb.ns_processes()
