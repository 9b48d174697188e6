"""NetworkService (api.md §9 "Ports"): ListPorts and WatchPorts
against the real binary — every ListeningPort field for IPv4 and IPv6, a
managed owner (a command started with StartProcess) and an unmanaged one
(a listener this test holds), opened/closed events (also for a listener
that comes and goes between two scans), the agent's own ports never
listed, a stream that does not read ended, no scans while nobody watches.

The machine is shared: other programs listen too, so every check looks at
this test's own ports only."""
import errno
import json
import os
import resource
import signal
import socket
import statistics
import sys
import time

import pytest

from conch import Client, RawStream, b64, free_port, unb64
from conftest import serve
from test_process import SIGNAL, SP, start_bg, wait_for

LIST = "/pb.NetworkService/ListPorts"
WATCH = "/pb.NetworkService/WatchPorts"
KEEPALIVE_MS = 1500


@pytest.fixture(scope="module")
def server():
    # its own server: scans are counted in its debug log, keepalives shortened
    yield from serve("test_ports", env={"CONCH_LOG_LEVEL": "debug",
                                        "CONCH_NET_WATCH_KEEPALIVE_MS": str(KEEPALIVE_MS)})


@pytest.fixture(scope="module")
def client(server):
    return Client(server.url, server.token)


def list_ports(client):
    st, body, _ = client.unary(LIST, {})
    assert st == 200, body
    return body.get("ports", [])


def mine(ports, nums):
    return [p for p in ports if p["port"] in nums]


def listener(family=socket.AF_INET, addr="127.0.0.1", port=0):
    """A listener; on port 0, at a port the forwarder can take too inside a
    forwarding namespace: an ephemeral port may be the local port of a
    client connection (or its TIME_WAIT) on the outward address, which the
    forwarder's bind would wait for."""
    for _ in range(100):
        s = socket.socket(family)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind((addr, port))
        s.listen(16)
        if port or outward_free(s.getsockname()[1]):
            return s
        s.close()
    raise AssertionError("no port free on loopback and on the outward address")


def outward_free(port):
    """1 when the forwarder could bind OUT:port here (or OUT is not here)."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((OUT, port))
        except OSError as e:
            return e.errno == errno.EADDRNOTAVAIL
    return True


def free_fwd_port():
    """free_port(), also free on the outward address (see listener)."""
    with listener() as s:
        return s.getsockname()[1]


class Watch(RawStream):
    """A WatchPorts stream over HTTP/1.1 on a raw socket (conch.RawStream)."""

    def __init__(self, server, rcvbuf=None):
        super().__init__(server.port, server.token, WATCH, {}, rcvbuf)
        self.pending = []

    def events(self, seconds, keepalives=False):
        """(arrival time, message) for `seconds`."""
        out = [(time.monotonic(), m) for m in self.pending]
        self.pending = []
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and self.end is None and not self.eof:
            out += [(time.monotonic(), m) for m in self.poll(0.02)]
        return [(t, m) for t, m in out if keepalives or "keepalive" not in m]

    def wait(self, pred, seconds=5):
        """Read until pred(message); (time, message), the rest kept."""
        deadline = time.monotonic() + seconds
        while True:
            for i, m in enumerate(self.pending):
                if pred(m):
                    self.pending = self.pending[i + 1:]  # what came behind it is kept
                    return time.monotonic(), m
            self.pending = []
            if self.end is not None or self.eof or time.monotonic() >= deadline:
                break
            self.pending = self.poll(0.01)
        raise AssertionError(f"no such event within {seconds}s (end={self.end})")



def open_watch(server):
    w = Watch(server)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        ms = w.poll(0.05)
        if ms:
            assert ms[0] == {"start": {}}, ms
            w.pending = ms[1:]
            return w
    raise AssertionError("no start event")


def scans(server):
    with open(server.log_path, errors="replace") as f:
        return f.read().count("port scan listeners=")


def test_unmanaged_ipv4_ipv6_every_field(client):
    held = [listener(socket.AF_INET, "127.0.0.1"), listener(socket.AF_INET, "0.0.0.0"),
            listener(socket.AF_INET6, "::1"), listener(socket.AF_INET6, "::")]
    try:
        nums = {s.getsockname()[1] for s in held}
        got = mine(list_ports(client), nums)
        want = sorted([{"address": s.getsockname()[0], "port": s.getsockname()[1], "pid": os.getpid()}
                       for s in held], key=lambda p: (p["port"], p["address"]))
        assert got == want  # tag, commandPid and forwardedTo are empty (JSON leaves them out)
    finally:
        for s in held:
            s.close()
    assert mine(list_ports(client), nums) == []


def test_lowest_pid_of_holders(client):
    s = listener()
    port = s.getsockname()[1]
    pid = os.fork()
    if pid == 0:  # the child holds the same socket: the parent's pid is lower
        time.sleep(30)
        os._exit(0)
    try:
        got = mine(list_ports(client), {port})
        assert [p["pid"] for p in got] == [min(os.getpid(), pid)]
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        s.close()


def test_sorted_by_port_then_address(client):
    ports = list_ports(client)
    assert ports == sorted(ports, key=lambda p: (p["port"], p["address"]))


def test_agent_own_ports_never_listed(client, server):
    assert all(p["port"] != server.port for p in list_ports(client))
    # its pid never appears either (no socket of its own is listed)
    assert all(p.get("pid") != server.proc.pid for p in list_ports(client))


@pytest.mark.parametrize("addr", ["127.0.0.1", "::1"])
def test_managed_owner(client, addr):
    port = free_port()
    tag = f"http-{port}"
    pid = start_bg(client, {"cmd": "python3", "args": ["-m", "http.server", "--bind", addr, str(port)],
                            "tag": tag})
    try:
        got = wait_for(lambda: mine(list_ports(client), {port}), timeout=20)
        assert got == [{"address": addr, "port": port, "pid": pid, "tag": tag, "commandPid": pid}]
    finally:
        client.unary(SIGNAL, {"process": {"tag": tag}, "signal": 9})
    wait_for(lambda: not mine(list_ports(client), {port}), timeout=10)


def test_managed_owner_child_process(client):
    """A listener held by a child of the command: pid is the child's,
    commandPid the command's start pid."""
    port = free_port()
    tag = f"sh-{port}"
    pid = start_bg(client, {"cmd": "sh", "args": ["-c", f"python3 -m http.server --bind 127.0.0.1 {port}; :"],
                            "tag": tag})
    try:
        got = wait_for(lambda: mine(list_ports(client), {port}), timeout=20)
        assert len(got) == 1 and got[0]["tag"] == tag and got[0]["commandPid"] == pid
        assert got[0]["pid"] != pid and got[0]["pid"] > 0
        with open(f"/proc/{got[0]['pid']}/stat") as f:
            assert int(f.read().rsplit(")", 1)[1].split()[1]) == pid  # its parent is the command
    finally:
        client.unary(SIGNAL, {"process": {"tag": tag}, "signal": 9})


