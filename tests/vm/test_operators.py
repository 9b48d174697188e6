"""Operators (api.md §9) in a real guest: a serial console nobody drains
never stops the sandbox, the console gets warn and above once ready, and
the log streams to a vsock listener as JSON lines — here one in the guest
itself on CID 1 (vsock_loopback, `conch.log_cid=1`), the lines logged
while it was away sent when it is back.

One guest for both (the VM suite's time is precious): its console is a
unix socket this test reads and stops reading."""
import json
import threading
import time
import urllib.request

import pytest

from conftest import BOOT_TIMEOUT
import vm as vmmod
from conch import Client
from test_process import check_ok, output, run, send_signal, start_bg, wait_for

PORT = 7777

LISTENER = r"""
import socket, sys
s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((socket.VMADDR_CID_ANY, %d))
s.listen(1)
c, _ = s.accept()
with open(sys.argv[1], "wb") as f:
    while True:
        b = c.recv(65536)
        if not b:
            break
        f.write(b)
        f.flush()
""" % PORT


@pytest.fixture(scope="module")
def ops_vm(tmp_path_factory):
    import secrets
    v = vmmod.VM("pmem", workdir=str(tmp_path_factory.mktemp("ops")), name="ops", console_level=None,
                 cmdline=(f"conch.log_port={PORT}", "conch.log_cid=1"), console_sock=True)
    try:
        v.start()
        v.wait_log("waiting for the init message", timeout=BOOT_TIMEOUT)
        v.token = secrets.token_hex(16)
        v.ready(v.token)
        v.client = Client(v.url, v.token)
        yield v
    finally:
        v.close()


def guest_file(v, path):
    ev, tr = run(v.client, {"cmd": "cat", "args": [path]})
    return output(ev).decode(errors="replace")


def stream_lines(v, path):
    return [json.loads(l) for l in guest_file(v, path).splitlines() if l.startswith("{")]


def test_host_stream_over_vsock_loopback(ops_vm):
    v = ops_vm
    # the boot was logged before anything listened: kept, sent first
    start_bg(v.client, {"cmd": "python3", "args": ["-c", LISTENER, "/tmp/stream.1"], "tag": "listen1"})
    got = wait_for(lambda: [o for o in stream_lines(v, "/tmp/stream.1") if o["msg"] == "sandbox ready"], 90, 0.5)
    assert got, guest_file(v, "/tmp/stream.1")[-2000:]
    lines = stream_lines(v, "/tmp/stream.1")
    boot = [o for o in lines if o["msg"] == "boot:" and o.get("sandbox_id") == "vm-test"]  # boot step 4
    assert boot and boot[0]["level"] == "info" and boot[0]["src"].startswith("boot.c:"), lines[:5]
    assert set(got[0]) >= {"ts", "level", "src", "sandboxId", "msg"} and got[0]["sandboxId"] == "vm-test", got[0]
    # away: the listener goes, commands are logged meanwhile, it comes back
    send_signal(v.client, {"tag": "listen1"}, 9)
    for code in (41, 42, 43):
        run(v.client, {"cmd": "sh", "args": ["-c", f"exit {code}"]})
    start_bg(v.client, {"cmd": "python3", "args": ["-c", LISTENER, "/tmp/stream.2"], "tag": "listen2"})
    ended = lambda: {o.get("exit_code") for o in stream_lines(v, "/tmp/stream.2") if o["msg"] == "process ended"}
    assert wait_for(lambda: {"41", "42", "43"} <= ended(), 90, 0.5), guest_file(v, "/tmp/stream.2")[-2000:]


def test_stalled_console_keeps_the_sandbox_serving(ops_vm):
    v = ops_vm
    # once ready, the console shows warn and above only (the boot in full)
    lg = v.log()
    assert "[INFO] boot.c:" in lg and "sandbox ready" in lg, lg[-3000:]
    after = lg[lg.index("sandbox ready"):].splitlines()[1:]
    assert not [l for l in after if "[INFO]" in l or "[DEBUG]" in l], after[-20:]
    # nobody drains the console any more; a workload fills it; the agent's
    # own lines go to it again (consoleLogLevel), so every one would block
    v.pause_console()
    start_bg(v.client, {"cmd": "sh", "args": ["-c", "head -c 1000000 /dev/zero | tr '\\0' x > /dev/console"],
                        "tag": "flood"})
    assert v.init_message(v.token, consoleLogLevel="info")["status"] == "ready"
    worst, stop, fails = [0.0], threading.Event(), []

    def watch():
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                urllib.request.urlopen(v.url + "/health", timeout=10).read()
            except OSError as e:
                fails.append(repr(e))
            worst[0] = max(worst[0], time.monotonic() - t0)
            time.sleep(0.1)
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        for i in range(500):
            ev, tr = run(v.client, {"cmd": "echo", "args": [f"c{i}"]})
            check_ok(ev, tr)
            assert output(ev) == f"c{i}\n".encode()
    finally:
        stop.set()
        t.join(30)
    assert not fails, fails[:3]
    assert worst[0] < 1.0, f"/health took {worst[0]:.2f} s with the console stalled"
    assert v.init_message(v.token)["status"] == "ready"  # still ready
    # drained again: the drop line arrives
    v.pause_console(False)
    run(v.client, {"cmd": "true"})
    assert wait_for(lambda: "log lines dropped" in v.log(), 120, 0.5), v.log()[-2000:]
