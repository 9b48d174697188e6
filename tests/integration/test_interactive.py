"""Interactive processes (api.md §9): stdin_open, SendInput,
StreamInput, CloseStdin and Update, end to end against the real binary.

Terminal sessions (`sh -i`, `python3 -i` on a PTY) over HTTP/1.1
(http.client, one connection per call) and HTTP/2 (python3-h2, every call a
stream of one connection), typing through unary SendInput and through a
StreamInput (HTTP/1.1 chunked, HTTP/2 DATA frames); a background `cat`
fed by every input path; backpressure (a child that does not read stalls a
4 MiB StreamInput, the server's RSS stays bounded, nothing is lost once it
reads); every error text of §9; curl as in docs/guide/processes.md; grpcio
StreamInput; that page's python3 terminal session.
"""
import http.client
import json
import os
import queue
import re
import struct
import threading
import time

import grpc
import pytest

from conch import Client, b64, curl, envelope, parse_envelopes, unb64
from conftest import ROOT, status_kib
from h2conn import H2Client

import agent_pb2 as pb  # noqa: E402  (conftest makes it when run alone)

PS = "/pb.ProcessService/"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(own_server):
    return own_server  # this module's own conch-init: its stalls stay here


@pytest.fixture()
def client(server):
    return Client(server.url, server.token)


def event_of(m):
    if "start" in m:
        return ("start", m["start"].get("pid", 0))
    if "data" in m:
        (k, v), = ((k, v) for k, v in m["data"].items() if k != "offset")  # offset: test_replay.py
        return ("data", k, unb64(v))
    if "end" in m:
        e = m["end"]
        return ("end", e.get("exitCode", 0), e.get("status", ""), e.get("error", ""))
    if "keepalive" in m:
        return ("keepalive",)
    raise AssertionError(m)


def inp(kind, data):
    return {"input": {kind: b64(data)}}


# ---------------------------------------------------------------- terminals
class Events:
    """Events of one StartProcess stream, filled by a transport, waited on."""

    def __init__(self):
        self.cv = threading.Condition()
        self.events = []
        self.trailer = None
        self.done = False

    def add(self, ev):
        with self.cv:
            self.events.append(ev)
            self.cv.notify_all()

    def finish(self, trailer):
        with self.cv:
            self.trailer, self.done = trailer, True
            self.cv.notify_all()

    def output(self, kind="pty"):
        with self.cv:
            return b"".join(e[2] for e in self.events if e[0] == "data" and e[1] == kind)

    def pid(self):
        with self.cv:
            assert self.events and self.events[0][0] == "start", self.events
            return self.events[0][1]


