"""Hostile clients against ProcessService and auth:
  * a 100 000-entry env does not hold the loop (a linear search per key
    held it ~40 s);
  * a fork bomb under Connect-Timeout-Ms does not outlive its deadline
    (its descendants would hold every pid slot);
  * SendSignal reaches a setsid escapee (one that left the process group);
  * a second conch-init-token header is refused, not ignored.
"""
import json
import os
import re
import secrets
import socket
import struct
import subprocess
import threading
import time

import pytest

from conch import Client, envelope, parse_envelopes
from conftest import Server, sanitizer_report
from h2conn import H2Client

SP = "/pb.ProcessService/StartProcess"


@pytest.fixture(scope="module")
def server():
    s = Server(name="test_hostile_proc")
    yield s
    rep = sanitizer_report(s.stop())
    assert rep is None, f"sanitizer report in server log:\n{rep}"


@pytest.fixture()
def cl(server):
    return Client(server.url, server.token)


def health_seconds(server, timeout=30):
    """Time of one GET /health on a new connection."""
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return time.monotonic() - t


def health_curl_seconds(server, timeout=5):
    """One GET /health by curl on a new connection, timed by curl itself
    (time_total): the server's answer time, whatever this process's
    threads are doing (the GIL held by a big json.loads, say)."""
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-m", str(timeout), "-w", "%{http_code} %{time_total}",
                        f"http://127.0.0.1:{server.port}/health"], capture_output=True, text=True)
    code, took = r.stdout.split()
    assert code == "200", (r.stdout, r.stderr)
    return float(took)


def start_stream(server, req, headers=None, timeout=120):
    """StartProcess over HTTP/1.1 (Connect JSON): ([events], end)."""
    cl = Client(server.url, server.token)
    c = cl.conn(timeout=timeout)
    st, msgs, end = cl.stream(SP, [req], headers=headers, conn=c)
    c.close()
    assert st == 200, (st, msgs)
    return msgs, end


def stdout_of(msgs):
    import base64
    return b"".join(base64.b64decode(m["data"]["stdout"]) for m in msgs if "stdout" in m.get("data", {}))


# ---------------------------------------------------------------- big env

def big_request_errors_as_small_ones(server):
    """A request decoded in the pool (>= 64 KiB) fails with the same texts."""
    cl = Client(server.url, server.token)
    pad = {f"K{i:05d}": "v" for i in range(8000)}
    bad = json.dumps({"cmd": "true", "env": pad})[:-2] + ', "x": 1}}'
    small = '{"cmd": "true", "env": {"x": 1}}'
    ends = []
    for body in (bad, small):
        st, msgs, end = cl.stream(SP, [body.encode()])
        assert st == 200 and msgs == []
        ends.append(end)
    assert ends[0] == ends[1] and ends[0]["error"]["code"] == "invalid_argument", ends
    # two messages, the first a big one
    good = json.dumps({"cmd": "true", "env": pad}).encode()
    st, msgs, end = cl.stream(SP, [good, b'{"cmd": "true"}'])
    assert end == {"error": {"code": "invalid_argument",
                             "message": "protocol error: expected only one message, but got multiple"}}, end
    # a client that goes away while its big request decodes leaves the server well
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", server.port))
        head = (f"POST {SP} HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
                f"conch-init-token: {server.token}\r\nContent-Length: {len(good) + 5}\r\n\r\n").encode()
        s.sendall(head + envelope(good))
        s.close()
    assert health_seconds(server) < 5
    msgs, end = start_stream(server, {"cmd": "sh", "args": ["-c", "echo $K07999"], "env": pad})
    assert end == {} and stdout_of(msgs) == b"v\n"



@pytest.fixture()
def lone_server():
    """A server of the test's own: a hung loop must not take others down."""
    s = Server(name="hostile_lone")
    yield s
    rep = sanitizer_report(s.stop())
    assert rep is None, f"sanitizer report in server log:\n{rep}"


