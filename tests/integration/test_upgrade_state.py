"""Upgrading the agent in place, what it carries (docs/api.md "Upgrading the
agent in place", docs/guide/upgrade.md): `conch-init serve` upgraded with
AgentService/Upgrade to a copy of the same binary keeps its pid, its
listening socket (never refusing), and every process record (in start
order, upgrade after upgrade) — background,
PTY, stdin_open with pending input, lingering leftovers, exited records
with their exit codes, a deadline that falls after the upgrade, foreground
commands adopted — the retained output with its offsets, the init
listener and its state; a child that exits during the exec is reaped with
its true status; a new program that cannot restore the state rolls back to
the old one; 20 upgrades in a row leave no descriptor or memory behind.
The refusals live in test_upgrade.py."""
import array
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

import pytest

from conch import Client, b64, envelope
from conftest import BIN, Server, sanitizer_report, status_kib
from test_ports import OUT, echo_backend, forwarding_agent, in_ns, listener, out_conn, read_to_eof, wait_forwarded
from test_replay import CONNECT, SP, Stream, call, channels, contiguous

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import initpeer  # noqa: E402

UPGRADE = "/pb.AgentService/Upgrade"
LIST = "/pb.ProcessService/List"


def metrics(s):
    req = urllib.request.Request(s.url + "/metrics", headers={"conch-init-token": s.token})
    with urllib.request.urlopen(req, timeout=20) as r:
        return json.loads(r.read())