def test_watch_start_current_then_opened_closed(client, server):
    a = listener()
    w = open_watch(server)
    try:
        # the current ports come as `opened` right after start
        t, m = w.wait(lambda m: m.get("opened", {}).get("port") == a.getsockname()[1], 2)
        assert m["opened"] == {"address": "127.0.0.1", "port": a.getsockname()[1], "pid": os.getpid()}
        lat = []
        for _ in range(8):
            t0 = time.monotonic()
            b = listener(socket.AF_INET6, "::1")
            p = b.getsockname()[1]
            t1, m = w.wait(lambda m: m.get("opened", {}).get("port") == p, 3)
            lat.append(t1 - t0)
            assert m["opened"] == {"address": "::1", "port": p, "pid": os.getpid()}
            b.close()
            t2 = time.monotonic()
            t3, m = w.wait(lambda m: m.get("closed", {}).get("port") == p, 3)
            assert t3 - t2 < 1.2
            assert m["closed"] == {"address": "::1", "port": p, "pid": os.getpid()}
        assert max(lat) < 1.2, lat
        print(f"listen → opened: p50 {statistics.median(lat) * 1000:.0f} ms, max {max(lat) * 1000:.0f} ms",
              file=sys.stderr)
    finally:
        a.close()
        w.close()


def test_watch_listener_between_scans(client, server):
    """A listener that opens and closes again within one scan: never an
    `opened` without its `closed`."""
    w = open_watch(server)
    try:
        w.events(0.3)
        ports = []
        for _ in range(10):
            s = listener()
            ports.append(s.getsockname()[1])
            time.sleep(0.01)
            s.close()
            time.sleep(0.13)
        evs = [m for _, m in w.events(1.5)]
        for p in ports:
            kinds = [k for m in evs for k, v in m.items() if isinstance(v, dict) and v.get("port") == p]
            assert kinds in ([], ["opened", "closed"]), (p, kinds)
    finally:
        w.close()


def test_watch_keepalive(server):
    w = open_watch(server)
    try:
        evs = w.events(KEEPALIVE_MS / 1000 + 1.2, keepalives=True)
        assert any("keepalive" in m for _, m in evs), evs
    finally:
        w.close()


def test_no_scans_without_watchers(server, client):
    time.sleep(0.6)  # a scan of an earlier stream finishing
    n0 = scans(server)
    time.sleep(2)
    assert scans(server) == n0  # nobody watches, forwarding off: nothing runs
    w = open_watch(server)
    time.sleep(2)
    n1 = scans(server)
    assert n1 - n0 >= 3  # every NET_SCAN_MS while it is open
    w.close()
    time.sleep(0.7)
    n2 = scans(server)
    time.sleep(2)
    assert scans(server) == n2
    list_ports(client)
    assert scans(server) == n2 + 1  # ListPorts: one scan of its own


def test_watch_not_read_is_ended(server):
    """HTTP/2 with a 1 KiB stream window the client never gives back: the
    agent cannot send, its queue reaches 1024 events, the stream ends."""
    from h2conn import H2Client
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    c = H2Client("127.0.0.1", server.port, stream_window=1024, auto_ack=False)
    try:
        sid = c.connect_stream(WATCH, [b"{}"], server.token, ctype="application/connect+json")
        for _ in range(2):  # 700 opened + 700 closed a round: past 1024 queued
            held = [listener() for _ in range(700)]
            time.sleep(1.2)
            for s in held:
                s.close()
            time.sleep(1.2)
        c.auto_ack = True
        c.ack(sid)
        c.wait(sid, timeout=20)
        msgs = [json.loads(p) for _, p in c.envelopes(bytes(c.streams[sid].body))]
        assert msgs[-1] == {"error": {"code": "resource_exhausted", "message": "port events are not being read"}}
        assert msgs[0] == {"start": {}}
        assert len(msgs) <= 1024 + 64, len(msgs)  # what the window let out, then the queue
    finally:
        c.close()