class Term:
    """A terminal session: a foreground StartProcess stream plus input calls.
    Subclasses provide the transport (start, _unary, stream input)."""

    def __init__(self, req, use_stream):
        self.ev = Events()
        self.mark = 0  # output offset the next expect() searches from
        self.use_stream = use_stream
        self.start(req)
        self.wait(lambda: self.ev.events, 10)
        self.pid = self.ev.pid()
        if use_stream:
            self.stream_open({"start": {"process": {"pid": self.pid}}})

    def wait(self, pred, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = pred()
            if v:
                return v
            self.pump(min(0.05, max(0.001, deadline - time.time())))
        return pred()

    def expect(self, pattern, timeout=15):
        rx = re.compile(pattern.encode() if isinstance(pattern, str) else pattern)

        def found():
            out = self.ev.output()
            m = rx.search(out, self.mark)
            if m:
                self.mark = m.end()
            return m
        m = self.wait(found, timeout)
        assert m, f"{pattern!r} not in {self.ev.output()[self.mark:]!r}"
        return m

    def type(self, data):
        data = data.encode() if isinstance(data, str) else data
        if self.use_stream:
            self.stream_send({"data": inp("pty", data)})
        else:
            st, body = self.unary("SendInput", {"process": {"pid": self.pid}, **inp("pty", data)})
            assert (st, body) == (200, {}), body

    def resize(self, cols, rows):
        st, body = self.unary("Update", {"process": {"pid": self.pid}, "pty": {"cols": cols, "rows": rows}})
        assert (st, body) == (200, {}), body

    def finish(self, timeout=20):
        assert self.wait(lambda: self.ev.done, timeout), "stream did not end"
        if self.use_stream:
            st, body = self.stream_close()
            assert st == 200, body
        ends = [e for e in self.ev.events if e[0] == "end"]
        assert len(ends) == 1 and self.ev.trailer == {}, (self.ev.events[-3:], self.ev.trailer)
        return ends[0]


class H1Term(Term):
    """HTTP/1.1: the StartProcess stream read by a thread; each unary call on
    its own connection; StreamInput as one chunked request fed by a queue."""

    def __init__(self, client, req, use_stream):
        self.client = client
        super().__init__(req, use_stream)

    def start(self, req):
        c = self.client.conn(timeout=60)
        c.request("POST", PS + "StartProcess", body=envelope(json.dumps(req).encode()),
                  headers=self.client.headers(ctype="application/connect+json"))
        r = c.getresponse()
        assert r.status == 200

        def reader():
            try:
                while True:
                    hdr = r.read(5)
                    if len(hdr) < 5:
                        self.ev.finish("cut")
                        return
                    flags, n = struct.unpack(">BI", hdr)
                    body = r.read(n)
                    if flags & 2:
                        self.ev.finish(json.loads(body))
                        return
                    self.ev.add(event_of(json.loads(body)))
            except (OSError, ValueError, http.client.HTTPException):
                self.ev.finish("cut")  # the server went away (module teardown): tests check the trailer
            finally:
                c.close()
        threading.Thread(target=reader, daemon=True).start()

    def pump(self, t):
        time.sleep(t)

    def unary(self, method, body):
        st, b, _ = self.client.unary(PS + method, body)
        return st, b

    def stream_open(self, first):
        self.q = queue.Queue()
        self.q.put(first)
        self.sresult = {}

        def gen():
            while True:
                m = self.q.get()
                if m is None:
                    return
                yield envelope(json.dumps(m).encode())

        def run():
            c = self.client.conn(timeout=60)
            c.request("POST", PS + "StreamInput", body=gen(), encode_chunked=True,
                      headers=self.client.headers(ctype="application/connect+json"))
            r = c.getresponse()
            self.sresult["r"] = (r.status, r.read())
            c.close()
        self.sthread = threading.Thread(target=run, daemon=True)
        self.sthread.start()

    def stream_send(self, m):
        self.q.put(m)

    def stream_close(self):
        self.q.put(None)
        self.sthread.join(20)
        st, raw = self.sresult["r"]
        envs = parse_envelopes(raw)
        return st, [json.loads(p) for f, p in envs]


class H2Term(Term):
    """HTTP/2: one connection, StartProcess, every unary call and the
    StreamInput as concurrent streams of it (one thread pumps)."""

    def __init__(self, server, req, use_stream):
        self.server = server
        self.h2 = H2Client("127.0.0.1", server.port)
        self.off = 0
        super().__init__(req, use_stream)

    def start(self, req):
        self.sid = self.h2.connect_stream(PS + "StartProcess", [json.dumps(req).encode()], self.server.token,
                                          ctype="application/connect+json")

    def pump(self, t):
        if not self.h2.closed:
            self.h2.pump(t)
        else:
            time.sleep(t)
        st = self.h2.streams[self.sid]
        body = bytes(st.body)
        while len(body) - self.off >= 5:
            flags, n = struct.unpack(">BI", body[self.off:self.off + 5])
            if len(body) - self.off - 5 < n:
                break
            p = body[self.off + 5:self.off + 5 + n]
            self.off += 5 + n
            if flags & 2:
                self.ev.finish(json.loads(p))
            else:
                self.ev.add(event_of(json.loads(p)))
        if st.done and not self.ev.done:
            self.ev.finish("cut")

    def unary(self, method, body):
        sid = self.h2.connect_unary(PS + method, json.dumps(body).encode(), self.server.token)
        self.wait(lambda: self.h2.streams[sid].done, 15)
        s = self.h2.streams[sid]
        return s.status, json.loads(bytes(s.body))

    def stream_open(self, first):
        self.isid = self.h2.connect_stream(PS + "StreamInput", [json.dumps(first).encode()], self.server.token,
                                           ctype="application/connect+json", end_stream=False)

    def stream_send(self, m):
        self.h2.send(self.isid, envelope(json.dumps(m).encode()))

    def stream_close(self):
        self.h2.end(self.isid)
        self.wait(lambda: self.h2.streams[self.isid].done, 15)
        s = self.h2.streams[self.isid]
        return s.status, [json.loads(p) for f, p in parse_envelopes(bytes(s.body))]


def make_term(server, client, http, req, use_stream):
    return H1Term(client, req, use_stream) if http == "h1" else H2Term(server, req, use_stream)


SH = {"cmd": "sh", "args": ["-i"], "pty": {}, "stdinOpen": True, "env": {"PS1": "PROMPT> "}}


@pytest.mark.parametrize("use_stream", [False, True], ids=["SendInput", "StreamInput"])
@pytest.mark.parametrize("http", ["h1", "h2"])
def test_sh_terminal(server, client, http, use_stream):
    """`sh -i` on a PTY: size, resize with SIGWINCH, Ctrl-C, exit code."""
    t = make_term(server, client, http, SH, use_stream)
    t.expect("PROMPT> ")
    t.type("stty size\n")
    t.expect(r"\r\n24 80\r\n")
    t.expect("PROMPT> ")
    t.type("trap 'echo WINCH' WINCH\n")
    t.expect("PROMPT> ")
    t.resize(120, 40)
    t.type("stty size\n")
    t.expect(r"WINCH")  # the trap ran (before or after the command line is read)
    t.mark = 0
    t.expect(r"\r\n40 120\r\n")
    t.expect("PROMPT> ")
    t.type("sleep 100\n")
    time.sleep(0.3)
    t0 = time.time()
    t.type(b"\x03")  # the line discipline turns it into SIGINT for the foreground job
    t.expect("PROMPT> ")
    assert time.time() - t0 < 10
    t.type("echo alive-$((6*7))\n")
    t.expect("alive-42")
    t.type("exit 3\n")
    end = t.finish()
    assert end == ("end", 3, "error", "exit status 3"), end


@pytest.mark.parametrize("http", ["h1", "h2"])
def test_python_repl(server, client, http):
    req = {"cmd": "python3", "args": ["-i", "-q"], "pty": {}, "stdinOpen": True}
    t = make_term(server, client, http, req, False)
    t.expect(">>> ")
    t.type("6 * 7\n")
    t.expect(r"\r\n42\r\n")
    t.type("def f(x):\n")
    t.expect(r"\.\.\. ")
    t.type("    return x[::-1]\n\n")
    t.expect(">>> ")
    t.type("print(f('olleh'), len('abc'))\n")
    t.expect(r"hello 3\r\n")
    t.type("raise SystemExit(5)\n")
    assert t.finish()[1] == 5


def test_pty_without_stdin_open_takes_input(server, client):
    """DECISION: a PTY is always the child's terminal, so pty input is taken
    with or without stdinOpen (stdinOpen matters for pipes)."""
    t = H1Term(client, {"cmd": "sh", "args": ["-i"], "pty": {}, "env": {"PS1": "P> "}}, False)
    t.expect("P> ")
    t.type("exit 0\n")
    assert t.finish()[1] == 0


# ---------------------------------------------------------------- background cat
def start_bg(client, req):
    """Background start; returns (pid, the open Events reader)."""
    t = H1Term.__new__(H1Term)
    t.client, t.ev, t.use_stream, t.mark = client, Events(), False, 0
    t.start(dict(req, background=True))
    assert t.wait(lambda: t.ev.events or t.ev.done, 10) and t.ev.events, t.ev.trailer
    return t.ev.pid(), t


def stream_input(client, msgs, chunked=True):
    """A StreamInput over HTTP/1.1; → (status, messages, end)."""
    return client.stream(PS + "StreamInput", msgs, chunked=chunked)


@pytest.mark.parametrize("http", ["h1", "h2"])
def test_background_cat_every_input_path(server, client, http):
    pid, t = start_bg(client, {"cmd": "cat", "stdin": b64(b"a"), "stdinOpen": True, "tag": f"cat-{http}"})
    sel = {"tag": f"cat-{http}"} if http == "h1" else {"pid": pid}
    letters = [bytes([c]) for c in range(ord("c"), ord("z") + 1)]
    assert len(letters) == 24
    if http == "h1":
        st, body, _ = client.unary(PS + "SendInput", {"process": sel, **inp("stdin", b"b")})
        assert (st, body) == (200, {})
        # c…z in 25 messages: 24 letters and one empty data message
        msgs = [{"start": {"process": sel}}] + [{"data": inp("stdin", x)} for x in letters] + \
               [{"data": inp("stdin", b"")}]
        st, out, end = stream_input(client, msgs)
        assert (st, out, end) == (200, [{}], {}), (st, out, end)
        st, body, _ = client.unary(PS + "CloseStdin", {"process": sel})
        assert (st, body) == (200, {})
    else:
        h2 = H2Client("127.0.0.1", server.port)
        sid = h2.connect_unary(PS + "SendInput", json.dumps({"process": sel, **inp("stdin", b"b")}).encode(),
                               server.token)
        assert h2.wait(sid)[0].status == 200
        isid = h2.connect_stream(PS + "StreamInput", [json.dumps({"start": {"process": sel}}).encode()],
                                 server.token, ctype="application/connect+json", end_stream=False)
        for x in letters + [b""]:
            h2.send(isid, envelope(json.dumps({"data": inp("stdin", x)}).encode()))
        h2.end(isid)
        s, = h2.wait(isid)
        assert s.status == 200 and [json.loads(p) for f, p in parse_envelopes(bytes(s.body))] == [{}, {}]
        sid = h2.connect_unary(PS + "CloseStdin", json.dumps({"process": sel}).encode(), server.token)
        s, = h2.wait(sid)
        assert (s.status, json.loads(bytes(s.body))) == (200, {})
        h2.close()
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout") == b"abcdefghijklmnopqrstuvwxyz"
    assert [e for e in t.ev.events if e[0] == "end"] == [("end", 0, "exited", "")]


def test_foreground_pipe_input_and_proto(server, client):
    """A foreground pipe process found by pid; SendInput in the proto codec."""
    ev = Events()
    t = H1Term.__new__(H1Term)
    t.client, t.ev, t.use_stream, t.mark = client, ev, False, 0
    t.start({"cmd": "sh", "args": ["-c", "read a; echo got=$a; read b; echo got=$b"], "stdinOpen": True})
    t.wait(lambda: ev.events, 10)
    pid = ev.pid()
    st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", b"one\n")})
    assert st == 200
    m = pb.SendInputRequest(process=pb.ProcessSelector(pid=pid), input=pb.ProcessInput(stdin=b"two\n"))
    c = client.conn()
    c.request("POST", PS + "SendInput", body=m.SerializeToString(),
              headers=client.headers(ctype="application/proto"))
    r = c.getresponse()
    assert (r.status, r.read()) == (200, b"")
    c.close()
    assert t.wait(lambda: ev.done, 10)
    assert ev.output("stdout") == b"got=one\ngot=two\n"


# ---------------------------------------------------------------- backpressure
def test_stalled_child_stalls_stream_bounded(server, client):
    """A child that does not read for 2 s: a 16 MiB StreamInput stalls (the
    stream does not finish while the child sleeps), the server's RSS grows
    by a few MiB at most, and every byte arrives once the child reads."""
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 2; exec sha256sum"], "stdinOpen": True,
                               "tag": "stall"})
    import hashlib
    # 16 MiB, not 4: 4 MiB of JSON (~5.6 MB) can fit in the two loopback
    # socket buffers once autotuning grew them, reader or not
    data = os.urandom(16 * MiB)
    rss0 = status_kib(server.proc.pid, "VmRSS")
    done = {}

    def gen():
        yield envelope(json.dumps({"start": {"process": {"tag": "stall"}}}).encode())
        for i in range(0, len(data), 64 * 1024):
            yield envelope(json.dumps({"data": inp("stdin", data[i:i + 64 * 1024])}).encode())
            done["sent"] = i + 64 * 1024

    def run():
        c = client.conn(timeout=60)
        c.request("POST", PS + "StreamInput", body=gen(), encode_chunked=True,
                  headers=client.headers(ctype="application/connect+json"))
        r = c.getresponse()
        done["r"] = (r.status, r.read(), time.time())
        c.close()
    t0 = time.time()
    th = threading.Thread(target=run, daemon=True)
    th.start()
    time.sleep(1.2)
    assert "r" not in done, "the stream finished while the child was not reading"
    assert done.get("sent", 0) < len(data), "the client could push all 16 MiB (JSON: ~22 MB) with no reader"
    rss1 = status_kib(server.proc.pid, "VmRSS")
    th.join(30)
    st, raw, t1 = done["r"]
    assert st == 200, raw
    assert [(f, json.loads(p)) for f, p in parse_envelopes(raw)] == [(0, {}), (2, {})]
    assert t1 - t0 >= 1.5  # answered only after the child read the bytes
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"tag": "stall"}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 20)
    assert t.ev.output("stdout").split()[0].decode() == hashlib.sha256(data).hexdigest()
    print(f"RSS before {rss0} KiB, during the stall {rss1} KiB")
    assert rss1 - rss0 < 16 * 1024, (rss0, rss1)


