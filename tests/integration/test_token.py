"""The agent token where it belongs (api.md §4 and §9).

* `serve --token X` / `--token=X` / `CONCH_INIT_TOKEN=X`: X is in neither
  /proc/<pid>/cmdline nor /proc/<pid>/environ of the agent, and a started
  process's environment has neither the variable nor the value.
* A token checked for the whole life of what it opened: after an init
  message (`serve --init-listen`) replaced the token, the streams opened
  with the old one — ProcessService StartProcess (background and
  foreground) and Connect, WatchDir, an upload (PostFileStream) in
  progress — end with `unauthenticated` "agent token was replaced" (the
  upload's temp file gone), over HTTP/1.1 and h2c; keep-alive connections
  of the old token are closed (HTTP/1.1: at once when idle, after the
  exchange when busy; h2c: GOAWAY, then close once their streams ended —
  a unary call in flight finishes first); the processes live on; the new
  token works and the old one gets 401.
"""
import json
import os
import socket
import struct
import sys
import time

import pytest

import agent_pb2 as pb
from conch import Client, envelope, parse_envelopes
from conftest import ROOT, Server, sanitizer_report
from files_util import temp_leftovers
from h2conn import H2Client

sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import initpeer  # noqa: E402

PS = "/pb.ProcessService/"
FS = "/pb.FileService/"
REPLACED = {"code": "unauthenticated", "message": "agent token was replaced"}


def poll(cond, timeout=10.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.02)
    return cond()


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def stop_checked(srv):
    log = srv.stop()
    assert sanitizer_report(log) is None, sanitizer_report(log)
    return log


# ---------------------------------------------------------------- (b) where the token is not

def proc_bytes(pid, what):
    with open(f"/proc/{pid}/{what}", "rb") as f:
        return f.read()


def child_env(srv, token):
    """What a started process sees of its environment: /proc/self/environ
    and `env`, both."""
    c = Client(srv.url, token)
    out = b""
    for cmd in (["cat", "/proc/self/environ"], ["env"]):
        st, msgs, end = c.stream(PS + "StartProcess", [{"cmd": cmd[0], "args": cmd[1:]}])
        assert st == 200 and end == {}, (st, end)
        for m in msgs:
            if "data" in m and "stdout" in m["data"]:
                out += __import__("base64").b64decode(m["data"]["stdout"])
    assert b"PATH=" in out, out  # it did print an environment
    return out


@pytest.mark.parametrize("form", ["separate", "equals"])
def test_token_argument_is_not_in_cmdline(form):
    tok = "argtok-" + os.urandom(12).hex()
    arg = ["--token", tok] if form == "separate" else ["--token=" + tok]
    srv = Server(token="", extra_args=arg, name="token-arg")
    try:
        cmdline = proc_bytes(srv.proc.pid, "cmdline")
        assert tok.encode() not in cmdline, cmdline
        assert b"--token" in cmdline  # the option is there, its value is not
        assert b"x" * len(tok) in cmdline
        c = Client(srv.url, tok)  # the copy the agent kept is the whole token
        st, body, _ = c.unary(PS + "List", {})
        assert st == 200, body
        env = child_env(srv, tok)
        assert tok.encode() not in env and b"CONCH_INIT_TOKEN" not in env, env
    finally:
        stop_checked(srv)


def test_token_from_environment_is_not_in_environ():
    tok = "envtok-" + os.urandom(12).hex()
    srv = Server(token="", env={"CONCH_INIT_TOKEN": tok}, name="token-env")
    try:
        environ = proc_bytes(srv.proc.pid, "environ")
        assert tok.encode() not in environ, environ
        # the exec-time block keeps the entry's place, its value overwritten
        assert b"CONCH_INIT_TOKEN=" + b"x" * len(tok) in environ.split(b"\0")
        c = Client(srv.url, tok)
        st, body, _ = c.unary(PS + "List", {})
        assert st == 200, body
        env = child_env(srv, tok)
        assert tok.encode() not in env and b"CONCH_INIT_TOKEN" not in env, env
        assert tok.encode() not in proc_bytes(srv.proc.pid, "cmdline")
    finally:
        stop_checked(srv)