# ---------------------------------------------------------------- forwarding
# The agent runs in a network namespace this test creates, with the outward
# address 10.239.0.1 on that namespace's own loopback device: nothing it
# forwards can reach (or come from) anywhere but this namespace.  The test
# enters the namespace (setns, this thread only) to open its sockets.

import contextlib  # noqa: E402
import ctypes  # noqa: E402
import subprocess  # noqa: E402
import threading  # noqa: E402

from conftest import Server, sanitizer_report, status_kib  # noqa: E402

OUT = "10.239.0.1"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def in_ns(name):
    old = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    new = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        assert _libc.setns(new, CLONE_NEWNET) == 0, ctypes.get_errno()
        yield
    finally:
        assert _libc.setns(old, CLONE_NEWNET) == 0
        os.close(old)
        os.close(new)


@contextlib.contextmanager
def forwarding_agent(name, env=None, extra_args=(), wrap=()):
    """`serve --forward-ports OUT` in a network namespace of its own (only
    its loopback, OUT added to it: nothing leaves it), as srv with srv.ns;
    afterwards stopped, its log free of sanitizer reports, the namespace
    deleted."""
    ns = f"conch-{os.getpid()}-{name}"[:40]
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "netns", "exec", ns, "sh", "-c", f"ip link set lo up && ip addr add {OUT}/32 dev lo"],
                       check=True)
        with in_ns(ns):
            # ASan's quarantine keeps freed buffers (256 MiB by default): the
            # RSS bound below is about what the agent holds, not about it
            # (LeakSanitizer cannot run under a tracer: not with wrap)
            leaks = 0 if wrap else 1
            env = dict(env or {}, ASAN_OPTIONS=f"detect_leaks={leaks}:abort_on_error=0:quarantine_size_mb=8")
            srv = Server(name=name, extra_args=["--forward-ports", OUT, *extra_args], env=env, wrap=wrap)
        srv.ns = ns
        try:
            yield srv
        finally:
            text = srv.stop()
            rep = sanitizer_report(text)
            assert rep is None, f"sanitizer report in server log:\n{rep}"
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.fixture(scope="module", params=["steer", "relay"])
def fwd(request):
    """The forwarding agent, twice: as it runs (connections steered to the
    listener by the kernel where it can) and with CONCH_FORWARD_STEER=0
    (every connection relayed); srv.mode says which."""
    env = {"CONCH_FORWARD_STEER": "0"} if request.param == "relay" else None
    with forwarding_agent(f"test_ports_fwd_{request.param}", env=env) as srv:
        srv.mode = request.param
        yield srv


def log_text(srv):
    with open(srv.log_path, errors="replace") as fh:
        return fh.read()


def accepted_ends(srv, lis, port):
    """Connect to <outward>:port; (server-side local address, server-side
    peer, client's own address) of the connection lis accepts."""
    s = out_conn(srv, port)
    lis.settimeout(10)
    b, peer = lis.accept()
    ends = (b.getsockname()[:2], peer[:2], s.getsockname()[:2])
    b.close()
    s.close()
    return ends


def ns_list(srv):
    with in_ns(srv.ns):
        return list_ports(Client(srv.url, srv.token))


def wait_forwarded(srv, port, timeout=5):
    def f():
        got = mine(ns_list(srv), {port})
        return got if got and got[0].get("forwardedTo") else None
    return wait_for(f, timeout=timeout)


def out_conn(srv, port):
    """A connection to the outward address from the outward address."""
    with in_ns(srv.ns):
        s = socket.socket()
        s.bind((OUT, 0))
        s.connect((OUT, port))
    return s


def read_to_eof(s, n=65536):
    """Everything s receives until its peer's EOF."""
    got = b""
    while True:
        d = s.recv(n)
        if not d:
            return got
        got += d


def echo_backend(srv, family=socket.AF_INET, addr="127.0.0.1"):
    with in_ns(srv.ns):
        lis = listener(family, addr)

    def serve_one(c):
        with c:
            while True:
                d = c.recv(65536)
                if not d:
                    c.shutdown(socket.SHUT_WR)
                    return
                c.sendall(d)

    def run():
        while True:
            try:
                c, _ = lis.accept()
            except OSError:
                return
            threading.Thread(target=serve_one, args=(c,), daemon=True).start()
    threading.Thread(target=run, daemon=True).start()
    return lis