def test_stalled_child_stalls_stream_h2(server, client):
    """The same over HTTP/2: the server withholds window updates while the
    child sleeps, so the client's sends block.  Peak RSS is taken while the
    child sleeps (afterwards the data flows, and ASan's quarantine of freed
    buffers grows with the bytes that went through, not with what is held)."""
    import hashlib
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 2; exec sha256sum"], "stdinOpen": True})
    data = os.urandom(4 * MiB)
    rss0 = status_kib(server.proc.pid, "VmRSS")
    peak = [rss0]
    stop = threading.Event()

    def sample():
        while not stop.is_set() and time.time() < t0 + 1.8:
            peak[0] = max(peak[0], status_kib(server.proc.pid, "VmRSS"))
            time.sleep(0.05)
    t0 = time.time()
    th = threading.Thread(target=sample, daemon=True)
    th.start()
    h2 = H2Client("127.0.0.1", server.port, timeout=30)
    isid = h2.connect_stream(PS + "StreamInput", [pb.StreamInputRequest(
        start=pb.StreamInputStart(process=pb.ProcessSelector(pid=pid))).SerializeToString()], server.token,
        end_stream=False)
    for i in range(0, len(data), 256 * 1024):
        m = pb.StreamInputRequest(data=pb.StreamInputData(input=pb.ProcessInput(stdin=data[i:i + 256 * 1024])))
        h2.send(isid, envelope(m.SerializeToString()))
    t_sent = time.time() - t0
    h2.end(isid)
    s, = h2.wait(isid)
    stop.set()
    th.join()
    h2.close()
    assert s.status == 200 and [f for f, p in parse_envelopes(bytes(s.body))] == [0, 2], s.body
    assert t_sent >= 1.0, t_sent  # the sends blocked: no credit while the child slept
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 20)
    assert t.ev.output("stdout").split()[0].decode() == hashlib.sha256(data).hexdigest()
    print(f"h2: RSS before {rss0} KiB, peak while stalled {peak[0]} KiB, sends took {t_sent:.2f} s")
    assert peak[0] - rss0 < 16 * 1024, (rss0, peak[0])