def test_token_file_is_read_and_nothing_shows(tmp_path):
    tok = "filetok-" + os.urandom(12).hex()
    (tmp_path / "tok").write_text(tok + "\n")
    srv = Server(token="", extra_args=["--token-file", str(tmp_path / "tok")], name="token-file")
    try:
        for what in ("cmdline", "environ"):
            assert tok.encode() not in proc_bytes(srv.proc.pid, what)
        st, body, _ = Client(srv.url, tok).unary(PS + "List", {})
        assert st == 200, body
    finally:
        stop_checked(srv)


# ---------------------------------------------------------------- (a) a replaced token

@pytest.fixture(scope="module")
def isrv(tmp_path_factory):
    """A server whose token comes from init messages."""
    sock = str(tmp_path_factory.mktemp("init") / "init.sock")
    srv = Server(token="", extra_args=["--init-listen", "unix:" + sock], name="token-init")
    srv.sock = sock
    set_token(srv, "first-" + os.urandom(8).hex())
    yield srv
    stop_checked(srv)


def set_token(srv, tok):
    """An init message with tok (the first one, or one replacing the
    token: answered once the old token's streams were ended)."""
    req = {"version": 1, "sandboxID": "sb-token", "agentToken": tok,
           "network": {"guestIP": "192.168.100.21", "prefixLength": 24, "gateway": "192.168.100.2"}}
    resp, _ = initpeer.until_ready("unix:" + srv.sock, req, 10)
    assert resp and json.loads(resp)["status"] == "ready", resp
    srv.token = tok


def new_token(srv):
    old = srv.token
    set_token(srv, "next-" + os.urandom(8).hex())
    return old


class H1:
    """One HTTP/1.1 connection on a raw socket: a request, then the
    response read as it comes (chunked or Content-Length)."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.buf = b""
        self.head = None
        self.chunked = False
        self.left = 0       # bytes left in the current chunk / the body
        self.body_done = False

    def send(self, data):
        self.s.sendall(data)

    def request(self, path, headers, body=b"", chunked=False):
        h = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        if chunked:
            h += "Transfer-Encoding: chunked\r\n"
        else:
            h += f"Content-Length: {len(body)}\r\n"
        self.send(f"POST {path} HTTP/1.1\r\nHost: x\r\n{h}\r\n".encode() +
                  (b"%x\r\n%s\r\n" % (len(body), body) if chunked and body else body))
        self.head = None
        self.body_done = False

    def _fill(self):
        d = self.s.recv(65536)
        if not d:
            raise EOFError("connection closed")
        self.buf += d

    def _take(self, n):
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _line(self):
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def read_head(self):
        while b"\r\n\r\n" not in self.buf:
            self._fill()
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        self.status = int(lines[0].split()[1])
        self.head = {k.lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines[1:])}
        self.chunked = self.head.get("transfer-encoding") == "chunked"
        self.left = 0 if self.chunked else int(self.head.get("content-length", "0"))
        return self.status

    def body(self, n):
        """n bytes of the response body."""
        out = b""
        while len(out) < n:
            if self.chunked and self.left == 0:
                size = int(self._line(), 16)
                if size == 0:
                    self._line()
                    raise EOFError("body ended")
                self.left = size
            k = min(n - len(out), self.left)
            out += self._take(k)
            self.left -= k
            if self.chunked and self.left == 0:
                assert self._take(2) == b"\r\n"
        return out

    def envelope(self):
        flags, n = struct.unpack(">BI", self.body(5))
        return flags, self.body(n)

    def until_end(self, timeout=10.0):
        """Messages up to the end-of-stream one: (messages, end JSON)."""
        msgs = []
        deadline = time.time() + timeout
        while True:
            assert time.time() < deadline, f"the stream did not end in {timeout} s"
            flags, p = self.envelope()
            if flags & 2:
                if self.chunked:  # the terminal chunk
                    assert self._line() == b"0" and self._line() == b""
                return msgs, json.loads(p)
            msgs.append(p)

    def closed(self, timeout=5.0):
        """The server closed the connection (EOF or reset) within timeout."""
        self.s.settimeout(timeout)
        try:
            while True:
                d = self.s.recv(65536)
                if not d:
                    return True
                self.buf += d
        except ConnectionResetError:
            return True
        except socket.timeout:
            return False

    def close(self):
        self.s.close()


def hdrs(token, ctype="application/connect+json"):
    h = {"Content-Type": ctype, "conch-init-token": token}
    if ctype == "application/json":
        h["Connect-Protocol-Version"] = "1"
    return h


def start_ticker(srv, tag):
    """A background process printing forever; its pid."""
    c = Client(srv.url, srv.token)
    st, body, _ = c.unary(PS + "List", {})
    assert st == 200, body
    h = H1(srv.port)
    h.request(PS + "StartProcess", hdrs(srv.token), envelope(json.dumps(
        {"cmd": "sh", "args": ["-c", "while :; do echo tick; sleep 0.05; done"],
         "background": True, "tag": tag}).encode()))
    assert h.read_head() == 200
    flags, p = h.envelope()
    pid = json.loads(p)["start"]["pid"]
    return h, pid


def listed(srv, token):
    st, body, _ = Client(srv.url, token).unary(PS + "List", {})
    assert st == 200, body
    return {p.get("tag", ""): p for p in body.get("processes", [])}


def late_reader(srv, tag, flag):
    """A background process that reads its stdin only once flag exists:
    (its StartProcess stream, its pid)."""
    h = H1(srv.port)
    h.request(PS + "StartProcess", hdrs(srv.token), envelope(json.dumps(
        {"cmd": "sh", "args": ["-c", f"while [ ! -e {flag} ]; do sleep 0.02; done; cat > /dev/null"],
         "background": True, "tag": tag, "stdinOpen": True}).encode()))
    assert h.read_head() == 200
    return h, json.loads(h.envelope()[1])["start"]["pid"]


def stdin_queued(pid):
    """Bytes waiting in the process's stdin pipe: a SendInput in flight."""
    import fcntl
    import termios
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NONBLOCK)
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    finally:
        os.close(fd)