def test_100k_env_does_not_hold_the_loop(lone_server):
    server = lone_server
    # short values: the whole env must stay under execve's 2 MiB limit
    env = {f"K{i:06d}": "v" for i in range(100000)}
    env.update(K000000="first", K054321="middle", K099999="last")
    req = {"cmd": "sh", "args": ["-c", "echo $K000000 $K054321 $K099999 $HOME"], "env": env}
    assert len(json.dumps(req)) > 1_300_000
    out = {}

    def run():
        try:
            out["r"] = start_stream(server, req)
        except Exception as e:  # reported below
            out["e"] = e

    th = threading.Thread(target=run)
    th.start()
    worst = 0.0
    probes = 0
    t0 = time.monotonic()
    while th.is_alive() or probes < 5:
        try:
            took = health_seconds(server, timeout=5)
        except socket.timeout:
            took = 5.0
        worst = max(worst, took)
        probes += 1
        assert took < 1.0, f"/health took {took:.2f} s while the 100k-env start ran"
        assert time.monotonic() - t0 < 60, "the 100k-env start did not finish within 60 s"
        time.sleep(0.02)
    th.join()
    assert "e" not in out, out.get("e")
    msgs, end = out["r"]
    assert end == {}, end
    # the §6 fields exactly; the envelope's usage (api.md §9) is there too
    assert "usage" in msgs[-1].get("end", {}), msgs[-1]
    assert {k: v for k, v in msgs[-1]["end"].items() if k != "usage"} == {"exited": True, "status": "exited"}
    assert stdout_of(msgs) == b"first middle last /root\n"
    # the pool decode's other paths: errors, a second message, vanishing clients
    big_request_errors_as_small_ones(server)


def test_big_list_is_encoded_off_the_loop(lone_server):
    """List of 8 running processes with 40 000-entry envs (~11 MB of
    JSON; ~100 ms of encoding each on the dev build, several times that
    under ASan): encoded in the pool, 10 at once, /health answered within
    1 s throughout; the processes killed while their answers encode leave
    the answers whole (the records are pinned; ASan checks the reads)."""
    server = lone_server
    cl = Client(server.url, server.token)
    env = {f"K{i:06d}": "v" * 8 for i in range(40000)}
    tags = [f"big{i}" for i in range(8)]
    conns = []  # a background start's stream lasts the process's life: kept open, read to `start`
    for t in tags:
        c = cl.conn(timeout=60)
        body = json.dumps({"cmd": "sleep", "args": ["60"], "env": env, "background": True, "tag": t}).encode()
        c.request("POST", SP, body=envelope(body), headers=cl.headers(ctype="application/connect+json"))
        r = c.getresponse()
        assert r.status == 200
        head = r.read(5)
        assert b'"start"' in r.read(int.from_bytes(head[1:], "big"))
        conns.append(c)
    deadline = time.monotonic() + 60
    while True:  # every one running
        st, body, _ = cl.unary("/pb.ProcessService/List", {})
        assert st == 200
        if len(body.get("processes", [])) == len(tags):
            break
        assert time.monotonic() < deadline, "processes did not start"
        time.sleep(0.2)
    def lists(kill):
        raw = []

        def lst():  # raw bytes: parsed after the probes (json.loads of 11 MB holds the GIL)
            c = cl.conn(timeout=60)
            c.request("POST", "/pb.ProcessService/List", body=b"{}", headers=cl.headers())
            r = c.getresponse()
            raw.append((r.status, r.read()))
            c.close()

        worst = 0.0
        ths = [threading.Thread(target=lst) for _ in range(10)]
        for th in ths:
            th.start()
        if kill:
            time.sleep(0.1)
            for t in tags:  # they end while the answers encode (ASan would see a freed string)
                st, body, _ = cl.unary("/pb.ProcessService/SendSignal", {"process": {"tag": t}, "signal": 9})
                assert st == 200, body
        while any(th.is_alive() for th in ths):
            took = health_curl_seconds(server)
            worst = max(worst, took)
            assert took < 1.0, f"/health took {took:.2f} s while big Lists encoded"
            time.sleep(0.02)
        for th in ths:
            th.join()
        out = [(st, json.loads(b) if b else None) for st, b in raw]
        assert len(out) == 10
        for st, body in out:
            assert st == 200, str(body)[:300]
            for p in body.get("processes", []):  # each whole, whatever ended since
                assert len(p["config"]["env"]) == len(env), p["tag"]
        return out, worst

    out, worst = lists(False)
    print(f"slowest /health {worst * 1000:.0f} ms")
    assert all(len(b["processes"]) == len(tags) for _, b in out)
    lists(True)
    for c in conns:
        c.close()


# ---------------------------------------------------------------- duplicate token