def test_unary_answers_when_written(server, client):
    """SendInput answers once its bytes are in the pipe: at once when they
    fit, after the child starts reading when they do not."""
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 1.5; exec wc -c"], "stdinOpen": True})
    t0 = time.time()
    res = {}

    def send(i, n):
        st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", b"x" * n)})
        res[i] = (st, body, time.time() - t0)
    send(0, 1000)
    assert res[0][:2] == (200, {}) and res[0][2] < 1.0, res
    ths = [threading.Thread(target=send, args=(i, MiB), daemon=True) for i in (1, 2)]
    for th in ths:
        th.start()
        time.sleep(0.1)
    for th in ths:
        th.join(20)
    assert [res[i][:2] for i in (1, 2)] == [(200, {})] * 2, res
    assert min(res[1][2], res[2][2]) >= 1.2, res  # not before the child read them
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout").strip() == str(1000 + 2 * MiB).encode()


def test_parked_input_bounded(server, client):
    """Calls pushing at a child that does not read: 1 MiB queued, 1 MiB
    parked with its call, and the next call past that is refused."""
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 2.5; exec wc -c"], "stdinOpen": True})
    res = {}

    def send(i):
        st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", b"y" * MiB)})
        res[i] = (st, body)
    ths = []
    for i in range(2):
        ths.append(threading.Thread(target=send, args=(i,), daemon=True))
        ths[-1].start()
        time.sleep(0.4)
    assert err(client, "SendInput", {"process": {"pid": pid}, **inp("stdin", b"z")}) == \
        ("resource_exhausted", "process input queue full")
    for th in ths:
        th.join(20)
    assert res == {0: (200, {}), 1: (200, {})}, res
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout").strip() == str(2 * MiB).encode()


