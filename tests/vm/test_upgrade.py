"""An upgrade in place of PID 1 on the real guest kernel (api.md §9 of the
project's docs/api.md "Upgrading the agent in place", boot.md §13): the
guest's conch-init is replaced by a second build of the same source with
another version string (build/static-next, `make build/static-next/conch-init`),
uploaded with PostFileStream and named to AgentService/Upgrade.  A
background job writing numbered lines runs across it and is read with
`replay`, every line exactly once; two connections from the host through
qemu's hostfwd to servers on the guest's loopback go on across it: one
relayed by the agent's forwarder on the guest IP (its server on ::1, which
an IPv4 connection is never steered to: the relay's sockets and pipes are
carried), one steered by the guest kernel to its server on 127.0.0.1 (the
server's own connection; steering is back after the upgrade); the pid stays 1; an init
message (a restore's, with timestampMs and entropy) is answered by the new
program."""
import base64
import hashlib
import json
import os
import re
import secrets
import socket
import time
import urllib.request

import pytest

from conftest import boot
import vm as vmmod
from conch import Client, b64
from test_process import list_procs, run, output, end_of, start_bg, wait_for
from test_replay import CONNECT, call, channels, contiguous

NEXT = os.path.join(vmmod.ROOT, "build", "static-next", "conch-init")


def metrics(v):
    req = urllib.request.Request(v.url + "/metrics", headers={"conch-init-token": v.token})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def sh(v, script):
    ev, tr = run(v.client, {"cmd": "sh", "args": ["-c", script]})
    assert tr == {}, tr
    return output(ev).decode()


def test_pid1_upgraded_to_another_build(tmp_path_factory):
    assert os.path.exists(NEXT), "make build/static-next/conch-init first (make vm-check does)"
    data = open(NEXT, "rb").read()
    v = boot("pmem", "upgrade", tmp_path_factory, fwd_ports=(8766, 8767))
    try:
        before = metrics(v)
        assert before["upgrades"] == 0, before
        old_version = before["version"]
        n = 600
        pid = start_bg(v.client, {"cmd": "sh", "args": ["-c", f"i=0; while [ $i -lt {n} ]; do i=$((i+1)); "
                                                        f"echo line$i; sleep 0.02; done"], "tag": "across"})
        # some lines now, the rest across the upgrade
        ev, _ = call(v, CONNECT, {"process": {"tag": "across"}, "replay": {}},
                     until=lambda e: sum(len(x[2]) for x in e if x[0] == "data") >= 50)
        seen = contiguous(channels(ev)["stdout"])
        # conversations with servers on the guest's loopback: relayed (::1)
        # and steered (127.0.0.1)
        start_bg(v.client, {"cmd": "python3", "args": ["-c", ECHO, "::1", "8766"], "tag": "echo6"})
        start_bg(v.client, {"cmd": "python3", "args": ["-c", ECHO, "127.0.0.1", "8767"], "tag": "echo4"})

        def forwarded():
            st, body, _ = v.client.unary("/pb.NetworkService/ListPorts", {})
            return len([p for p in body.get("ports", []) if p.get("port") in (8766, 8767) and p.get("forwardedTo")]) == 2
        assert wait_for(forwarded, 60, 0.5), "ports 8766 and 8767 not forwarded"
        steered = f"port 8767: connections to {vmmod.GUEST_IP}:8767 handed to the listener"
        assert wait_for(lambda: steered in v.log(), 30, 0.5), v.log()[-3000:]
        assert f"port 8766: connections to {vmmod.GUEST_IP}:8766 relayed" in v.log(), v.log()[-3000:]
        conv = socket.create_connection(("127.0.0.1", v.fwd[8766]), timeout=60)
        assert say(conv, b"before") == b"before"
        conv4 = socket.create_connection(("127.0.0.1", v.fwd[8767]), timeout=60)
        assert say(conv4, b"before") == b"before"
        chunks = [data[i:i + (1 << 20)] for i in range(0, len(data), 1 << 20)]
        msgs = [{"filepath": "/root/conch-init.next", "content": b64(chunks[0])}] + \
               [{"content": b64(x)} for x in chunks[1:]]
        st, out, end = v.client.stream("/pb.FileService/PostFileStream", msgs)
        assert st == 200 and end == {}, (st, out, end)
        st, body, _ = v.client.unary("/pb.AgentService/Upgrade", {
            "path": "/root/conch-init.next", "sha256": hashlib.sha256(data).hexdigest()})
        assert st == 200, body
        assert body == {"fromVersion": old_version, "toVersion": old_version + "-next"}, body
        # the new program answers, as PID 1, with its version
        after = wait_for(lambda: _try(metrics, v), timeout=120, step=0.2)
        assert after and after["version"] == old_version + "-next" and after["upgrades"] == 1, after
        lg = v.log()
        assert "serving as PID 1 after an upgrade in place" in lg, lg[-3000:]
        assert "upgraded in place: conch-init %s -> %s-next pid=1" % (old_version, old_version) in lg, lg[-3000:]
        assert sh(v, "readlink /proc/1/exe") .startswith("/memfd:"), "PID 1 is not the new program"
        # the relayed connection went on: the same conversation, through the new program
        carried = re.search(r"(\d+) forwarded ports and (\d+) relayed connections carried", lg)
        assert carried and int(carried[1]) >= 1 and int(carried[2]) >= 1, lg[-3000:]
        assert say(conv, b"after the upgrade" * 1000) == b"after the upgrade" * 1000
        conv.close()
        # the steered one is the server's own: untouched; steering is back
        assert say(conv4, b"after the upgrade" * 1000) == b"after the upgrade" * 1000
        conv4.close()
        assert wait_for(lambda: v.log().count(steered) == 2, 30, 0.5), v.log()[-3000:]
        conv4 = socket.create_connection(("127.0.0.1", v.fwd[8767]), timeout=60)
        assert say(conv4, b"new") == b"new"
        conv4.close()
        # the job went on: every line exactly once, from the last offset seen
        ev, end = call(v, CONNECT, {"process": {"tag": "across"}, "replay": {"stdout": str(len(seen))}})
        assert ev[-1] == ("end", 0), ev[-3:]
        rest = contiguous(channels(ev)["stdout"], len(seen))
        assert (seen + rest).decode().split() == [f"line{i}" for i in range(1, n + 1)]
        assert ev[0] == ("start", pid)
        # an init message (a restore's) goes to the new program through the kept listener
        tok = secrets.token_hex(16)
        r = v.init_message(tok, timestampMs=int(time.time() * 1000),
                           entropy=base64.b64encode(secrets.token_bytes(64)).decode())
        assert r == {"version": 1, "status": "ready", "retryable": False}, r
        st, body, _ = Client(v.url, v.token).unary("/pb.ProcessService/List", {})
        assert st == 401, body
        v.token, v.client = tok, Client(v.url, tok)
        assert sh(v, "echo after") == "after\n"
        assert "entropy: 64 bytes credited" in v.log()
    finally:
        v.close()


ECHO = """
import socket, sys, threading
addr, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port))
s.listen()
def echo(c):
    while True:
        d = c.recv(65536)
        if not d:
            c.close()
            return
        c.sendall(d)
while True:
    c, _ = s.accept()
    threading.Thread(target=echo, args=(c,), daemon=True).start()
"""


def say(conv, msg):
    conv.sendall(msg)
    got = b""
    while len(got) < len(msg):
        d = conv.recv(65536)
        assert d, "the relayed connection was cut"
        got += d
    return got


def _try(fn, *a):
    try:
        return fn(*a)
    except OSError:
        return None