def kill_tag(srv, tag):
    st, body, _ = Client(srv.url, srv.token).unary(PS + "SendSignal", {"process": {"tag": tag}, "signal": 9})
    assert st == 200, body


def test_replaced_token_ends_http1_streams_and_keepalive(isrv, tmp_path):
    srv, tok = isrv, isrv.token
    wdir = tmp_path / "watched"
    wdir.mkdir()
    updir = tmp_path / "up"
    updir.mkdir()
    # a background process (its StartProcess stream open) and a Connect to it
    start, bg_pid = start_ticker(srv, "h1-ticker")
    con = H1(srv.port)
    con.request(PS + "Connect", hdrs(tok), envelope(json.dumps({"process": {"tag": "h1-ticker"}}).encode()))
    assert con.read_head() == 200
    con.envelope()  # start
    assert con.envelope()[0] == 0  # output flows
    # a foreground process: its starter's stream ends, the process lives on
    fg = H1(srv.port)
    fg.request(PS + "StartProcess", hdrs(tok), envelope(json.dumps({"cmd": "sleep", "args": ["30"]}).encode()))
    assert fg.read_head() == 200
    fg_pid = json.loads(fg.envelope()[1])["start"]["pid"]
    # WatchDir
    watch = H1(srv.port)
    watch.request(FS + "WatchDir", hdrs(tok), envelope(json.dumps({"path": str(wdir)}).encode()))
    assert watch.read_head() == 200
    assert "start" in json.loads(watch.envelope()[1])
    # an upload in progress: its temp file exists
    target = updir / "big.bin"
    up = H1(srv.port)
    first = envelope(pb.FileChunk(filepath=str(target), content=os.urandom(200_000)).SerializeToString())
    up.request(FS + "PostFileStream", hdrs(tok, "application/connect+proto"), first, chunked=True)
    assert poll(lambda: temp_leftovers(str(updir), srv.proc.pid)), "the upload did not start"
    # an idle keep-alive connection that made a unary call with the token
    idle = H1(srv.port)
    idle.request(PS + "List", hdrs(tok, "application/json"), b"{}")
    assert idle.read_head() == 200
    idle.body(int(idle.head["content-length"]))

    old = new_token(srv)
    assert old == tok

    for h in (start, con, fg, watch):
        _, end = h.until_end()
        assert end == {"error": REPLACED}, end
        assert h.closed(), "the stream's connection stays open"
    assert up.read_head() == 200
    _, end = up.until_end()
    assert end == {"error": REPLACED}, end
    assert not temp_leftovers(str(updir), srv.proc.pid)
    assert not target.exists()
    up.send(b"0\r\n\r\n")  # the client ends its body: then the connection closes
    assert up.closed()
    # the idle keep-alive connection was closed
    assert idle.closed(2)
    for h in (start, con, fg, watch, up, idle):
        h.close()
    # the processes live on; the new token works, the old one does not
    assert alive(bg_pid) and alive(fg_pid)
    assert listed(srv, srv.token)["h1-ticker"]["running"] is True
    st, body, _ = Client(srv.url, old).unary(PS + "List", {})
    assert st == 401 and body["message"] == "agent token is invalid", body
    kill_tag(srv, "h1-ticker")
    os.kill(fg_pid, 9)