def test_waiting_send_inputs_do_not_hold_back_their_h2_connection(server, client, tmp_path):
    """40 SendInputs to a child that does not read yet, all on one HTTP/2
    connection: most of them wait (their bytes are not in the pipe), and a
    ListFiles sent after them on the same connection is answered at once
    all the same (a waiting call's small answer does not count among the
    16 answers being made).  Then the child reads: every call answers {},
    and it got every byte."""
    flag = tmp_path / "go"
    (tmp_path / "listed").write_text("x")
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", f"while [ ! -e {flag} ]; do sleep 0.05; done; exec wc -c"],
                               "stdinOpen": True})
    n, size = 40, 16 * 1024
    h2 = H2Client("127.0.0.1", server.port, timeout=30)
    try:
        body = json.dumps({"process": {"pid": pid}, **inp("stdin", b"w" * size)}).encode()
        ids = [h2.connect_unary(PS + "SendInput", body, server.token) for _ in range(n)]
        deadline = time.time() + 1.0
        while time.time() < deadline:
            h2.pump(0.05)
        waiting = [s for s in ids if not h2.streams[s].done]
        assert len(waiting) >= 20, f"only {len(waiting)} of {n} SendInputs wait: the test needs them waiting"
        t0 = time.time()
        lid = h2.connect_unary("/pb.FileService/ListFiles", json.dumps({"path": str(tmp_path)}).encode(),
                               server.token)
        st, = h2.wait(lid, timeout=10)
        took = time.time() - t0
        assert st.status == 200 and "entries" in json.loads(st.body), (st.status, st.body[:200])
        assert took < 1.0, f"ListFiles behind {len(waiting)} waiting SendInputs took {took:.2f} s"
        assert not any(h2.streams[s].done for s in waiting), "the child read nothing, yet calls answered"
        flag.touch()
        sts = h2.wait(*ids, timeout=30)
    finally:
        flag.touch()  # a failed run leaves no child behind: it reads, then ends at EOF
        h2.close()
    assert [(s.status, json.loads(s.body)) for s in sts] == [(200, {})] * n
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout").strip() == str(n * size).encode()


def test_input_deadline_leaves_process(server, client):
    """A SendInput that passes its Connect-Timeout-Ms while the child does
    not read ends deadline_exceeded; the process keeps running and the bytes
    already queued are still written, in order."""
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 1.5; exec cat"], "stdinOpen": True})
    big = bytes(range(256)) * 4096  # 1 MiB
    t0 = time.time()
    st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", big)},
                               headers={"Connect-Timeout-Ms": "300"})
    assert (st, body["code"]) == (504, "deadline_exceeded"), body
    assert time.time() - t0 < 1.2
    st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", b"tail")})
    assert (st, body) == (200, {}), body  # answered after the child read the first MiB
    st, _, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout") == big + b"tail"
    assert [e for e in t.ev.events if e[0] == "end"] == [("end", 0, "exited", "")]