def test_forward_curl_http11_managed(fwd):
    c = Client(fwd.url, fwd.token)
    with in_ns(fwd.ns):
        port = free_fwd_port()
        pid = start_bg(c, {"cmd": "python3", "args": ["-m", "http.server", "--protocol", "HTTP/1.1",
                                                  "--bind", "127.0.0.1", str(port)], "tag": "fwd-http"})
    try:
        [p] = wait_forwarded(fwd, port, timeout=20)
        assert p == {"address": "127.0.0.1", "port": port, "pid": pid, "tag": "fwd-http", "commandPid": pid,
                     "forwardedTo": f"{OUT}:{port}"}
        r = subprocess.run(["ip", "netns", "exec", fwd.ns, "curl", "-sS", "--http1.1", "--interface", OUT,
                            "-o", "/dev/null", "-o", "/dev/null", "-w", "%{http_code} %{http_version} %{num_connects};",
                            f"http://{OUT}:{port}/", f"http://{OUT}:{port}/"],
                           capture_output=True, text=True, timeout=30)
        assert r.stdout == "200 1.1 1;200 1.1 0;", r  # the second request on the same relayed connection
    finally:
        with in_ns(fwd.ns):
            c.unary(SIGNAL, {"process": {"tag": "fwd-http"}, "signal": 9})


def test_forward_ipv6_loopback_and_watch(fwd):
    with in_ns(fwd.ns):
        w = open_watch(fwd)
    lis = echo_backend(fwd, socket.AF_INET6, "::1")
    port = lis.getsockname()[1]
    try:
        _, m = w.wait(lambda m: m.get("opened", {}).get("port") == port, 3)
        assert m["opened"]["forwardedTo"] == f"{OUT}:{port}" and m["opened"]["address"] == "::1"
        s = out_conn(fwd, port)
        s.sendall(b"ping6")
        assert s.recv(100) == b"ping6"
        s.close()
        if fwd.mode == "steer":  # an IPv4 connection is never handed to an IPv6 socket: relayed
            assert (f"port {port}: connections to {OUT}:{port} relayed: the listener cannot be steered to: "
                    "Address family not supported by protocol") in log_text(fwd)
    finally:
        lis.close()
        w.close()


def test_forward_steered_or_relayed(fwd):
    """Steered, the server accepts the client's own connection: it sees the
    client's address and <outward>:P, and no second connection exists;
    relayed, it sees the agent's connection from loopback."""
    with in_ns(fwd.ns):
        lis = listener()
    port = lis.getsockname()[1]
    try:
        wait_forwarded(fwd, port)
        if fwd.mode == "steer":
            assert wait_for(lambda: f"port {port}: connections to {OUT}:{port} handed to the listener of pid {os.getpid()}"
                     in log_text(fwd), timeout=5)
        local, peer, client = accepted_ends(fwd, lis, port)
        if fwd.mode == "steer":
            assert local == (OUT, port) and peer == client, (local, peer, client)
        else:
            assert local == ("127.0.0.1", port) and peer[0] == "127.0.0.1" and peer != client
    finally:
        lis.close()


def test_forward_steering_follows_a_new_listener(fwd):
    """The listener closes and another takes its port: connections reach
    the new one (relayed until a scan sees it, then steered in steer mode)."""
    with in_ns(fwd.ns):
        a = listener()
    port = a.getsockname()[1]
    try:
        wait_forwarded(fwd, port)
        accepted_ends(fwd, a, port)
        a.close()
        with in_ns(fwd.ns):
            b = listener(port=port)
        local, peer, client = accepted_ends(fwd, b, port)  # at once: the forwarder still holds the port
        if fwd.mode == "steer":  # steered again once a scan saw the new listener
            mark = f"port {port}: connections to {OUT}:{port} handed to the listener"
            assert wait_for(lambda: log_text(fwd).count(mark) == 2, timeout=10), log_text(fwd)[-3000:]
        local, peer, client = accepted_ends(fwd, b, port)
        assert local == ((OUT, port) if fwd.mode == "steer" else ("127.0.0.1", port)), local
        b.close()
    finally:
        a.close()


def test_forward_long_lived_bidirectional(fwd):
    lis = echo_backend(fwd)
    port = lis.getsockname()[1]
    try:
        wait_forwarded(fwd, port)
        s = out_conn(fwd, port)
        s.settimeout(10)
        for i in range(40):  # a WebSocket-style conversation: both ways, with pauses
            msg = os.urandom(1 + i * 997)
            s.sendall(msg)
            got = b""
            while len(got) < len(msg):
                got += s.recv(65536)
            assert got == msg
            if i % 10 == 0:
                time.sleep(0.6)  # across a few scans: the relay is not disturbed by them
        ss = subprocess.run(["ip", "netns", "exec", fwd.ns, "ss", "-Htin", "state", "established",
                             "dst", f"127.0.0.1:{port}"], capture_output=True, text=True, check=True).stdout
        if fwd.mode == "relay":
            # the relay's leg to the loopback listener uses reno, whatever
            # the system's default (tests/bench/README.md, ports.sh)
            assert " reno " in ss and ss.count("\n") <= 2, ss
        else:
            assert ss == "", ss  # steered: no second connection
        s.close()
    finally:
        lis.close()


