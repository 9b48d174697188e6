"""conch-init on arm64: the static aarch64 binary (make static-arm64) as PID 1
of Debian's stock arm64 cloud kernel under qemu-system-aarch64 (TCG, `virt`
machine), the image of `make vm-image-arm64`: modules loaded by PID 1, layers
on virtio-blk, the init message over the guest's AF_VSOCK (vmbridge.c), then
the seeds' curl examples and SDK behaviours, a PTY, an upload/download round
trip, and the unit tests that qemu-user cannot run (Makefile
ARM64_GUEST_TESTS) run on the real arm64 kernel.

The tests of x86-64's suite are called with the arm64 guest: the same
assertions, the other architecture."""
import hashlib
import os
import re
import time

import pytest

import test_vm as x86  # its tests, called with the arm64 guest (not collected again here)
from conftest import boot
from conch import b64
from test_process import end_of, output, run
import vm as vmmod

GUEST_TESTS = ["test_proc_reaper", "test_proc_spawn", "test_fs_tree", "test_net_scan", "test_net_steer"]


@pytest.fixture(scope="module")
def arm64_vm(tmp_path_factory):
    binp = os.path.join(vmmod.ROOT, "build", "static-arm64", "conch-init")
    shap = os.path.join(vmmod.IMAGES_ARM64, "conch-init.sha256")
    if not os.path.exists(shap) or not os.path.exists(binp):
        pytest.fail("no arm64 VM image: run `make vm-image-arm64` (or `make vm-check`)", pytrace=False)
    if open(shap).read().strip() != hashlib.sha256(open(binp, "rb").read()).hexdigest():
        pytest.fail("build/vm-arm64 holds an older conch-init: run `make vm-image-arm64`", pytrace=False)
    t0 = time.time()
    v = boot("blk", "arm64", tmp_path_factory, arch="aarch64")
    v.boot_s = time.time() - t0
    print(f"\narm64 boot to ready (qemu-system-aarch64 TCG, virt, 1 vCPU, 512 MiB): {v.boot_s:.1f} s")
    yield v
    v.close()


def test_aarch64_kernel_modules_and_vsock(arm64_vm):
    v = arm64_vm
    out, _, rc = x86.sh(v, "uname -m; uname -r; cat /proc/cpuinfo | grep -c ^processor")
    machine, release, _ = out.split("\n", 2)
    assert rc == 0 and machine == "aarch64" and release.endswith("-cloud-arm64"), out
    lg = v.log()
    m = re.search(r"kernel modules: (\d+) loaded, \d+ built in or already loaded, (\d+) failed", lg)
    assert m and int(m.group(1)) > 0 and m.group(2) == "0", lg[-3000:]
    assert "listening for init messages on vsock:4065" in lg
    assert "init message applied guest_ip=10.0.2.15/24" in lg and "sandbox ready" in lg
    assert re.search(r"read-only layer /dev/vd[bc] mounted", lg) and "writable layer: /dev/vda (ext4)" in lg
    assert "workload envelope" in lg  # cgroup v2 with controllers on the arm64 kernel too
    assert x86.sh(v, "cat /etc/conch-layer")[0] == "top\n"  # newest layer wins


def test_seed_sdk_behaviours(arm64_vm):
    x86.test_seed_sdk_behaviours(arm64_vm)


def test_pty(arm64_vm):
    x86.test_pty(arm64_vm)


def test_background_server_signal_and_seed_curls(arm64_vm):
    x86.test_background_server_signal_and_seed_curls(arm64_vm)


def test_files_upload_download(arm64_vm):
    x86.test_files_upload_download(arm64_vm)


@pytest.mark.parametrize("name", GUEST_TESTS)
def test_unit_tests_on_the_arm64_kernel(arm64_vm, name):
    """Uploaded with PostFileStream, run by StartProcess: 'N passed, 0 failed'."""
    c = arm64_vm.client
    data = open(os.path.join(vmmod.ROOT, "build", "static-arm64", "tests", name), "rb").read()
    path = f"/root/unit/{name}"
    chunks = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
    msgs = [{"filepath": path, "content": b64(chunks[0])}] + [{"content": b64(x)} for x in chunks[1:]]
    st, out, end = c.stream("/pb.FileService/PostFileStream", msgs)
    assert st == 200 and end == {}, (st, out, end)
    ev, tr = run(c, {"cmd": "sh", "args": ["-c", f"chmod +x {path} && cd /root/unit && {path}"],
                    "env": {"CONCH_TEST_TMPFS": "/tmp"}},  # no /dev/shm in the sandbox root (boot.md §11)
                 timeout_ms=240000)
    text = (output(ev) + output(ev, "stderr")).decode(errors="replace")
    e = end_of(ev)
    assert tr == {} and e[1] == 0, (text, tr, e)
    m = re.search(r"(\d+) passed, (\d+) failed", text)
    assert m and int(m.group(1)) > 0 and m.group(2) == "0", text
    assert "NOT RUN" not in text, text  # test_proc_spawn's cgroup tests: the clone3 entry's arm64 assembly
    print(f"\n{name} on arm64: {m.group(0)}")