def test_vanished_input_client_leaves_process(server, client):
    """A StreamInput client that disconnects does not kill the process; its
    bytes already queued are still written."""
    pid, t = start_bg(client, {"cmd": "cat", "stdinOpen": True})
    c = client.conn()
    body = envelope(json.dumps({"start": {"process": {"pid": pid}}}).encode()) + \
        envelope(json.dumps({"data": inp("stdin", b"kept")}).encode())
    c.putrequest("POST", PS + "StreamInput")
    for k, v in client.headers(ctype="application/connect+json").items():
        c.putheader(k, v)
    c.putheader("Transfer-Encoding", "chunked")
    c.endheaders()
    c.send(b"%x\r\n%s\r\n" % (len(body), body))
    assert t.wait(lambda: b"kept" in t.ev.output("stdout"), 10)
    c.close()
    time.sleep(0.3)
    st, body, _ = client.unary(PS + "SendInput", {"process": {"pid": pid}, **inp("stdin", b"+more")})
    assert (st, body) == (200, {})
    st, _, _ = client.unary(PS + "CloseStdin", {"process": {"pid": pid}})
    assert st == 200
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout") == b"kept+more"


# ---------------------------------------------------------------- errors
def err(client, method, body):
    st, b, _ = client.unary(PS + method, body)
    assert st != 200, (method, body, b)
    return b["code"], b["message"]


def stream_err(client, msgs):
    st, out, end = stream_input(client, msgs)
    assert st == 200 and end and "error" in end, (st, out, end)
    return end["error"]["code"], end["error"]["message"]


def test_errors(server, client):
    pipe_pid, pipe = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "closed-one"})
    open_pid, opn = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "open-one", "stdinOpen": True})
    pty_pid, ptyp = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "pty-one", "pty": {}})
    NF = ("not_found", "process pid 999999 not found")
    NFT = ("not_found", 'process tag "nope" not found')
    REQ = ("invalid_argument", "process pid or tag is required")
    NOPTY = ("failed_precondition", "process has no pty")
    ISPTY = ("failed_precondition", "process stdin is a pty: send pty input")
    CLOSED = ("failed_precondition", "process stdin is closed")
    # SendInput: selector, then kind, then closed stdin
    assert err(client, "SendInput", {**inp("stdin", b"x")}) == REQ
    assert err(client, "SendInput", {"process": {}, **inp("stdin", b"x")}) == REQ
    assert err(client, "SendInput", {"process": {"pid": 999999}, **inp("stdin", b"x")}) == NF
    assert err(client, "SendInput", {"process": {"tag": "nope"}, **inp("pty", b"x")}) == NFT
    assert err(client, "SendInput", {"process": {"tag": "closed-one"}, **inp("pty", b"x")}) == NOPTY
    assert err(client, "SendInput", {"process": {"tag": "closed-one"}, **inp("stdin", b"x")}) == CLOSED
    assert err(client, "SendInput", {"process": {"tag": "pty-one"}, **inp("stdin", b"x")}) == ISPTY
    assert err(client, "SendInput", {"process": {"tag": "open-one"}, **inp("pty", b"x")}) == NOPTY
    assert err(client, "SendInput", {"process": {"tag": "open-one"}}) == ("invalid_argument", "input is required")
    assert err(client, "SendInput", {"process": {"tag": "open-one"}, **inp("stdin", b"x" * (MiB + 1))}) == \
        ("resource_exhausted", "input exceeds maximum size 1048576 bytes")
    # StreamInput
    assert stream_err(client, [{"data": inp("stdin", b"x")}]) == \
        ("invalid_argument", "first stream input event must be start")
    assert stream_err(client, [{"keepalive": {}}]) == ("invalid_argument", "first stream input event must be start")
    assert stream_err(client, []) == ("invalid_argument", "first stream input event must be start")
    assert stream_err(client, [{"start": {}}]) == REQ
    assert stream_err(client, [{"start": {"process": {"pid": 999999}}}]) == NF
    assert stream_err(client, [{"start": {"process": {"tag": "closed-one"}}}, {"data": inp("stdin", b"x")}]) == CLOSED
    assert stream_err(client, [{"start": {"process": {"tag": "pty-one"}}}, {"data": inp("stdin", b"x")}]) == ISPTY
    assert stream_err(client, [{"start": {"process": {"tag": "open-one"}}}, {"data": inp("pty", b"x")}]) == NOPTY
    assert stream_err(client, [{"start": {"process": {"tag": "open-one"}}}, {"start": {"process": {"pid": 1}}}]) \
        == ("invalid_argument", "stream input already started")
    st, out, end = stream_input(client, [{"start": {"process": {"tag": "open-one"}}}, {"keepalive": {}}])
    assert (st, out, end) == (200, [{}], {})
    # CloseStdin
    assert err(client, "CloseStdin", {}) == REQ
    assert err(client, "CloseStdin", {"process": {"pid": 999999}}) == NF
    assert err(client, "CloseStdin", {"process": {"tag": "pty-one"}}) == \
        ("failed_precondition", "cannot close stdin of a pty process: send Ctrl-D (0x04)")
    assert err(client, "CloseStdin", {"process": {"tag": "closed-one"}}) == CLOSED
    st, body, _ = client.unary(PS + "CloseStdin", {"process": {"tag": "open-one"}})
    assert (st, body) == (200, {})
    assert err(client, "CloseStdin", {"process": {"tag": "open-one"}}) == CLOSED
    assert err(client, "SendInput", {"process": {"tag": "open-one"}, **inp("stdin", b"x")}) == CLOSED
    # Update: selector, pty required, sizes, kind
    assert err(client, "Update", {"pty": {"cols": 1}}) == REQ
    assert err(client, "Update", {"process": {"tag": "nope"}, "pty": {"cols": 1}}) == NFT
    assert err(client, "Update", {"process": {"tag": "pty-one"}}) == ("invalid_argument", "pty size is required")
    assert err(client, "Update", {"process": {"tag": "pty-one"}, "pty": {"cols": 70000, "rows": 70000}}) == \
        ("invalid_argument", "invalid pty size: pty cols must not exceed 65535")
    assert err(client, "Update", {"process": {"tag": "pty-one"}, "pty": {"rows": 65536}}) == \
        ("invalid_argument", "invalid pty size: pty rows must not exceed 65535")
    assert err(client, "Update", {"process": {"tag": "closed-one"}, "pty": {"cols": 10}}) == NOPTY
    # Update rules: 0 → 80×24; List shows the size
    st, body, _ = client.unary(PS + "Update", {"process": {"tag": "pty-one"}, "pty": {"cols": 100}})
    assert (st, body) == (200, {})
    st, body, _ = client.unary(PS + "List", {})
    cfg = [p["config"] for p in body["processes"] if p["pid"] == pty_pid][0]
    assert cfg["pty"] == {"cols": 100, "rows": 24}
    # exited processes are not found
    for tag in ("closed-one", "open-one", "pty-one"):
        client.unary(PS + "SendSignal", {"process": {"tag": tag}, "signal": 9})
    for x in (pipe, opn, ptyp):
        assert x.wait(lambda: x.ev.done, 10)
    assert err(client, "SendInput", {"process": {"pid": open_pid}, **inp("stdin", b"x")}) == \
        ("not_found", f"process pid {open_pid} not found")
    assert err(client, "Update", {"process": {"tag": "pty-one"}, "pty": {}}) == \
        ("not_found", 'process tag "pty-one" not found')