def test_replaced_token_closes_busy_http1_connection_after_its_unary_call(isrv, tmp_path):
    """A unary call in flight finishes (SendInput to a child that reads only
    later), and its connection closes after the answer."""
    srv, tok = isrv, isrv.token
    flag = tmp_path / "read-now"
    h, pid = late_reader(srv, "h1-late-reader", flag)
    busy = H1(srv.port)
    data = __import__("base64").b64encode(b"z" * (512 << 10)).decode()
    busy.request(PS + "SendInput", hdrs(tok, "application/json"),
                 json.dumps({"process": {"tag": "h1-late-reader"}, "input": {"stdin": data}}).encode())
    assert poll(lambda: stdin_queued(pid)), "the SendInput call did not start"
    new_token(srv)
    busy.s.settimeout(0.3)
    with pytest.raises(socket.timeout):  # in flight: no answer yet
        busy.read_head()
    busy.s.settimeout(10)
    flag.touch()
    assert busy.read_head() == 200  # answered once the child read it all
    assert busy.body(int(busy.head["content-length"])) == b"{}"
    assert busy.head.get("connection") == "close"  # answered after the replacement: says so
    assert busy.closed()
    _, end = h.until_end()
    assert end == {"error": REPLACED}, end
    for x in (h, busy):
        x.close()
    kill_tag(srv, "h1-late-reader")


def h2_end(c, sid):
    envs = H2Client.envelopes(c.streams[sid].body)
    assert envs and envs[-1][0] & 2, envs
    return json.loads(envs[-1][1])