def test_forward_half_close(fwd):
    with in_ns(fwd.ns):
        lis = listener()
    port = lis.getsockname()[1]
    try:
        wait_forwarded(fwd, port)
        s = out_conn(fwd, port)
        s.settimeout(10)
        lis.settimeout(10)
        b, _ = lis.accept()
        b.settimeout(10)
        s.sendall(b"request body")
        s.shutdown(socket.SHUT_WR)  # the client's half-close reaches the backend as EOF
        assert read_to_eof(b) == b"request body"
        b.sendall(b"answer after EOF")  # and the other direction still flows
        b.close()
        assert read_to_eof(s) == b"answer after EOF"
        s.close()
    finally:
        lis.close()


def test_forward_stops_within_1s_of_close(fwd):
    with in_ns(fwd.ns):
        lis = listener()
    port = lis.getsockname()[1]
    wait_forwarded(fwd, port)
    lis.close()
    t0 = time.monotonic()
    while True:
        try:
            out_conn(fwd, port).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() - t0 < 1.0
        time.sleep(0.02)


def test_forward_not_when_covered_by_wildcard(fwd):
    with in_ns(fwd.ns):
        a = socket.socket()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        a.bind(("0.0.0.0", 0))
        a.listen()
        port = a.getsockname()[1]
        b = socket.socket()
        b.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        b.bind(("127.0.0.1", port))
        b.listen()
    try:
        time.sleep(1.2)
        got = mine(ns_list(fwd), {port})
        assert sorted(p["address"] for p in got) == ["0.0.0.0", "127.0.0.1"]
        assert all("forwardedTo" not in p for p in got)
    finally:
        a.close()
        b.close()


def test_forward_bound_on_retry_is_an_event(fwd):
    """The outward address's port is taken (bound, not listening: no scan
    sees it) when the loopback listener comes: `opened` without
    forwardedTo.  The blocker goes, the forwarder binds on a retry: the
    stream says so (`closed` as it was listed, then `opened` forwarded),
    and curl through the outward address reaches the server."""
    c = Client(fwd.url, fwd.token)
    with in_ns(fwd.ns):
        w = open_watch(fwd)
        blocker = socket.socket()  # no SO_REUSEADDR: the forwarder's bind fails
        blocker.bind((OUT, 0))
        port = blocker.getsockname()[1]
        pid = start_bg(c, {"cmd": "python3", "args": ["-m", "http.server", "--bind", "127.0.0.1", str(port)],
                           "tag": "fwd-retry"})
    try:
        _, m = w.wait(lambda m: m.get("opened", {}).get("port") == port, 20)
        assert m["opened"] == {"address": "127.0.0.1", "port": port, "pid": pid, "tag": "fwd-retry",
                               "commandPid": pid}  # not forwarded: the bind failed
        evs = [m for _, m in w.events(1.2)]  # a few retries: no event while nothing changes
        assert [m for m in evs if any(v.get("port") == port for v in m.values())] == []
        assert "forwardedTo" not in mine(ns_list(fwd), {port})[0]
        blocker.close()
        t0 = time.monotonic()
        t1, m = w.wait(lambda m: any(v.get("port") == port for v in m.values()), 3)
        assert m == {"closed": {"address": "127.0.0.1", "port": port, "pid": pid, "tag": "fwd-retry",
                                "commandPid": pid}}, m
        _, m = w.wait(lambda m: True, 1)  # right behind it
        assert m == {"opened": {"address": "127.0.0.1", "port": port, "pid": pid, "tag": "fwd-retry",
                                "commandPid": pid, "forwardedTo": f"{OUT}:{port}"}}, m
        assert t1 - t0 < 1.2
        r = subprocess.run(["ip", "netns", "exec", fwd.ns, "curl", "-sS", "--interface", OUT, "-o", "/dev/null",
                            "-w", "%{http_code}", f"http://{OUT}:{port}/"], capture_output=True, text=True, timeout=30)
        assert r.stdout == "200", r
        # the server goes: one `closed`, as it was listed (forwarded)
        with in_ns(fwd.ns):
            c.unary(SIGNAL, {"process": {"tag": "fwd-retry"}, "signal": 9})
        _, m = w.wait(lambda m: any(v.get("port") == port for v in m.values()), 3)
        assert m == {"closed": {"address": "127.0.0.1", "port": port, "pid": pid, "tag": "fwd-retry",
                                "commandPid": pid, "forwardedTo": f"{OUT}:{port}"}}, m
        assert [m for _, m in w.events(1.2) if any(v.get("port") == port for v in m.values())] == []
    finally:
        blocker.close()
        with in_ns(fwd.ns):
            c.unary(SIGNAL, {"process": {"tag": "fwd-retry"}, "signal": 9})
        w.close()


@pytest.mark.parametrize("fwd", ["steer"], indirect=True)
def test_forward_steer_looks_the_owner_up_again(fwd):
    """The descriptor the scan found (this test's) is moved to another
    number before the forwarder can bind: the first try fails on a stale
    descriptor, the owner is looked up again, and the listener is steered
    to through its new descriptor."""
    with in_ns(fwd.ns):
        blocker = socket.socket()  # the forwarder's bind fails while it is there
        blocker.bind((OUT, 0))
        port = blocker.getsockname()[1]
        lis = listener(port=port)
    moved = None
    try:
        assert wait_for(lambda: [p for p in mine(ns_list(fwd), {port}) if p["pid"] == os.getpid()], timeout=5)
        moved = socket.socket(fileno=os.dup(lis.fileno()))  # the same listener at another number
        lis.close()
        blocker.close()
        mark = f"port {port}: connections to {OUT}:{port} handed to the listener of pid {os.getpid()}"
        assert wait_for(lambda: mark in log_text(fwd), timeout=5), log_text(fwd)[-3000:]
        assert f"port {port}: connections to {OUT}:{port} relayed" not in log_text(fwd)
        local, peer, client = accepted_ends(fwd, moved, port)
        assert local == (OUT, port) and peer == client, (local, peer, client)
    finally:
        blocker.close()
        lis.close()
        if moved:
            moved.close()