def wait_for(pred, timeout=20.0, step=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            v = pred()
        except OSError:
            v = None
        if v:
            return v
        time.sleep(step)
    return pred()


def upgrade(s, prog=BIN, expect_upgrades=None):
    """Upgrade s to prog; wait until the new program serves (/metrics says
    so: `upgrades` went up, or expect_upgrades)."""
    before = metrics(s)["upgrades"]
    st, body, _ = Client(s.url, s.token).unary(UPGRADE, {"path": prog})
    assert st == 200, body
    want = before + 1 if expect_upgrades is None else expect_upgrades
    # the new program answers once it restored everything
    assert wait_for(lambda: s.alive() and _log_count(s, "upgraded in place" if want > before else "rolled back")
                    >= (want if want > before else 1)), open(s.log_path).read()[-3000:]
    m = wait_for(lambda: metrics(s))
    assert m["upgrades"] == want, m
    return body


def _log_count(s, text):
    return open(s.log_path, errors="replace").read().count(text)


def bg(s, cmd, tag, timeout_ms=None, **kw):
    req = dict({"cmd": "sh", "args": ["-c", cmd], "background": True, "tag": tag}, **kw)
    c = Client(s.url, s.token)
    conn = c.conn(timeout=20)
    h = c.headers(ctype="application/connect+json")
    if timeout_ms:
        h["Connect-Timeout-Ms"] = str(timeout_ms)
    conn.request("POST", SP, body=envelope(json.dumps(req).encode()), headers=h)
    r = conn.getresponse()
    assert r.status == 200
    buf = b""
    while len(buf) < 5 or len(buf) < 5 + int.from_bytes(buf[1:5], "big"):
        chunk = r.read1(4096)
        assert chunk, buf
        buf += chunk
    conn.close()
    ev = json.loads(buf[5:5 + int.from_bytes(buf[1:5], "big")])
    assert "start" in ev, ev
    return ev["start"]["pid"]


def events_of(s, sel, replay=None, until=None):
    req = {"process": sel}
    if replay is not None:
        req["replay"] = replay
    return call(s, CONNECT, req, until=until)


@pytest.fixture
def server(request):
    srv = Server(name=request.node.name, env={"CONCH_PROC_RETAIN_MS": "60000"})
    yield srv
    text = srv.stop()
    assert sanitizer_report(text) is None, sanitizer_report(text)


# ---------------------------------------------------------------- what is carried
def test_every_kind_of_process_is_carried(server):
    s = server
    c = Client(s.url, s.token)
    agent_pid = s.proc.pid
    n = 300
    writer = bg(s, f"i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo line$i; sleep 0.01; done", "writer")
    bg(s, "stty size; exec cat", "pty", pty={"cols": 111, "rows": 33})
    bg(s, "sleep 1.5; exec cat", "stdin", stdin_open=True)
    st, body, _ = c.unary("/pb.ProcessService/SendInput",
                          {"process": {"tag": "stdin"}, "input": {"stdin": b64(b"pending input\n")}})
    assert st == 200, body
    exited = bg(s, "exit 7", "exited")
    linger = bg(s, "sleep 60 & echo $! > /tmp/conch-upgrade-linger-$$; exit 3", "linger")
    deadline = bg(s, "sleep 60", "deadline", timeout_ms=2500)
    t_deadline = time.monotonic()
    # (longer than the drain waits for it: cut at the exec, then adopted)
    fg = Stream(s, SP, {"cmd": "sh", "args": ["-c", "for i in $(seq 1 100); do echo fg$i; sleep 0.05; done; exit 5"]})
    assert fg.next()[0] == "start"
    time.sleep(0.3)
    # what was seen before: part of the writer's output
    ev, _ = events_of(s, {"tag": "writer"}, replay={}, until=lambda e: sum(len(x[2]) for x in e if x[0] == "data") >= 100)
    seen = contiguous(channels(ev)["stdout"])
    fds_before = len(os.listdir(f"/proc/{agent_pid}/fd"))

    body = upgrade(s)
    assert body["fromVersion"] == body["toVersion"] and body["fromVersion"], body
    assert s.proc.pid == agent_pid and s.alive()
    st, lst, _ = c.unary(LIST, {})
    fgp = [p for p in lst.get("processes", []) if not p.get("tag")]
    assert len(fgp) == 1 and fgp[0]["config"]["args"][1].startswith("for i in"), lst
    # the foreground stream ended without an end (its connection closed)
    with pytest.raises(Exception):
        while fg.next() is not None:
            pass
    assert fg.end is None

    # background writer: every line exactly once, resumed at the last offset seen
    ev, end = events_of(s, {"tag": "writer"}, replay={"stdout": str(len(seen))})
    assert ev[0] == ("start", writer) and ev[-1] == ("end", 0), ev[-3:]
    rest = contiguous(channels(ev)["stdout"], len(seen))
    assert (seen + rest).decode().split() == [f"line{i}" for i in range(1, n + 1)]
    # the PTY kept its size and its input
    st, body2, _ = c.unary("/pb.ProcessService/SendInput", {"process": {"tag": "pty"}, "input": {"pty": b64(b"typed\n")}})
    assert st == 200, body2
    ev, _ = events_of(s, {"tag": "pty"}, replay={}, until=lambda e: b"typed" in b"".join(x[2] for x in e if x[0] == "data"))
    out = contiguous(channels(ev)["pty"])
    assert out.startswith(b"33 111\r\n"), out
    # the pending input was written once the process read
    ev, _ = events_of(s, {"tag": "stdin"}, replay={}, until=lambda e: b"pending input\n" in b"".join(x[2] for x in e if x[0] == "data"))
    assert contiguous(channels(ev)["stdout"]) == b"pending input\n"
    st, b3, _ = c.unary("/pb.ProcessService/CloseStdin", {"process": {"tag": "stdin"}})
    assert st == 200, b3
    ev, _ = events_of(s, {"tag": "stdin"})
    assert ev[-1] == ("end", 0), ev
    # the exited record and its exit code
    ev, _ = events_of(s, {"tag": "exited"})
    assert ev == [("start", exited), ("end", 7)], ev
    # the lingering record: exit 3, its leftover still signalable through the cgroup
    ev, _ = events_of(s, {"tag": "linger"})
    assert ev == [("start", linger), ("end", 3)], ev
    left = int(open(f"/tmp/conch-upgrade-linger-{linger}").read())
    os.unlink(f"/tmp/conch-upgrade-linger-{linger}")
    assert os.path.exists(f"/proc/{left}")
    st, b4, _ = c.unary("/pb.ProcessService/SendSignal", {"process": {"tag": "linger"}, "signal": 9})
    assert wait_for(lambda: not os.path.exists(f"/proc/{left}") or "State:\tZ" in open(f"/proc/{left}/status").read(), 10)
    # the deadline set before the upgrade fires at its time, not before
    ev, _ = events_of(s, {"tag": "deadline"})
    took = time.monotonic() - t_deadline
    assert ev == [("start", deadline), ("end", -1)], ev
    assert 2.0 <= took <= 10, took
    # the foreground command was adopted: Connect finds it by pid, its output from the upgrade on
    ev, _ = events_of(s, {"pid": fgp[0]["pid"]}, replay={})
    assert ev[-1] == ("end", 5), ev[-3:]
    chunks = channels(ev)["stdout"]
    text = contiguous(chunks, chunks[0][0]).decode()
    assert text.split()[-1] == "fg100" and chunks[0][0] > 0, (chunks[:2], text[-20:])
    # nothing left behind: the descriptors are the same as before (the
    # processes that ended meanwhile closed theirs)
    assert len(os.listdir(f"/proc/{agent_pid}/fd")) <= fds_before


def test_a_child_exiting_during_the_exec_is_reaped_with_its_status(server):
    s = server
    pids = {k: bg(s, f"sleep 0.{k:02d}; exit {k + 10}", f"x{k}") for k in range(0, 60, 3)}
    upgrade(s)
    for k, pid in pids.items():
        ev, _ = events_of(s, {"pid": pid})
        assert ev == [("start", pid), ("end", k + 10)], (k, ev)


def test_the_listener_never_refuses(server):
    """Clients connecting all through 5 upgrades: each is answered, none
    refused (they wait in the backlog while no program accepts)."""
    s = server
    stop = threading.Event()
    seen = {"ok": 0, "refused": 0, "other": []}

    def hammer():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(s.url + "/health", timeout=20) as r:
                    assert r.status == 200
                    seen["ok"] += 1
            except ConnectionRefusedError:
                seen["refused"] += 1
            except OSError as e:  # a connection the exec cut mid-answer: not a refusal
                seen["other"].append(repr(e))
    ts = [threading.Thread(target=hammer) for _ in range(3)]
    for t in ts:
        t.start()
    try:
        for _ in range(5):
            upgrade(s)
    finally:
        stop.set()
        for t in ts:
            t.join()
    assert seen["refused"] == 0 and seen["ok"] > 20, seen
    assert len(seen["other"]) <= 15, seen  # at most a cut connection per thread and upgrade


def test_init_listener_and_state_are_kept(tmp_path):
    sock = "unix:" + str(tmp_path / "init.sock")
    s = Server(name="test_upgrade_init", token="", extra_args=["--init-listen", sock])
    try:
        msg = {"version": 1, "sandboxID": "upgrade-sb", "agentToken": "t1", "env": {"FROM_INIT": "yes"},
               "network": {"guestIP": "10.0.2.15", "prefixLength": 24, "gateway": "10.0.2.2"}}
        assert initpeer.exchange(sock, msg) == '{"version":1,"status":"ready","retryable":false}'
        s.token = "t1"
        upgrade(s)
        c = Client(s.url, "t1")
        st, _, _ = c.unary(LIST, {})
        assert st == 200
        ev, _ = call(s, SP, {"cmd": "sh", "args": ["-c", "echo $FROM_INIT"]})
        assert b"".join(x[2] for x in ev if x[0] == "data") == b"yes\n"
        # the listener is the same socket: the next message goes to the new program
        assert initpeer.exchange(sock, dict(msg, agentToken="t2")) == \
            '{"version":1,"status":"ready","retryable":false}'
        assert Client(s.url, "t1").unary(LIST, {})[0] == 401
        assert Client(s.url, "t2").unary(LIST, {})[0] == 200
        s.token = "t2"
        assert "upgrade-sb" in open(s.log_path).read()
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


# ---------------------------------------------------------------- rollback
@pytest.mark.parametrize("fault,why", [
    ("handover_restore", "CONCH_FAULT=handover_restore"),
    ("handover_format", "state format 1002 is not one this program reads"),
])
def test_rollback_to_the_previous_program(fault, why):
    """A new program that cannot restore the state hands it back: the old
    program comes back as it was (same pid, processes, version, upgrades 0)."""
    s = Server(name=f"test_upgrade_rollback_{fault}", env={"CONCH_FAULT": fault})
    try:
        n = 200
        bg(s, f"i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo line$i; sleep 0.01; done", "writer")
        pid = s.proc.pid
        upgrade(s, expect_upgrades=0)
        log = open(s.log_path).read()
        assert why in log and "rolling back to the previous program" in log and "upgrade rolled back" in log, log[-3000:]
        assert s.proc.pid == pid and metrics(s)["upgrades"] == 0
        ev, _ = events_of(s, {"tag": "writer"}, replay={})
        assert contiguous(channels(ev)["stdout"]).decode().split() == [f"line{i}" for i in range(1, n + 1)]
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


def test_a_state_of_format_1_is_read():
    """A program of format 2 takes the state of a format-1 writer (one
    from before forwarders were carried; CONCH_FAULT=handover_format_1
    makes the old program write as one): its records and their output."""
    s = Server(name="test_upgrade_format_1", env={"CONCH_FAULT": "handover_format_1"})
    try:
        n = 200
        bg(s, f"i=0; while [ $i -lt {n} ]; do i=$((i+1)); echo line$i; sleep 0.01; done", "writer")
        pid = s.proc.pid
        upgrade(s)
        assert "upgrades=1 (state format 1)" in open(s.log_path).read()
        assert s.proc.pid == pid
        ev, _ = events_of(s, {"tag": "writer"}, replay={})
        assert contiguous(channels(ev)["stdout"]).decode().split() == [f"line{i}" for i in range(1, n + 1)]
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


# ---------------------------------------------------------------- leaks
def settled_fds(pid):
    """open_fds once two looks 100 ms apart agree (no connection closing)."""
    prev = open_fds(pid)
    for _ in range(50):
        time.sleep(0.1)
        cur = open_fds(pid)
        if cur == prev:
            return cur
        prev = cur
    return prev


def open_fds(pid):
    """What the agent holds open: sockets and files by identity, pipes
    and anonymous inodes by kind (libuv makes its own anew in each program;
    the listening socket moves to another number, it stays the same socket)."""
    out = []
    for f in os.listdir(f"/proc/{pid}/fd"):
        try:
            t = os.readlink(f"/proc/{pid}/fd/{f}")
        except FileNotFoundError:
            continue
        out.append("pipe" if t.startswith("pipe:") else t)
    return sorted(out)


def test_the_table_keeps_its_start_order_across_upgrades(server):
    """List (and the newest-first lookups, the oldest retained record going
    first) rely on the table's start order: kept by one upgrade and by the
    next ones, with records started in between."""
    s = server
    c = Client(s.url, s.token)

    def tags():
        st, lst, _ = c.unary(LIST, {})
        assert st == 200, lst
        return [p["tag"] for p in lst["processes"]]

    for t in ("a", "b", "c"):
        bg(s, "sleep 120", t)
    assert tags() == ["a", "b", "c"]
    upgrade(s)
    assert tags() == ["a", "b", "c"]
    bg(s, "sleep 120", "d")
    upgrade(s)
    assert tags() == ["a", "b", "c", "d"]
    upgrade(s)
    assert tags() == ["a", "b", "c", "d"]


def test_twenty_upgrades_leave_nothing_behind(server):
    s = server
    bg(s, "sleep 120", "keeper")
    upgrade(s)
    pid = s.proc.pid
    fds = settled_fds(pid)
    rss = status_kib(pid, "VmRSS")
    for _ in range(20):
        upgrade(s)
    assert metrics(s)["upgrades"] == 21
    # (a connection of the last call may still be closing: give it a moment)
    assert wait_for(lambda: open_fds(pid) == fds, 5), (open_fds(pid), fds)
    assert status_kib(pid, "VmRSS") <= rss * 1.25 + 4096, (rss, status_kib(pid, "VmRSS"))
    # no memfd of an earlier program or state is still mapped
    maps = open(f"/proc/{pid}/maps").read()
    assert maps.count("conch-handover") == 0, maps
    st, lst, _ = Client(s.url, s.token).unary(LIST, {})
    assert [p["tag"] for p in lst["processes"]] == ["keeper"]


# ---------------------------------------------------------------- the guide
def test_the_guides_rollout_commands_work_as_written(server, tmp_path):
    """docs/guide/upgrade.md's upload and Upgrade blocks, run by bash as
    written (with api.md's shell definitions) in a directory holding the
    binary under test as `conch-init`."""
    import re
    from conftest import ROOT
    guide = open(os.path.join(ROOT, "docs", "guide", "upgrade.md")).read()
    blocks = [textwrap.dedent(b) for b in re.findall(r"```sh\n(.*?)```", guide, re.S)][:2]
    assert len(blocks) == 2 and "PostFileStream" in blocks[0] and "Upgrade" in blocks[1], blocks
    api = open(os.path.join(ROOT, "docs", "api.md")).read()
    defs = re.search(r"```sh\n(U=http.*?)```", api, re.S).group(1)
    defs = defs.replace("U=http://127.0.0.1:4064 TOKEN=my-token", f"U={server.url} TOKEN={server.token}")
    shutil.copy(BIN, tmp_path / "conch-init")
    p = subprocess.run(["bash", "-c", "set -e\n" + defs + "\n" + blocks[0] + "\n" + blocks[1]], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.strip().splitlines()
    assert json.loads(lines[-1])["toVersion"], p.stdout
    assert wait_for(lambda: metrics(server)["upgrades"] == 1), open(server.log_path).read()[-2000:]
    os.unlink("/tmp/conch-init.new")
    shutil.rmtree("/tmp/up", ignore_errors=True)


# ---------------------------------------------------------------- forwarded ports
class Hammer:
    """A thread connecting to OUT:port over and over (from OUT, in the
    agent's namespace), each time sending a byte and waiting for its echo;
    seen counts the answers, the refusals and anything else."""

    def __init__(self, s, port):
        self.s, self.port = s, port
        self.seen = {"ok": 0, "refused": 0, "other": []}
        self.done = threading.Event()
        self.t = threading.Thread(target=self.run)

    def start(self):
        self.t.start()

    def stop(self):
        self.done.set()
        if self.t.is_alive():
            self.t.join()

    def run(self):
        while not self.done.is_set():
            try:
                with in_ns(self.s.ns), socket.socket() as c:
                    c.settimeout(20)
                    c.bind((OUT, 0))
                    c.connect((OUT, self.port))
                    c.sendall(b"x")
                    got = c.recv(1)
                if got == b"x":
                    self.seen["ok"] += 1
                else:
                    self.seen["other"].append(f"answer {got!r}")
            except ConnectionRefusedError:
                self.seen["refused"] += 1
            except Exception as e:  # noqa: BLE001 - all of it counted
                self.seen["other"].append(repr(e))


def test_forwarded_ports_and_relayed_connections_are_carried():
    """serve --forward-ports in a network namespace of the test's own: the
    forwarders' listening sockets and every relayed connection (its two
    sockets and its two pipes, with the bytes in them) are carried. A
    conversation goes on, a download stalled with its pipes full at the
    exec loses no byte, a half-closed connection still gets its answer,
    and clients connecting to a forwarded port all through the upgrades
    are never refused."""
    with forwarding_agent("upgrade_fwd", env={"CONCH_FORWARD_STEER": "0"}) as s:  # every connection relayed
        _forwarded_across_upgrades(s)


def test_steered_ports_across_upgrades():
    """With steering on, our BPF objects close at the exec and the carried
    forwarder takes the port's connections until the new program's first
    scan steers again: a client connecting all through three upgrades is
    never refused, a steered conversation (the server's own connection)
    is not touched, and after each upgrade connections are steered again."""
    with forwarding_agent("upgrade_steer") as s:
        echo = echo_backend(s)
        with in_ns(s.ns):
            lis = listener()
        ports = [echo.getsockname()[1], lis.getsockname()[1]]
        marks = [f"port {p}: connections to {OUT}:{p} handed to the listener" for p in ports]
        ham = Hammer(s, ports[0])
        try:
            for p in ports:
                assert wait_forwarded(s, p), p
            for k in range(4):
                if k:
                    with in_ns(s.ns):
                        upgrade(s)
                assert wait_for(lambda: all(_log_count(s, m) == k + 1 for m in marks), timeout=10), k
                if k == 0:
                    conv = out_conn(s, ports[0])
                    conv.settimeout(20)
                    ham.start()
                conv.sendall(b"round %d" % k)  # steered before the first upgrade: the server's own
                assert conv.recv(100) == b"round %d" % k
                c = out_conn(s, ports[1])
                lis.settimeout(10)
                b, peer = lis.accept()
                assert b.getsockname()[:2] == (OUT, ports[1]) and peer[:2] == c.getsockname()[:2], k
                b.close()
                c.close()
        finally:
            ham.stop()
            echo.close()
            lis.close()
        assert ham.seen["refused"] == 0 and ham.seen["ok"] > 20 and not ham.seen["other"], ham.seen
        conv.close()
        # the BPF objects of the programs before closed at their exec: one set
        # (the socket map and the counter of steered connections)
        bpf = [f for f in open_fds(s.proc.pid) if f.startswith("anon_inode:bpf")]
        assert sorted(bpf) == ["anon_inode:bpf-map", "anon_inode:bpf-map", "anon_inode:bpf-prog",
                               "anon_inode:bpf_link"], bpf


def _forwarded_across_upgrades(s):
    out = OUT
    # more than the client's leg can buffer (its receive and the agent's
    # send buffer, ≤ 6 + 4 MiB by default): the relay's pipe is full at the exec
    total = 32 << 20
    words = array.array("Q", range(total // 8))
    if sys.byteorder == "little":
        words.byteswap()
    blob = words.tobytes()
    echo = echo_backend(s)
    with in_ns(s.ns):
        down_lis, hc_lis = listener(), listener()
    ports = [echo.getsockname()[1], down_lis.getsockname()[1], hc_lis.getsockname()[1]]

    def send_blob():
        c, _ = down_lis.accept()
        with c:
            c.sendall(blob)
    threading.Thread(target=send_blob, daemon=True).start()
    try:
        for p in ports:
            assert wait_forwarded(s, p), p
        conv = out_conn(s, ports[0])
        conv.settimeout(20)

        def say(i):
            msg = f"message {i} ".encode() * (1 + i * 37)
            conv.sendall(msg)
            got = b""
            while len(got) < len(msg):
                d = conv.recv(65536)
                assert d, f"the conversation was cut before message {i}"
                got += d
            assert got == msg, i
        for i in range(5):
            say(i)
        dl = out_conn(s, ports[1])
        dl.settimeout(20)
        got = b""
        while len(got) < 65536:
            d = dl.recv(65536)
            assert d, "the download ended early"
            got += d
        time.sleep(0.5)  # the backend fills the socket buffers and the relay's pipe, then waits
        hc = out_conn(s, ports[2])
        hc.settimeout(20)
        hc_lis.settimeout(20)
        b, _ = hc_lis.accept()
        b.settimeout(20)
        hc.sendall(b"request")
        hc.shutdown(socket.SHUT_WR)
        assert read_to_eof(b) == b"request"

        ham = Hammer(s, ports[0])
        ham.start()
        try:
            for k in range(3):
                with in_ns(s.ns):
                    upgrade(s)
                say(10 + k)  # the conversation goes on after each
        finally:
            ham.stop()
        seen = ham.seen
        log = open(s.log_path, errors="replace").read()
        carried = [x for x in log.splitlines() if "relayed connections carried" in x]
        assert len(carried) == 3, log[-3000:]
        assert "3 forwarded ports" in carried[0] and "(0 bytes in their pipes)" not in carried[0], carried
        # clients all through the upgrades: answered, never refused (they
        # wait in the forwarder's backlog while no program accepts)
        assert seen["refused"] == 0 and seen["ok"] > 20 and not seen["other"], seen
        # the stalled download: every byte, in order, once
        got += read_to_eof(dl, 1 << 20)
        assert len(got) == total and got == blob, (len(got), total)
        # the half-closed connection: its answer, then EOF
        b.sendall(b"answer after the upgrades")
        b.close()
        assert read_to_eof(hc) == b"answer after the upgrades"
        for c in (conv, dl, hc):
            c.close()
        # the forwarders keep working for new connections
        c = out_conn(s, ports[0])
        c.sendall(b"after")
        assert c.recv(100) == b"after"
        c.close()
    finally:
        for lis in (echo, down_lis, hc_lis):
            lis.close()


def test_ports_not_taken_are_closed_when_no_rollback_comes(tmp_path):
    """The ports part fails in the new program and again in the previous
    one (CONCH_FAULT=handover_ports): with no rollback left, the agent
    serves with what it restored, and the forwarders and relayed
    connections it did not take are closed — not left bound by nobody: the
    conversation ends, and the next scan binds the forwarder again.  Every
    part restores on its own: the init part after it keeps its listener
    (the same socket, never closed) and answers; Upgrade works again."""
    sock = "unix:" + str(tmp_path / "init.sock")
    with forwarding_agent("upgrade_fwd_abandon", env={"CONCH_FAULT": "handover_ports", "CONCH_FORWARD_STEER": "0"},
                          extra_args=["--init-listen", sock]) as s:
        echo = echo_backend(s)
        port = echo.getsockname()[1]
        try:
            assert wait_forwarded(s, port)
            conv = out_conn(s, port)
            conv.settimeout(20)
            conv.sendall(b"hello")
            assert conv.recv(5) == b"hello"
            pid = s.proc.pid
            with in_ns(s.ns):
                upgrade(s, expect_upgrades=0)
            log = open(s.log_path).read()
            assert log.count("cannot restore the state: ports: CONCH_FAULT=handover_ports") == 2, log[-3000:]
            assert "no rollback possible (this is the rollback)" in log, log[-3000:]
            assert "2 forwarders and relayed connections not taken: closed" in log, log[-3000:]  # one of each
            assert "part ports abandoned" in log, log[-3000:]
            assert "init listener fd=" not in log, log[-3000:]  # carried, not closed
            msg = {"version": 1, "sandboxID": "abandon-sb", "agentToken": s.token,
                   "network": {"guestIP": "10.0.2.15", "prefixLength": 24, "gateway": "10.0.2.2"}}
            assert initpeer.exchange(sock, msg) == '{"version":1,"status":"ready","retryable":false}'
            assert s.proc.pid == pid
            try:  # the relayed connection was closed with its descriptors
                conv.sendall(b"more")
                assert conv.recv(10) == b""
            except (ConnectionResetError, BrokenPipeError):
                pass
            conv.close()
            assert wait_forwarded(s, port, timeout=10)  # bound again by the next scan

            def echoes():
                try:
                    with out_conn(s, port) as c:
                        c.settimeout(5)
                        c.sendall(b"again")
                        return c.recv(5) == b"again"
                except OSError:
                    return False
            assert wait_for(echoes, timeout=10)
            with in_ns(s.ns):  # not "an upgrade is under way": the handover is over
                upgrade(s, expect_upgrades=0)
        finally:
            echo.close()


# ---------------------------------------------------------------- descriptors 0–2
def stdio_kinds(pid):
    """(major, minor) of what fds 0–2 of pid are, None where not a device."""
    out = []
    for n in range(3):
        st = os.stat(f"/proc/{pid}/fd/{n}")
        out.append((os.major(st.st_rdev), os.minor(st.st_rdev)) if st.st_rdev else os.readlink(f"/proc/{pid}/fd/{n}"))
    return out


def test_started_without_stdio_its_0_to_2_are_dev_null():
    """`serve 0<&- 1>&- 2>&-`: the loop, pipes and listeners never land on
    0–2 (nor log lines in a pipe of its own): /dev/null holds them, before
    and after an upgrade, and commands still run."""
    s = Server(name="no-stdio", wrap=("sh", "-c", 'exec "$@" 0<&- 1>&- 2>&-', "sh"))
    try:
        pid = s.proc.pid
        assert stdio_kinds(pid) == [(1, 3)] * 3, stdio_kinds(pid)
        c = Client(s.url, s.token)
        bg(s, "echo hi > /dev/null; sleep 120", "keeper")
        st, body, _ = c.unary(UPGRADE, {"path": BIN})
        assert st == 200, body
        assert wait_for(lambda: metrics(s)["upgrades"] == 1), "the upgrade did not finish"
        assert s.proc.pid == pid and s.alive()
        assert stdio_kinds(pid) == [(1, 3)] * 3, stdio_kinds(pid)
        st, lst, _ = c.unary(LIST, {})
        assert [p["tag"] for p in lst["processes"]] == ["keeper"], lst
    finally:
        s.stop()


# ---------------------------------------------------------------- failed restores
def mem_fds(pid, name):
    return [f for f in os.listdir(f"/proc/{pid}/fd") if name in (os.readlink(f"/proc/{pid}/fd/{f}") or "")]


def test_no_upgrade_without_a_rollback():
    """/proc/self/exe cannot be opened (CONCH_FAULT=handover_no_exe): with
    no way back the upgrade is abandoned; the agent goes on as it was, and
    Upgrade can be called again."""
    s = Server(name="no-rollback", env={"CONCH_FAULT": "handover_no_exe"})
    try:
        bg(s, "sleep 120", "keeper")
        for n in (1, 2):
            st, body, _ = Client(s.url, s.token).unary(UPGRADE, {"path": BIN})
            assert st == 200, body  # (the answer goes before the handover)
            assert wait_for(lambda: _log_count(s, "upgrade abandoned: cannot keep this program for a rollback") == n)
        assert s.alive() and metrics(s)["upgrades"] == 0
        assert os.readlink(f"/proc/{s.proc.pid}/exe") == os.path.realpath(BIN)
        st, lst, _ = Client(s.url, s.token).unary(LIST, {})
        assert [p["tag"] for p in lst["processes"]] == ["keeper"]
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


def test_a_state_that_cannot_be_read_starts_fresh_with_the_real_token():
    """The new program cannot read the state and no rollback can help
    (CONCH_FAULT=handover_unreadable): it starts fresh — the inherited
    listener closed and bound again (no "address in use"), every copy of
    the state and of the token closed, the token the real one (never the
    "xxxx…" of the overwritten --token), and Upgrade usable again."""
    s = Server(name="unreadable", env={"CONCH_FAULT": "handover_unreadable"})
    try:
        pid = s.proc.pid
        for n in (1, 2):
            st, body, _ = Client(s.url, s.token).unary(UPGRADE, {"path": BIN})
            assert st == 200, body
            assert wait_for(lambda: _log_count(s, "upgrade: no state: a fresh start") == n), \
                open(s.log_path).read()[-3000:]
            assert wait_for(lambda: metrics(s)), open(s.log_path).read()[-3000:]  # serving, with the real token
            assert s.proc.pid == pid and s.alive()
            st, body, _ = Client(s.url, "x" * len(s.token)).unary(LIST, {})
            assert st == 401, body
            assert wait_for(lambda: not mem_fds(pid, "conch-handover") and not mem_fds(pid, "conch-token")), \
                os.listdir(f"/proc/{pid}/fd")
        assert "address in use" not in open(s.log_path).read()
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


def test_a_record_that_cannot_be_restored_is_dropped_whole():
    """One process record cannot be restored, in the new program and in the
    rollback (CONCH_FAULT=handover_proc_record, the record tagged
    "broken"): it is dropped whole — its pipes closed (its writer sees
    EPIPE), logged — the others are kept, and the next upgrade's save finds
    no half-built record."""
    s = Server(name="broken-record", env={"CONCH_FAULT": "handover_proc_record", "CONCH_PROC_RETAIN_MS": "60000"})
    try:
        bg(s, "sleep 120", "keeper")
        broken = bg(s, "trap '' PIPE; while echo x; do sleep 0.1; done; exit 7", "broken")
        bg(s, "sleep 120", "after")
        upgrade(s, expect_upgrades=0)  # rolled back, the record failing there too
        log = open(s.log_path).read()
        assert "part processes abandoned" in log and f"process record pid={broken} tag=broken dropped" in log, log[-3000:]
        c = Client(s.url, s.token)
        st, lst, _ = c.unary(LIST, {})
        assert [p["tag"] for p in lst["processes"]] == ["keeper", "after"], lst

        def gone():
            try:
                return open(f"/proc/{broken}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
            except OSError:
                return True
        assert wait_for(gone, 10), "the broken record's pipe is still open"
        upgrade(s)  # saving again: no half-built record to trip on; nothing fails now
        assert s.alive()
        st, lst, _ = c.unary(LIST, {})
        assert [p["tag"] for p in lst["processes"]] == ["keeper", "after"], lst
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None, sanitizer_report(text)


# ---------------------------------------------------------------- no request cut
def test_no_request_is_cut_by_an_upgrade(server, tmp_path):
    """Through 5 upgrades: /health on one keep-alive connection and on a
    new connection each time, never reset or refused; an upload in flight
    at each upgrade completes; a Connect stream ends `unavailable` "agent
    is upgrading; resume" (the client resumes with replay)."""
    s = server
    bg(s, "while :; do echo tick; sleep 0.05; done", "ticker")
    stop = threading.Event()
    errors, counts = [], {"keep": 0, "new": 0, "uploads": 0}

    def keepalive():
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        while not stop.is_set():
            try:
                conn.request("GET", "/health")
                r = conn.getresponse()
                r.read()
                assert r.status == 200, r.status
                counts["keep"] += 1
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()  # (the next request opens a new one)
            except Exception as e:  # noqa: BLE001
                errors.append(f"keep-alive /health: {e!r}")
                conn.close()
            time.sleep(0.005)

    def fresh():
        while not stop.is_set():
            try:
                with urllib.request.urlopen(s.url + "/health", timeout=30) as r:
                    assert r.status == 200
                counts["new"] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(f"new-connection /health: {e!r}")
            time.sleep(0.01)

    def uploads():
        c = Client(s.url, s.token)
        i = 0
        while not stop.is_set():
            i += 1
            chunk = b64(os.urandom(256 << 10))
            msgs = [{"filepath": str(tmp_path / f"up{i % 4}"), "content": chunk}] + [{"content": chunk}] * 3

            def slow():  # ~0.3 s per upload: one is in flight at each upgrade
                for m in msgs:
                    yield envelope(json.dumps(m).encode())
                    time.sleep(0.08)
            try:
                conn = c.conn(timeout=30)
                conn.request("POST", "/pb.FileService/PostFileStream", body=slow(),
                             headers=c.headers(ctype="application/connect+json"), encode_chunked=True)
                r = conn.getresponse()
                body = r.read()
                conn.close()
                assert r.status == 200 and body.endswith(b"{}"), (r.status, body[-200:])
                counts["uploads"] += 1
            except Exception as e:  # noqa: BLE001
                errors.append(f"upload {i}: {e!r}")

    threads = [threading.Thread(target=f) for f in (keepalive, fresh, uploads)]
    for t in threads:
        t.start()
    try:
        for n in range(5):
            time.sleep(0.4)
            st = Stream(s, CONNECT, {"process": {"tag": "ticker"}})
            assert st.next()[0] == "start"
            upgrade(s)
            while st.next() is not None:  # (EOFError: cut without its end)
                pass
            assert st.end == {"error": {"code": "unavailable", "message": "agent is upgrading; resume"}}, st.end
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert errors == [], errors[:10]
    assert counts["keep"] > 20 and counts["new"] > 20 and counts["uploads"] >= 5, counts
    print(f"5 upgrades: {counts}", file=sys.stderr)