def test_errors_http_status_and_h2(server):
    """The same texts over HTTP/2, with the Connect HTTP statuses."""
    h2 = H2Client("127.0.0.1", server.port)
    sid = h2.connect_unary(PS + "SendInput", json.dumps({"process": {"pid": 999999}}).encode(), server.token)
    s, = h2.wait(sid)
    assert s.status == 404 and json.loads(bytes(s.body))["message"] == "process pid 999999 not found"
    isid = h2.connect_stream(PS + "StreamInput", [json.dumps({"data": {}}).encode()], server.token,
                             ctype="application/connect+json")
    s, = h2.wait(isid)
    end = [json.loads(p) for f, p in parse_envelopes(bytes(s.body)) if f & 2][0]
    assert end["error"] == {"code": "invalid_argument", "message": "first stream input event must be start"}
    h2.close()


# ---------------------------------------------------------------- curl (docs/guide/processes.md examples)
def curl_json(server, method, body, http2=False):
    args = ["-X", "POST", f"{server.url}{PS}{method}", "-H", "Connect-Protocol-Version: 1",
            "-H", "Content-Type: application/json", "-H", f"conch-init-token: {server.token}",
            "--data", json.dumps(body)]
    if http2:
        args.insert(0, "--http2-prior-knowledge")
    r = curl(*args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_curl_examples(server, client, http2):
    pid, t = start_bg(client, {"cmd": "cat", "stdinOpen": True, "tag": f"curl-{int(http2)}"})
    sel = {"tag": f"curl-{int(http2)}"}
    assert curl_json(server, "SendInput", {"process": sel, "input": {"stdin": "aGVsbG8K"}}, http2) == {}
    # StreamInput with curl: Connect envelopes in the body, chunked upload
    body = b"".join(envelope(json.dumps(m).encode()) for m in
                    [{"start": {"process": sel}}, {"data": {"input": {"stdin": "d29ybGQK"}}}])
    args = ["-X", "POST", f"{server.url}{PS}StreamInput", "-H", "Content-Type: application/connect+json",
            "-H", f"conch-init-token: {server.token}", "-H", "Transfer-Encoding: chunked", "--data-binary", "@-"]
    if http2:
        args = ["--http2-prior-knowledge"] + args[:-4] + ["--data-binary", "@-"]
    r = curl(*args, input=body)
    assert r.returncode == 0, r.stderr
    assert [(f, json.loads(p)) for f, p in parse_envelopes(r.stdout)] == [(0, {}), (2, {})]  # message, end
    assert curl_json(server, "CloseStdin", {"process": sel}, http2) == {}
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout") == b"hello\nworld\n"


# ---------------------------------------------------------------- grpcio
def test_grpc_stream_input(server, client):
    pid, t = start_bg(client, {"cmd": "cat", "stdinOpen": True})
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    md = [("conch-init-token", server.token)]
    try:
        stream = ch.stream_unary(PS + "StreamInput", request_serializer=pb.StreamInputRequest.SerializeToString,
                                 response_deserializer=pb.StreamInputResponse.FromString)
        send = ch.unary_unary(PS + "SendInput", request_serializer=pb.SendInputRequest.SerializeToString,
                              response_deserializer=pb.SendInputResponse.FromString)
        close = ch.unary_unary(PS + "CloseStdin", request_serializer=pb.CloseStdinRequest.SerializeToString,
                               response_deserializer=pb.CloseStdinResponse.FromString)
        sel = pb.ProcessSelector(pid=pid)
        send(pb.SendInputRequest(process=sel, input=pb.ProcessInput(stdin=b"0")), metadata=md, timeout=10)

        def msgs():
            yield pb.StreamInputRequest(start=pb.StreamInputStart(process=sel))
            for i in range(1, 10):
                yield pb.StreamInputRequest(data=pb.StreamInputData(input=pb.ProcessInput(stdin=str(i).encode())))
            yield pb.StreamInputRequest(data=pb.StreamInputData(input=pb.ProcessInput(stdin=b"x" * 300000)))
        assert stream(msgs(), metadata=md, timeout=10) == pb.StreamInputResponse()
        with pytest.raises(grpc.RpcError) as ei:
            stream(iter([pb.StreamInputRequest(data=pb.StreamInputData())]), metadata=md, timeout=10)
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ei.value.details() == "first stream input event must be start"
        with pytest.raises(grpc.RpcError) as ei:
            stream(iter([pb.StreamInputRequest(start=pb.StreamInputStart(process=sel)),
                         pb.StreamInputRequest(data=pb.StreamInputData(input=pb.ProcessInput(pty=b"x")))]),
                   metadata=md, timeout=10)
        assert ei.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ei.value.details() == "process has no pty"
        close(pb.CloseStdinRequest(process=sel), metadata=md, timeout=10)
    finally:
        ch.close()
    assert t.wait(lambda: t.ev.done, 10)
    assert t.ev.output("stdout") == b"0123456789" + b"x" * 300000


def test_grpc_web_send_input(server, client):
    """gRPC-Web (HTTP/1.1) SendInput and Update in the proto codec."""
    pid, t = start_bg(client, {"cmd": "sh", "args": ["-c", "read a; stty size; echo $a"], "pty": {}})
    for req, path in ((pb.UpdateRequest(process=pb.ProcessSelector(pid=pid), pty=pb.PTY(cols=33, rows=11)),
                       "Update"),
                      (pb.SendInputRequest(process=pb.ProcessSelector(pid=pid), input=pb.ProcessInput(pty=b"hi\n")),
                       "SendInput")):
        c = client.conn()
        c.request("POST", PS + path, body=envelope(req.SerializeToString()),
                  headers={"Content-Type": "application/grpc-web+proto", "conch-init-token": server.token})
        r = c.getresponse()
        envs = parse_envelopes(r.read())
        c.close()
        assert r.status == 200 and b"grpc-status:0" in envs[-1][1].replace(b" ", b""), envs
    assert t.wait(lambda: t.ev.done, 10)
    assert b"11 33" in t.ev.output("pty") and b"hi" in t.ev.output("pty")


# ---------------------------------------------------------------- the guide's terminal example
def test_guide_python_terminal(server):
    """The python3 terminal session of docs/guide/processes.md ("A terminal
    session in Python", moved there from the README), run as written (token
    and port substituted) on a PTY of our own, typed into like a keyboard."""
    import pty
    text = open(os.path.join(ROOT, "docs", "guide", "processes.md")).read()
    code = text.split("A terminal session in Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    code = code.replace('"conch-init-token": "T"', f'"conch-init-token": "{server.token}"')
    code = code.replace('"127.0.0.1", 4064', f'"127.0.0.1", {server.port}')
    assert str(server.port) in code and server.token in code
    pid, fd = pty.fork()
    if pid == 0:
        os.execv("/usr/bin/python3", ["python3", "-c", code])
    out = b""

    def until(pat, timeout=15):
        nonlocal out
        deadline = time.time() + timeout
        while pat not in out and time.time() < deadline:
            import select
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    out += os.read(fd, 65536)
                except OSError:
                    break
        assert pat in out, out[-500:]
    try:
        time.sleep(1)
        os.write(fd, b"echo readme-$((40+2))\r")
        until(b"readme-42")
        os.write(fd, b"exit\r")
        deadline = time.time() + 15
        while time.time() < deadline:
            p, st = os.waitpid(pid, os.WNOHANG)
            if p:
                break
            try:
                os.read(fd, 65536)
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise AssertionError("the example did not end with the shell")
        assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st
    finally:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
        os.close(fd)