def test_replaced_token_ends_h2c_streams_then_goaway(isrv, tmp_path):
    srv, tok = isrv, isrv.token
    wdir = tmp_path / "watched"
    wdir.mkdir()
    updir = tmp_path / "up"
    updir.mkdir()
    c = H2Client("127.0.0.1", srv.port)
    sp = c.connect_stream(PS + "StartProcess", [pb.StartProcessRequest(
        cmd="sh", args=["-c", "while :; do echo tick; sleep 0.05; done"], background=True,
        tag="h2-ticker").SerializeToString()], tok)
    fg = c.connect_stream(PS + "StartProcess", [pb.StartProcessRequest(cmd="sleep", args=["30"]).SerializeToString()], tok)

    def events(sid):
        return [pb.ProcessEvent.FromString(p) for f, p in H2Client.envelopes(c.streams[sid].body) if f == 0]

    def pump_until(cond, timeout=10):
        deadline = time.time() + timeout
        while not cond() and time.time() < deadline:
            c.pump(0.05)
        return cond()

    assert pump_until(lambda: len(events(sp)) >= 2 and events(fg))
    fg_pid = events(fg)[0].start.pid
    bg_pid = events(sp)[0].start.pid
    con = c.connect_stream(PS + "Connect", [pb.ConnectProcessRequest(
        process=pb.ProcessSelector(tag="h2-ticker")).SerializeToString()], tok)
    watch = c.connect_stream(FS + "WatchDir", [pb.WatchDirRequest(path=str(wdir)).SerializeToString()], tok)
    gwatch = c.request("POST", FS + "WatchDir", {"content-type": "application/grpc", "te": "trailers",
                                                 "conch-init-token": tok},
                       H2Client.envelope(pb.WatchDirRequest(path=str(wdir)).SerializeToString()))
    target = updir / "big.bin"
    up = c.connect_stream(FS + "PostFileStream", [pb.FileChunk(filepath=str(target), content=os.urandom(60_000))
                                                  .SerializeToString()], tok, end_stream=False)
    assert pump_until(lambda: len(events(con)) >= 2 and c.streams[watch].body and c.streams[gwatch].body and
                      temp_leftovers(str(updir), srv.proc.pid)), "the streams did not start"
    # a unary call in flight on the same connection: SendInput to a child
    # that reads only later; it finishes, the connection closes after it
    flag = tmp_path / "read-now"
    h, reader = late_reader(srv, "h2-late-reader", flag)
    si = c.connect_unary(PS + "SendInput", pb.SendInputRequest(
        process=pb.ProcessSelector(tag="h2-late-reader"),
        input=pb.ProcessInput(stdin=b"z" * (512 << 10))).SerializeToString(), tok, ctype="application/proto")
    assert pump_until(lambda: stdin_queued(reader)), "the SendInput call did not start"
    # an idle h2c connection that made a unary call with the token
    idle = H2Client("127.0.0.1", srv.port)
    idle.wait(idle.connect_unary(PS + "List", b"{}", tok))

    new_token(srv)

    c.wait(sp, fg, con, watch, up, gwatch)
    for sid in (sp, fg, con, watch, up):
        assert h2_end(c, sid) == {"error": REPLACED}, sid
    gt = c.streams[gwatch].trailers  # gRPC: the status in the trailers
    assert gt.get("grpc-status") == "16" and gt.get("grpc-message") == "agent token was replaced", gt
    assert not temp_leftovers(str(updir), srv.proc.pid)
    assert not target.exists()
    # no new stream on it, whatever its token: refused (not processed)
    ref = c.connect_unary(PS + "List", b"{}", srv.token)
    c.wait(ref)
    assert c.streams[ref].reset == 7 and c.streams[ref].status is None  # REFUSED_STREAM
    # the upload's stream (the client has not ended it) and the unary call
    # are still open: no GOAWAY yet
    assert c.terminated is None and not c.closed
    c.end(up)  # the client ends its upload
    c.pump(0.2)
    assert not c.streams[si].done and c.terminated is None and not c.closed
    flag.touch()
    c.wait(si)  # the unary call finishes, after its child read
    assert c.streams[si].status == 200 and c.streams[si].reset is None
    assert pump_until(lambda: c.closed, 5), "the connection stays open"
    assert c.terminated is not None and c.terminated.error_code == 0  # GOAWAY NO_ERROR, then close
    # the idle one: GOAWAY and closed
    deadline = time.time() + 5
    while not idle.closed and time.time() < deadline:
        idle.pump(0.1)
    assert idle.terminated is not None and idle.closed
    # the processes live on; the new token works
    assert alive(bg_pid) and alive(fg_pid)
    assert listed(srv, srv.token)["h2-ticker"]["running"] is True
    _, end = h.until_end()
    assert end == {"error": REPLACED}
    for x in (c, idle, h):
        x.close()
    kill_tag(srv, "h2-ticker")
    kill_tag(srv, "h2-late-reader")
    os.kill(fg_pid, 9)


def test_same_token_again_ends_nothing(isrv):
    """An init message that repeats the token (a revalidation) leaves its
    streams and connections alone."""
    srv, tok = isrv, isrv.token
    h, pid = start_ticker(srv, "same-ticker")
    set_token(srv, tok)
    flags, _ = h.envelope()
    flags, _ = h.envelope()
    assert flags == 0  # still output
    st, body, _ = Client(srv.url, tok).unary(PS + "List", {})
    assert st == 200
    kill_tag(srv, "same-ticker")
    _, end = h.until_end()
    assert end == {}
    h.close()
    assert poll(lambda: not alive(pid), 5)