def h1_raw(server, headers, body=b"{}"):
    """One raw HTTP/1.1 request (List, JSON); (status, parsed body)."""
    head = b"POST /pb.ProcessService/List HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
    head += b"Content-Type: application/json\r\nConnect-Protocol-Version: 1\r\n"
    for k, v in headers:
        head += k.encode() + b": " + v.encode() + b"\r\n"
    head += b"Content-Length: %d\r\n\r\n" % len(body)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(head + body)
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def dup_cases(tok):
    return [
        [("conch-init-token", tok), ("conch-init-token", tok)],
        [("conch-init-token", tok), ("conch-init-token", "wrong")],
        [("conch-init-token", "wrong"), ("conch-init-token", tok)],
        [("conch-init-token", tok), ("Conch-Init-Token", "")],
    ]


def test_duplicate_token_header_http1(server):
    assert h1_raw(server, [("conch-init-token", server.token)]) == (200, {})
    for hs in dup_cases(server.token):
        st, body = h1_raw(server, hs)
        assert (st, body) == (401, {"code": "unauthenticated", "message": "agent token is invalid"}), hs


def test_duplicate_token_header_http2(server):
    c = H2Client("127.0.0.1", server.port)
    try:
        base = [(":method", "POST"), (":scheme", "http"), (":authority", "x"),
                (":path", "/pb.ProcessService/List"), ("content-type", "application/json"),
                ("connect-protocol-version", "1")]
        sid = c.request_raw(base + [("conch-init-token", server.token)], b"{}")
        c.wait(sid, timeout=10)
        assert c.streams[sid].headers[":status"] == "200"
        for hs in dup_cases(server.token):
            sid = c.request_raw(base + [(k.lower(), v) for k, v in hs], b"{}")
            c.wait(sid, timeout=10)
            s = c.streams[sid]
            assert s.headers[":status"] == "401", hs
            assert json.loads(bytes(s.body)) == {"code": "unauthenticated", "message": "agent token is invalid"}
    finally:
        c.close()


# ---------------------------------------------------------------- trees

def cgroup2_mount():
    """Where this test sees the cgroup v2 hierarchy (mounted if nowhere)."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.startswith("cgroup2 ") and pre.split()[3] == "/":
                return pre.split()[4]
    mp = "/run/conch-test-cgroup2"
    os.makedirs(mp, exist_ok=True)
    assert os.system(f"mount -t cgroup2 none {mp}") == 0, "cannot mount cgroup2"
    return mp


def command_cgroup(out):
    """The 0::PATH line a command printed with `cat /proc/self/cgroup`."""
    m = re.search(rb"^0::(\S+)$", out, re.M)
    assert m, out
    return m.group(1).decode()


def procs_of(path):
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def pids_with_arg(arg):
    """Pids whose command line has the argument arg (our unique sleeps)."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if arg.encode() in f.read().split(b"\0"):
                    out.append(int(d))
        except OSError:
            pass
    return out


def kill_pids(pids):
    for p in pids:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass


def wait_until(pred, timeout, step=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(step)
    return pred()


def test_fork_bomb_is_bounded_by_its_timeout():
    """A fork bomb whose leader exits at 0.5 s, with Connect-Timeout-Ms 3000,
    in a v1 pids cgroup of 500: at the deadline everything the command left
    is killed (DECISION: a timeout bounds the whole tree)."""
    v1 = f"/sys/fs/cgroup/pids/conch-hostile-{os.getpid()}-{secrets.token_hex(3)}"
    os.mkdir(v1)
    srv = None
    try:
        with open(f"{v1}/pids.max", "w") as f:
            f.write("500")
        srv = Server(name="hostile_bomb")
        with open(f"{v1}/cgroup.procs", "w") as f:
            f.write(str(srv.proc.pid))
        tag = f"302.{secrets.randbelow(10**6):06d}"
        script = (f"cat /proc/self/cgroup; f() {{ sleep {tag} & f & f & wait; }}; "
                  "f >/dev/null 2>&1 & sleep 0.5")
        t0 = time.monotonic()
        msgs, end = start_stream(srv, {"cmd": "sh", "args": ["-c", script]},
                                 headers={"Connect-Timeout-Ms": "3000"})
        took = time.monotonic() - t0
        assert end == {} and "end" in msgs[-1], (msgs[-1:], end)
        # the §6 fields exactly; the envelope adds usage and, the bomb left
        # behind, leftRunning (api.md §9)
        e = msgs[-1]["end"]
        assert "usage" in e, e
        assert "leftRunning" not in e or e["leftRunning"] > 0, e
        assert {k: v for k, v in e.items() if k not in ("usage", "leftRunning")} == {
            "exited": True, "status": "exited"}, e
        assert took < 2.5, f"the stream should end with the leader, took {took:.1f} s"
        cg = command_cgroup(stdout_of(msgs))
        # before the deadline the bomb lives on: it filled the pids cgroup
        time.sleep(max(0.0, t0 + 2.5 - time.monotonic()))
        with open(f"{v1}/pids.current") as f:
            before = int(f.read())
        assert before > 200, f"the bomb did not grow ({before} tasks)"
        # at the deadline (3 s after the request; its timer started later)
        # every descendant is killed: only the server is left in the pids cgroup
        time.sleep(max(0.0, t0 + 3.0 - time.monotonic()))
        assert wait_until(lambda: procs_of(v1) == [srv.proc.pid], t0 + 4.0 - time.monotonic()), \
            f"{len(procs_of(v1)) - 1} descendants still alive 1 s after the deadline"
        assert cg != "/", "the command is not in a cgroup of its own"
        cgdir = cgroup2_mount() + cg
        assert not procs_of(cgdir), f"processes left in {cg}"
        assert wait_until(lambda: not os.path.exists(cgdir), 5), f"{cgdir} was not removed"
        assert health_seconds(srv) < 5
    finally:
        # the old binary leaves the bomb running: kill it by pid, round after round
        for _ in range(200):
            left = [p for p in procs_of(v1) if srv is None or p != srv.proc.pid]
            if not left:
                break
            kill_pids(left)
            time.sleep(0.05)
        if srv is not None:
            text = srv.stop()
            assert sanitizer_report(text) is None, sanitizer_report(text)
        wait_until(lambda: not procs_of(v1), 10)
        os.rmdir(v1)


def test_signal_reaches_setsid_escapee(server, cl):
    tag = f"301.{secrets.randbelow(10**6):06d}"
    esc, lead = tag + "1", tag + "2"
    job = "escapee-" + tag
    c = cl.conn(timeout=30)
    c.request("POST", SP, body=envelope(json.dumps({
        "cmd": "sh", "args": ["-c", f"setsid sleep {esc} & sleep {lead}"],
        "background": True, "tag": job}).encode()),
        headers=cl.headers(ctype="application/connect+json"))
    r = c.getresponse()
    assert r.status == 200
    try:
        assert wait_until(lambda: pids_with_arg(esc) and pids_with_arg(lead), 10), "sleeps not started"
        st, body, _ = cl.unary("/pb.ProcessService/SendSignal", {"process": {"tag": job}, "signal": 9})
        assert (st, body) == (200, {}), body
        assert wait_until(lambda: not pids_with_arg(lead), 5), "the leader's sleep survived"
        assert wait_until(lambda: not pids_with_arg(esc), 5), \
            "SendSignal 9 missed the setsid escapee (it left the process group)"
    finally:
        c.close()
        kill_pids(pids_with_arg(esc) + pids_with_arg(lead))


def test_retained_records_are_bounded():
    """Ended background records are kept for Connect/List (60 s), but at most
    256 of them (the oldest goes first): each keeps its config, env included,
    so 300 short commands with a 64 KiB env each must not all stay."""
    s = Server(name="test_hostile_proc_retain")
    try:
        cl = Client(s.url, s.token)
        env = {"BIG": "x" * 65536}
        c = cl.conn(timeout=60)
        for i in range(300):
            st, msgs, end = cl.stream(SP, [{"cmd": "true", "background": True, "tag": f"r{i}", "env": env}], conn=c)
            assert st == 200, (st, msgs)
        c.close()

        def found(tag, conn):
            st, msgs, end = cl.stream("/pb.ProcessService/Connect", [{"process": {"tag": tag}}], conn=conn)
            assert st == 200, (st, msgs)
            if end == {}:
                return True
            assert end["error"]["code"] == "not_found", end
            return False
        deadline = time.time() + 30
        while cl.unary("/pb.ProcessService/List", {})[1].get("processes") and time.time() < deadline:
            time.sleep(0.2)  # List shows the running ones: wait until all ended
        c = cl.conn(timeout=60)
        kept = [i for i in range(300) if found(f"r{i}", c)]
        c.close()
        assert kept == list(range(44, 300)), (len(kept), kept[:3])  # 256 kept, the oldest went first
    finally:
        rep = sanitizer_report(s.stop())
        assert rep is None, rep