def test_forward_never_4064_4065(fwd):
    with in_ns(fwd.ns):
        held = [listener(port=4064), listener(port=4065)]
        other = listener()
    try:
        wait_forwarded(fwd, other.getsockname()[1])
        time.sleep(0.6)
        got = mine(ns_list(fwd), {4064, 4065})
        assert len(got) == 2 and all("forwardedTo" not in p for p in got)
    finally:
        for s in held + [other]:
            s.close()


@pytest.mark.parametrize("fwd", ["relay"], indirect=True)  # steered, the agent holds none of it
def test_forward_200_to_backend_that_never_reads(fwd):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    with in_ns(fwd.ns):
        lis = listener()
        lis.listen(512)
    port = lis.getsockname()[1]
    wait_forwarded(fwd, port)
    rss0 = status_kib(fwd.proc.pid, "VmRSS")
    conns, backs = [], []
    try:
        chunk = b"x" * 65536
        for _ in range(200):
            s = out_conn(fwd, port)
            s.setblocking(False)
            conns.append(s)
            b, _ = lis.accept()  # accepted, never read
            backs.append(b)
        sent = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # push until no connection takes more
            moved = 0
            for s in conns:
                try:
                    n = s.send(chunk)
                    sent += n
                    moved += n
                except BlockingIOError:
                    pass
            if not moved:
                time.sleep(0.2)
                if not any(_sendable(s) for s in conns):
                    break
        rss1 = status_kib(fwd.proc.pid, "VmRSS")
        # at most 64 KiB per direction per connection held (200 × 2 × 64 KiB =
        # 25 MiB), plus ASan's 8 MiB quarantine and 4 MiB of slack; the
        # 1.5 GiB the clients pushed stay in the kernel's buffers and theirs
        assert rss1 - rss0 < 200 * 2 * 64 + 12 * 1024, (rss0, rss1, sent)
        assert sent > 200 * 64 * 1024  # the kernel's buffers and the relay's filled
        print(f"200 stalled relays: {sent >> 20} MiB sent, agent RSS {rss0} → {rss1} KiB", file=sys.stderr)
        c = Client(fwd.url, fwd.token)
        with in_ns(fwd.ns):  # the agent still answers
            st, _, _ = c.unary(LIST, {})
        assert st == 200
    finally:
        for s in conns + backs:
            s.close()
        lis.close()
    time.sleep(1)


@pytest.mark.parametrize("fwd", ["relay"], indirect=True)
def test_forward_at_most_1024_relays(fwd):
    """The 1025th connection is accepted and closed at once; when one of
    the 1024 ends, a new one is relayed again."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 8192)), hard))
    with in_ns(fwd.ns):
        lis = listener()
        lis.listen(2048)
    port = lis.getsockname()[1]
    wait_forwarded(fwd, port)
    conns, backs = [], []
    try:
        for _ in range(1024):
            conns.append(out_conn(fwd, port))
            lis.settimeout(10)
            backs.append(lis.accept()[0])  # each reached the backend: relayed
        extra = out_conn(fwd, port)
        extra.settimeout(5)
        assert extra.recv(10) == b""  # closed by the agent at once
        extra.close()
        conns.pop().close()
        backs.pop().close()
        time.sleep(0.3)  # the relay saw both sides go
        again = out_conn(fwd, port)
        backs.append(lis.accept()[0])
        conns.append(again)
        again.sendall(b"still relayed")
        backs[-1].settimeout(5)
        assert backs[-1].recv(100) == b"still relayed"
    finally:
        for s in conns + backs:
            s.close()
        lis.close()
    time.sleep(1)


def _sendable(s):
    try:
        return s.send(b"x") > 0
    except BlockingIOError:
        return False


# ---------------------------------------------------------------- the init key forwardLocalPorts
# serve --init-listen --init-apply-network stands for PID 1 here: the init
# message configures the network of a namespace this test creates (a veth
# pair whose two ends are both inside it, so nothing leaves it), and its
# forwardLocalPorts turns forwarding to the guest IP on (the default) or off.

GUEST = "10.239.0.2"


def test_init_message_forward_local_ports(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import initpeer
    ns = f"conch-ports-init-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    srv = None
    try:
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
                       check=True)
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "v1", "up"], check=True)
        subprocess.run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"], check=True)
        sock = "unix:" + str(tmp_path / "init.sock")
        with in_ns(ns):
            srv = Server(name="test_ports_init", token="",
                         extra_args=["--init-listen", sock, "--init-apply-network",
                                     "--resolv-conf", str(tmp_path / "resolv.conf")])
        srv.ns = ns

        def msg(token, **extra):
            return dict({"version": 1, "sandboxID": "ports-sb", "agentToken": token, "env": {},
                         "network": {"guestIP": GUEST, "prefixLength": 24, "gateway": "10.239.0.1"}}, **extra)
        # a wrong type is a decode failure: no answer
        assert initpeer.exchange(sock, msg("t0", forwardLocalPorts="no")) is None
        assert initpeer.exchange(sock, msg("t1")) == '{"version":1,"status":"ready","retryable":false}'
        srv.token = "t1"
        with in_ns(ns):
            lis = echo_backend(srv)
        port = lis.getsockname()[1]
        [p] = wait_forwarded(srv, port)
        assert p["forwardedTo"] == f"{GUEST}:{port}"
        with in_ns(ns):
            s = socket.create_connection((GUEST, port), timeout=5)
        s.sendall(b"via the guest IP")
        assert s.recv(100) == b"via the guest IP"
        s.close()
        # the same message again (the token unchanged): the forwarder stays,
        # and a stream opened before sees nothing
        with in_ns(ns):
            w = open_watch(srv)
        try:
            _, m = w.wait(lambda m: m.get("opened", {}).get("port") == port, 3)
            assert m["opened"]["forwardedTo"] == f"{GUEST}:{port}"
            with in_ns(ns):
                held = socket.create_connection((GUEST, port), timeout=5)  # relayed across the re-apply
            assert '"ready"' in initpeer.exchange(sock, msg("t1"))
            assert [m for _, m in w.events(1.2) if any(v.get("port") == port for v in m.values())] == []
            held.sendall(b"across the re-apply")
            assert held.recv(100) == b"across the re-apply"
            held.close()

            def change():
                _, a = w.wait(lambda m: any(v.get("port") == port for v in m.values()), 2)
                _, b = w.wait(lambda m: True, 1)
                assert list(a) == ["closed"] and list(b) == ["opened"], (a, b)
                assert {k: v for k, v in a["closed"].items() if k != "forwardedTo"} == \
                    {k: v for k, v in b["opened"].items() if k != "forwardedTo"}
                return a["closed"].get("forwardedTo"), b["opened"].get("forwardedTo")
            # forwardLocalPorts false turns it off (the same token: the stream
            # goes on): `closed` forwarded, `opened` not
            assert '"ready"' in initpeer.exchange(sock, msg("t1", forwardLocalPorts=False))
            assert change() == (f"{GUEST}:{port}", None)
            [p] = mine(ns_list(srv), {port})
            assert "forwardedTo" not in p
            with in_ns(ns):
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((GUEST, port), timeout=5)
            # and true turns it on again
            assert '"ready"' in initpeer.exchange(sock, msg("t1", forwardLocalPorts=True))
            assert change() == (None, f"{GUEST}:{port}")
            with in_ns(ns):
                s = socket.create_connection((GUEST, port), timeout=5)
            s.sendall(b"on again")
            assert s.recv(100) == b"on again"
            s.close()
        finally:
            w.close()
        # a later message with another token and forwardLocalPorts false turns it off
        assert '"ready"' in initpeer.exchange(sock, msg("t2", forwardLocalPorts=False))
        srv.token = "t2"
        time.sleep(1)
        [p] = mine(ns_list(srv), {port})
        assert "forwardedTo" not in p
        with in_ns(ns):
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection((GUEST, port), timeout=5)
        lis.close()
    finally:
        if srv:
            text = srv.stop()
            assert sanitizer_report(text) is None, sanitizer_report(text)
        subprocess.run(["ip", "netns", "del", ns], check=False)


@pytest.mark.parametrize("kernel", ["now", "before-5.11"])
def test_steering_never_changes_the_agents_memlock_limit(tmp_path, kernel):
    """Making the steering objects changes no limit a command can inherit:
    commands started while they are made (and after) see the agent's own
    RLIMIT_MEMLOCK, and no thread of the agent ever sets it (strace).  On a
    kernel before 5.11 (the CONCH_FAULT=steer_memlock seam: the objects
    made in the agent fail EPERM) a short-lived child lifts its own limit,
    makes them and passes them back: steered all the same."""
    trace = tmp_path / "strace.log"
    wrap = ("strace", "-f", "-qq", "-o", str(trace), "-e", "trace=prlimit64,setrlimit")
    env = {"CONCH_FAULT": "steer_memlock"} if kernel != "now" else None
    old = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    soft = 1 << 20  # the agent's (inherited from here), to tell from a lifted one
    resource.setrlimit(resource.RLIMIT_MEMLOCK, (soft, old[1]))
    try:
        agent_memlock(tmp_path, kernel, trace, wrap, env, str(soft // 1024))
    finally:
        resource.setrlimit(resource.RLIMIT_MEMLOCK, old)


def agent_memlock(tmp_path, kernel, trace, wrap, env, want):
    with forwarding_agent(f"memlock-{kernel}", env=env, wrap=wrap) as srv:
        tracer = srv.proc.pid
        agent = int(open(f"/proc/{tracer}/task/{tracer}/children").read().split()[0])
        seen, stop = [], threading.Event()

        def commands():
            with in_ns(srv.ns):
                c = Client(srv.url, srv.token)
                while not stop.is_set() or not seen:
                    st, msgs, end = c.stream(SP, [{"cmd": "sh", "args": ["-c", "ulimit -l"]}])
                    assert st == 200, msgs
                    seen.append(b"".join(unb64(m["data"]["stdout"]) for m in msgs
                                         if "stdout" in m.get("data", {})).decode().strip())
        t = threading.Thread(target=commands)
        t.start()
        try:
            with in_ns(srv.ns):
                lis = listener()
            port = lis.getsockname()[1]
            wait_forwarded(srv, port)
            assert wait_for(lambda: f"port {port}: connections to {OUT}:{port} handed to the listener of pid {os.getpid()}"
                            in log_text(srv), timeout=10), log_text(srv)[-3000:]
            local, peer, client = accepted_ends(srv, lis, port)
            assert local == (OUT, port) and peer == client  # steered
            lis.close()
        finally:
            stop.set()
            t.join(60)
        tids = set(os.listdir(f"/proc/{agent}/task"))
        os.kill(agent, signal.SIGTERM)  # the agent itself: strace then ends by itself
        srv.proc.wait(timeout=30)
    assert seen and set(seen) == {want}, (want, seen)
    sets = [l for l in trace.read_text().splitlines() if "RLIMIT_MEMLOCK, {" in l]
    assert not [l for l in sets if l.split()[0] in tids], sets
    if kernel != "now":  # the child's, never the agent's
        assert sets, trace.read_text()[-2000:]


def push_until_stuck(conns, seconds=10):
    """Send on every socket until none takes more; the bytes sent."""
    chunk, sent = b"x" * 65536, 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        moved = 0
        for s in conns:
            try:
                n = s.send(chunk)
                sent += n
                moved += n
            except (BlockingIOError, ConnectionError):
                pass
        if not moved:
            time.sleep(0.2)
            if not any(_sendable_or_gone(s) for s in conns):
                break
    return sent


def _sendable_or_gone(s):
    try:
        return s.send(b"x") > 0
    except (BlockingIOError, ConnectionError):
        return False


def test_relays_keep_to_a_quarter_of_the_budget():
    """The bound: 96 outside clients push into a backend that never reads
    with a 4 MiB memory budget.  Relays hold at most a quarter of it (the
    pipes they fill are capped), the oldest stalled ones are reset once
    others need room (counted), and the API keeps its room: a 2 MiB upload
    (buffered input, from the same budget) succeeds meanwhile."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
    budget = 4 << 20
    with forwarding_agent("relay-cap", env={"CONCH_FORWARD_STEER": "0", "CONCH_MEM_BUDGET": str(budget)}) as srv:
        with in_ns(srv.ns):
            lis = listener()
            lis.listen(512)
        port = lis.getsockname()[1]
        wait_forwarded(srv, port)
        conns, backs = [], []
        try:
            for _ in range(96):
                s = out_conn(srv, port)
                s.setblocking(False)
                conns.append(s)
                backs.append(lis.accept()[0])  # accepted, never read
            sent = push_until_stuck(conns)
            time.sleep(1.2)  # the relays that filled their pipes are stalled now
            sent += push_until_stuck(conns, 5)
            c = Client(srv.url, srv.token)
            with in_ns(srv.ns):
                m = c.metrics()
                chunk = os.urandom(1 << 20)
                st, msgs, end = c.stream("/pb.FileService/PostFileStream",
                                         [{"filepath": f"/tmp/relay-cap-{os.getpid()}", "content": b64(chunk)},
                                          {"content": b64(chunk)}], chunked=True)
            assert (st, end) == (200, {}), (st, end)
            os.unlink(f"/tmp/relay-cap-{os.getpid()}")
            print(f"96 stalled relays, budget 4 MiB: {sent >> 20} MiB sent, relays hold {m['relaysHeld']} bytes, "
                  f"{m['relaysReset']} reset", file=sys.stderr)
            assert 0 < m["relaysHeld"] <= budget // 4, m
            assert m["relaysReset"] > 0, m
            assert "relayed connection reset: the relays hold" in log_text(srv)
        finally:
            for s in conns + backs:
                s.close()
            lis.close()



def test_idle_relays_are_closed():
    """CONCH_RELAY_IDLE_MS=600: a relayed connection that moves nothing is
    closed after it; one that keeps talking stays."""
    with forwarding_agent("relay-idle", env={"CONCH_FORWARD_STEER": "0", "CONCH_RELAY_IDLE_MS": "600"}) as srv:
        lis = echo_backend(srv)
        port = lis.getsockname()[1]
        wait_forwarded(srv, port)
        quiet, talker = out_conn(srv, port), out_conn(srv, port)
        try:
            for s in (quiet, talker):
                s.settimeout(5)
                s.sendall(b"hello")
                assert s.recv(10) == b"hello"
            t0 = time.monotonic()
            while time.monotonic() - t0 < 2.5:
                talker.sendall(b"ping")
                assert talker.recv(10) == b"ping"
                time.sleep(0.2)
            quiet.settimeout(0.1)
            assert quiet.recv(10) == b"", "the idle relay is still open"
            assert "relayed connections closed: nothing moved for 600 ms" in log_text(srv)
        finally:
            quiet.close()
            talker.close()
            lis.close()
