"""ProcessService end to end (api.md §6): the seed examples over
HTTP/1.1 (JSON and proto) and HTTP/2 (curl --http2-prior-knowledge), and
the behaviour tests — streaming, signals, timeouts, background fan-out,
flow control, retention, keepalives, clean children, the reaper.
"""
import json
import os
import re
import signal
import socket
import struct
import threading
import time

import pytest

from conch import Client, b64, curl, envelope, parse_envelopes, unb64
from conftest import ROOT, Server, free_port, sanitizer_report, status_kib

import agent_pb2 as pb  # noqa: E402  (conftest makes it when run alone)

SP = "/pb.ProcessService/StartProcess"
CONNECT = "/pb.ProcessService/Connect"
LIST = "/pb.ProcessService/List"
SIGNAL = "/pb.ProcessService/SendSignal"


# ---------------------------------------------------------------- helpers
def norm_json(m):
    if "start" in m:
        return ("start", m["start"].get("pid", 0))
    if "data" in m:
        (k, v), = ((k, v) for k, v in m["data"].items() if k != "offset")  # offset: test_replay.py
        return ("data", k, unb64(v))
    if "end" in m:
        e = m["end"]
        return ("end", e.get("exitCode", 0), e.get("exited", False), e.get("status", ""), e.get("error", ""))
    if "keepalive" in m:
        return ("keepalive",)
    raise AssertionError(f"unknown event {m}")


def norm_pb(raw):
    ev = pb.ProcessEvent()
    ev.ParseFromString(raw)
    w = ev.WhichOneof("event")
    if w == "start":
        return ("start", ev.start.pid)
    if w == "data":
        k = ev.data.WhichOneof("output")
        return ("data", k, getattr(ev.data, k))
    if w == "end":
        e = ev.end
        return ("end", e.exit_code, e.exited, e.status, e.error)
    if w == "keepalive":
        return ("keepalive",)
    raise AssertionError("empty event")


class Stream:
    """One server-streaming call over HTTP/1.1, read envelope by envelope."""

    def __init__(self, client, path, req, timeout_ms=None, proto=False, sock_timeout=60):
        self.proto = proto
        self.c = client.conn(timeout=sock_timeout)
        h = client.headers(ctype="application/connect+proto" if proto else "application/connect+json")
        if timeout_ms is not None:
            h["Connect-Timeout-Ms"] = str(timeout_ms)
        if proto:
            payload = req.SerializeToString()
        else:
            payload = json.dumps(req).encode()
        self.c.request("POST", path, body=envelope(payload), headers=h)
        self.r = self.c.getresponse()
        self.status = self.r.status
        self.end = None

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.r.read(n - len(buf))
            if not chunk:
                raise EOFError("stream cut")
            buf += chunk
        return buf

    def next(self):
        """Next event tuple, or None at end of stream (self.end = trailer JSON)."""
        flags, n = struct.unpack(">BI", self._read(5))
        body = self._read(n)
        if flags & 2:
            self.end = json.loads(body)
            return None
        return norm_pb(body) if self.proto else norm_json(json.loads(body))

    def all(self):
        out = []
        while True:
            e = self.next()
            if e is None:
                return out
            out.append(e)

    def close(self):
        self.c.close()


def run(client, req, timeout_ms=None, proto=False):
    """A whole foreground call → (events, trailer)."""
    if proto:
        m = pb.StartProcessRequest()
        for k, v in req.items():
            if k == "env":
                m.env.update(v)
            elif k == "args":
                m.args.extend(v)
            elif k == "pty":
                if v is not None:
                    m.pty.SetInParent()
                    m.pty.cols = v.get("cols", 0)
                    m.pty.rows = v.get("rows", 0)
            elif k == "stdin":
                m.stdin = v if isinstance(v, bytes) else unb64(v)
            else:
                setattr(m, k, v)
        req = m
    s = Stream(client, SP, req, timeout_ms=timeout_ms, proto=proto)
    assert s.status == 200
    try:
        ev = s.all()
    finally:
        s.close()
    return ev, s.end


def output(events, kind="stdout"):
    return b"".join(e[2] for e in events if e[0] == "data" and e[1] == kind)


def end_of(events):
    ends = [e for e in events if e[0] == "end"]
    assert len(ends) == 1, events
    return ends[0]


def check_ok(events, trailer):
    assert trailer == {}, trailer
    assert events[0][0] == "start" and events[0][1] > 0
    assert events[-1] == ("end", 0, True, "exited", ""), events[-1]


def err_of(trailer):
    return trailer["error"]["code"], trailer["error"]["message"]


def list_procs(client):
    st, body, _ = client.unary(LIST, {})
    assert st == 200, body
    return body.get("processes", [])


def send_signal(client, sel, sig):
    return client.unary(SIGNAL, {"process": sel, "signal": sig})


def start_bg(client, req, timeout_ms=None):
    """Start a background process, read its start event, hang up."""
    req = dict(req, background=True)
    s = Stream(client, SP, req, timeout_ms=timeout_ms)
    assert s.status == 200
    ev = s.next()
    if ev is None:
        s.close()
        raise AssertionError(f"start failed: {s.end}")
    assert ev[0] == "start", ev
    s.close()
    return ev[1]


def wait_for(pred, timeout=10, step=0.05):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


def proc_state(pid):
    """'Z', 'S', … or None when the pid is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            s = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return s[s.rindex(")") + 2]


def gone(pid):
    return proc_state(pid) in (None, "Z")


def proc_stats():
    """(pid, state, ppid, pgid) of every process now in /proc."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    s = f.read()
            except OSError:
                continue
            fields = s[s.rindex(")") + 2:].split()
            out.append((int(d), fields[0], int(fields[1]), int(fields[2])))
    return out


def children_of(pid):
    return [(p, state) for p, state, ppid, _ in proc_stats() if ppid == pid]


def group_members(pgid):
    return [p for p, state, _, g in proc_stats() if g == pgid and state != "Z"]


@pytest.fixture()
def client(server):
    return Client(server.url, server.token)


def curl_stream(server, path, req, http2=False, extra=()):
    body = envelope(json.dumps(req).encode())
    args = ["-X", "POST", server.url + path,
            "-H", "Content-Type: application/connect+json",
            "-H", f"conch-init-token: {server.token}",
            "--data-binary", "@-", *extra]
    if http2:
        args.insert(0, "--http2-prior-knowledge")
    r = curl(*args, input=body)
    assert r.returncode == 0, r.stderr
    envs = parse_envelopes(r.stdout)
    events = [norm_json(json.loads(p)) for f, p in envs if not f & 2]
    trailer = [json.loads(p) for f, p in envs if f & 2]
    assert len(trailer) == 1
    return events, trailer[0]


def curl_unary(server, path, body, http2=False):
    args = ["-X", "POST", server.url + path,
            "-H", "Connect-Protocol-Version: 1",
            "-H", "Content-Type: application/json",
            "-H", f"conch-init-token: {server.token}",
            "--data", json.dumps(body), "-w", "\n%{http_code}"]
    if http2:
        args.insert(0, "--http2-prior-knowledge")
    r = curl(*args)
    text, code = r.stdout.decode().rsplit("\n", 1)
    return int(code), json.loads(text)


# ---------------------------------------------------------------- seed examples
SEED_HELLO = {"cmd": "python3", "args": ["-c", "print('hello')"], "cwd": "/tmp",
              "env": {"DEMO_KEY": "demo-value"}, "background": False, "pty": None}


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_seed_run_hello(client, proto):
    ev, tr = run(client, SEED_HELLO, proto=proto)
    check_ok(ev, tr)
    assert output(ev) == b"hello\n"


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2"])
def test_seed_run_hello_curl(server, http2):
    ev, tr = curl_stream(server, SP, SEED_HELLO, http2=http2)
    check_ok(ev, tr)
    assert output(ev) == b"hello\n"


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_seed_content_script(client, tmpdir_abs, proto):
    ev, tr = run(client, {"cmd": "python3", "content": "print('hello from content')", "cwd": tmpdir_abs,
                          "background": False, "pty": None}, proto=proto)
    check_ok(ev, tr)
    assert output(ev) == b"hello from content\n"
    # the script file is gone once the process ended
    assert wait_for(lambda: not [f for f in os.listdir(tmpdir_abs) if f.startswith("conch-script-")], 5)


def test_seed_content_request_json(server, tmpdir_abs):
    req = {"cmd": "python3", "args": [], "cwd": tmpdir_abs, "env": {"DEMO_KEY": "demo-value"},
           "content": "import os\nprint(\"hello from content\")\nprint(os.environ.get(\"DEMO_KEY\", \"\"))",
           "background": False, "pty": None}
    for http2 in (False, True):
        ev, tr = curl_stream(server, SP, req, http2=http2)
        check_ok(ev, tr)
        assert output(ev) == b"hello from content\ndemo-value\n"


def test_seed_stdin_request_json(server):
    req = {"cmd": "python3", "args": ["-c", "import sys; print(sys.stdin.read(), end='')"], "cwd": "/tmp",
           "env": {"DEMO_KEY": "demo-value"}, "content": "", "background": False, "pty": None,
           "stdin": "aGVsbG8K"}
    for http2 in (False, True):
        ev, tr = curl_stream(server, SP, req, http2=http2)
        check_ok(ev, tr)
        assert output(ev) == b"hello\n"


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_seed_stdin_binary(client, proto):
    ev, tr = run(client, {"cmd": "python3", "args": ["-c", "import sys; print(sys.stdin.buffer.read().hex())"],
                          "stdin": b"\x00\xff" if proto else b64(b"\x00\xff")}, proto=proto)
    check_ok(ev, tr)
    assert output(ev) == b"00ff\n"
    ev, tr = run(client, {"cmd": "python3", "args": ["-c", 'import sys; print(sys.stdin.read(), end="")'],
                          "stdin": b"hello from stdin\n" if proto else b64(b"hello from stdin\n")}, proto=proto)
    assert output(ev) == b"hello from stdin\n"


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_seed_timeout(client, proto):
    t0 = time.time()
    ev, tr = run(client, {"cmd": "sleep", "args": ["10"]}, timeout_ms=200, proto=proto)
    took = time.time() - t0
    assert err_of(tr) == ("deadline_exceeded", "process execution timed out: context deadline exceeded")
    assert [e[0] for e in ev] == ["start"]  # no end event
    assert took < 3
    assert wait_for(lambda: gone(ev[0][1]), 5)


def test_seed_quickstart_and_misc(client):
    ev, tr = run(client, {"cmd": "printf", "args": ["hello Conch\n"]})
    check_ok(ev, tr)
    assert output(ev) == b"hello Conch\n"
    ev, tr = run(client, {"cmd": "python3", "content": 'print("Hello")'})
    check_ok(ev, tr)
    assert output(ev) == b"Hello\n"
    os.makedirs("/root", exist_ok=True)
    ev, tr = run(client, {"cmd": "ls", "args": ["-l", "/root"]})
    check_ok(ev, tr)
    ev, tr = run(client, {"cmd": "python3", "content": "import os; print(os.getcwd())", "cwd": "/tmp"})
    assert output(ev) == b"/tmp\n"
    with open("/tmp/app.py", "w") as f:
        f.write('print("Hello")')
    ev, tr = run(client, {"cmd": "python3", "args": ["/tmp/app.py"]})
    assert output(ev) == b"Hello\n"
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "echo $MY_VAR"], "env": {"MY_VAR": "conch_test"}})
    assert output(ev) == b"conch_test\n"
    # FAQ: no shell, $HOME stays literal; through sh it is /root
    ev, tr = run(client, {"cmd": "echo", "args": ["$HOME"]})
    assert output(ev) == b"$HOME\n"
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "echo $HOME"]})
    assert output(ev) == b"/root\n"
    # default cwd is HOME
    ev, tr = run(client, {"cmd": "pwd"})
    assert output(ev) == b"/root\n"


def test_seed_stream_callbacks(client):
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "printf foo; printf bar >&2"]})
    check_ok(ev, tr)
    assert output(ev) == b"foo"
    assert output(ev, "stderr") == b"bar"


@pytest.mark.parametrize("proto", [False, True], ids=["json", "proto"])
def test_seed_invalid_command(client, proto):
    ev, tr = run(client, {"cmd": "invalid_command"}, proto=proto)
    assert ev == []
    assert err_of(tr) == ("invalid_argument",
                          'failed to execute process: exec: "invalid_command": executable file not found in $PATH')


def test_seed_nonzero_exit(client):
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "echo oops >&2; exit 3"]})
    assert tr == {}
    assert end_of(ev) == ("end", 3, True, "error", "exit status 3")


def test_seed_background_http_server(client, server):
    port = free_port()
    pid = start_bg(client, {"cmd": "python3", "args": ["-m", "http.server", str(port)], "cwd": "/tmp",
                            "env": {}, "tag": "http-srv", "pty": None}, timeout_ms=0)
    procs = list_procs(client)
    mine = [p for p in procs if p["tag"] == "http-srv"]
    assert len(mine) == 1
    p = mine[0]
    assert p["pid"] == pid and p["running"] is True and p["exitCode"] == -1
    assert p["config"]["cmd"] == "python3"
    assert p["config"]["args"] == ["-m", "http.server", str(port)]
    assert p["config"]["cwd"] == "/tmp"
    assert "pty" not in p["config"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", p["startedAt"])
    # tag held by a running process
    s = Stream(client, SP, {"cmd": "true", "background": True, "tag": "http-srv"})
    assert s.all() == []
    assert err_of(s.end) == ("already_exists", "background process tag already exists: http-srv")
    # curl (seed 001) List and SendSignal, HTTP/1.1 and h2
    code, body = curl_unary(server, LIST, {}, http2=True)
    assert code == 200 and any(x["tag"] == "http-srv" for x in body["processes"])
    code, body = curl_unary(server, SIGNAL, {"process": {"tag": "http-srv"}, "signal": 15})
    assert (code, body) == (200, {})
    assert wait_for(lambda: not [x for x in list_procs(client) if x["tag"] == "http-srv"], 10)
    # kill(tag="http-srv") once more → False (not_found); tag reusable
    st, body, _ = send_signal(client, {"tag": "http-srv"}, 15)
    assert st == 404 and body == {"code": "not_found", "message": 'process tag "http-srv" not found'}
    st, body, _ = send_signal(client, {"tag": "does-not-exist"}, 15)
    assert st == 404 and body["code"] == "not_found"


def test_seed_heartbeat_connect(client):
    script = """import time
time.sleep(1)  # let Connect subscribe first
print("service-ready", flush=True)
count = 0
while True:
    count += 1
    print(f"heartbeat {count}", flush=True)
    time.sleep(1)
"""
    pid = start_bg(client, {"cmd": "python3", "content": script, "tag": "heartbeat-worker"}, timeout_ms=0)
    procs = [p for p in list_procs(client) if p["tag"] == "heartbeat-worker"]
    assert procs and re.fullmatch(r"/root/conch-script-[a-z0-9]+\.py", procs[0]["config"]["args"][0])
    s = Stream(client, CONNECT, {"process": {"tag": "heartbeat-worker"}})
    assert s.next() == ("start", pid)
    got = b""
    while b"heartbeat 1\n" not in got:
        e = s.next()
        assert e[0] == "data" and e[1] == "stdout"
        got += e[2]
    assert b"service-ready\n" in got
    s.close()  # disconnect(): the process keeps running
    time.sleep(0.2)
    assert [p for p in list_procs(client) if p["pid"] == pid]
    s2 = Stream(client, CONNECT, {"process": {"pid": pid}})
    assert s2.next() == ("start", pid)
    st, body, _ = send_signal(client, {"tag": "heartbeat-worker"}, 2)
    assert (st, body) == (200, {})
    ev = s2.all()
    e = end_of(ev)
    # Python dies of the re-raised SIGINT after its KeyboardInterrupt traceback
    assert e[1:] == (-1, True, "error", "signal: interrupt")
    assert s2.end == {}
    s2.close()
    # its script is removed
    assert wait_for(lambda: not os.path.exists(procs[0]["config"]["args"][0]), 5)


def test_seed_short_job_connect_wait_kill(client):
    pid = start_bg(client, {"cmd": "sh", "args": ["-c", "echo started; sleep 10; echo finished"],
                            "tag": "short-job"})
    s = Stream(client, CONNECT, {"process": {"tag": "short-job"}})
    assert s.next() == ("start", pid)
    st, body, _ = send_signal(client, {"tag": "short-job"}, 15)
    assert st == 200
    ev = s.all()
    assert end_of(ev)[1:] == (-1, True, "error", "signal: terminated")
    s.close()


def test_seed_list_shell(client):
    pid = start_bg(client, {"cmd": "/bin/sh", "args": ["-c", "sleep 1; echo background-ready"],
                            "tag": "docs-background"})
    p = [x for x in list_procs(client) if x["pid"] == pid][0]
    assert (p["tag"], p["running"], p["config"]["cmd"], p["config"]["args"]) == \
        ("docs-background", True, "/bin/sh", ["-c", "sleep 1; echo background-ready"])
    assert wait_for(lambda: not [x for x in list_procs(client) if x["pid"] == pid], 10)


# ---------------------------------------------------------------- validation
def test_validation_order_and_texts(client, tmpdir_abs):
    def err(req):
        ev, tr = run(client, req)
        assert ev == [], ev
        return err_of(tr)

    everything = {"cmd": "", "content": "x", "args": ["a"], "pty": {"cols": 70000, "rows": 70000},
                  "stdin": b64(b"x"), "cwd": tmpdir_abs + "/f/sub"}
    assert err(everything) == ("invalid_argument", "content and args cannot both be set")
    del everything["args"]
    assert err(everything) == ("invalid_argument", "stdin cannot be used with pty")
    del everything["stdin"]
    assert err(everything) == ("invalid_argument", "invalid pty size: pty cols must not exceed 65535")
    everything["pty"]["cols"] = 65535
    assert err(everything) == ("invalid_argument", "invalid pty size: pty rows must not exceed 65535")
    everything["pty"]["rows"] = 0
    open(tmpdir_abs + "/f", "w").close()
    assert err(everything) == ("invalid_argument",
                               f"failed to prepare working directory: mkdir {tmpdir_abs}/f: not a directory")
    everything["cwd"] = "/proc"
    code, msg = err(everything)
    assert code == "internal"
    assert re.fullmatch(r"failed to write script file: open /proc/conch-script-[a-z0-9]+\.py: .+", msg), msg
    everything["cwd"] = tmpdir_abs + "/new/dir"
    assert err(everything) == ("invalid_argument", "failed to execute process: command is required")
    assert os.path.isdir(tmpdir_abs + "/new/dir")  # mkdir -p happened (step 5 before 7)
    assert not os.listdir(tmpdir_abs + "/new/dir")  # the script was removed again
    s = Stream(client, SP, {"cmd": "", "background": True})
    assert s.all() == [] and err_of(s.end) == ("invalid_argument", "command is required")
    s = Stream(client, SP, {"cmd": "/nonexistent/x", "background": True})
    assert s.all() == [] and err_of(s.end) == (
        "invalid_argument", "failed to start background process: fork/exec /nonexistent/x: no such file or directory")
    assert err({"cmd": "/etc/passwd"}) == ("invalid_argument",
                                           "failed to execute process: fork/exec /etc/passwd: permission denied")
    # lookup uses the PATH of the child's environment
    assert err({"cmd": "ls", "env": {"PATH": "/nonexistent"}}) == (
        "invalid_argument", 'failed to execute process: exec: "ls": executable file not found in $PATH')


def test_connect_and_signal_validation(client):
    for path in (CONNECT, SIGNAL):
        body = {"process": {}, "signal": 15} if path == SIGNAL else {"process": {}}
        if path == CONNECT:
            s = Stream(client, CONNECT, body)
            assert s.all() == [] and err_of(s.end) == ("invalid_argument", "process pid or tag is required")
        else:
            st, b, _ = client.unary(SIGNAL, body)
            assert st == 400 and b == {"code": "invalid_argument", "message": "process pid or tag is required"}
    s = Stream(client, CONNECT, {"process": {"pid": 999999}})
    assert s.all() == [] and err_of(s.end) == ("not_found", "process pid 999999 not found")
    s = Stream(client, CONNECT, {"process": {"tag": "missing"}})
    assert s.all() == [] and err_of(s.end) == ("not_found", 'process tag "missing" not found')
    pid = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "sigval"})
    st, b, _ = send_signal(client, {"tag": "sigval"}, 0)
    assert (st, b) == (400, {"code": "invalid_argument", "message": "signal must not be zero"})
    st, b, _ = send_signal(client, {"tag": "sigval"}, 99)
    assert (st, b) == (400, {"code": "invalid_argument", "message": "invalid signal 99"})
    st, b, _ = send_signal(client, {"pid": pid, "tag": "ignored"}, 9)  # pid wins
    assert (st, b) == (200, {})
    assert wait_for(lambda: gone(pid), 5)


# ---------------------------------------------------------------- behaviour
def test_first_output_before_exit(client):
    s = Stream(client, SP, {"cmd": "sh", "args": ["-c", "echo first; sleep 3; echo second"]})
    t0 = time.time()
    assert s.next()[0] == "start"
    e = s.next()
    assert e == ("data", "stdout", b"first\n")
    assert time.time() - t0 < 2
    ev = s.all()
    assert output(ev) == b"second\n" and end_of(ev)[1] == 0
    assert time.time() - t0 >= 2.5
    s.close()


@pytest.mark.parametrize("pty", [False, True], ids=["pipe", "pty"])
def test_kill_term_self(client, pty):
    req = {"cmd": "sh", "args": ["-c", "echo x; kill -TERM $$; sleep 5"]}
    if pty:
        req["pty"] = {}
    ev, tr = run(client, req)
    assert tr == {}
    assert end_of(ev)[1:] == (-1, True, "error", "signal: terminated")
    assert output(ev, "pty" if pty else "stdout").replace(b"\r", b"") == b"x\n"


def test_timeout_kills_backgrounded_grandchild(client):
    s = Stream(client, SP, {"cmd": "sh", "args": ["-c", "sleep 100 & echo $!; sleep 50"]}, timeout_ms=1000)
    assert s.next()[0] == "start"
    e = s.next()
    gpid = int(e[2])
    assert proc_state(gpid) not in (None, "Z")
    ev = s.all()
    assert [x for x in ev if x[0] == "end"] == []
    assert err_of(s.end)[0] == "deadline_exceeded"
    assert wait_for(lambda: gone(gpid), 5)
    s.close()


def test_background_timeout_end_event(client):
    s = Stream(client, SP, {"cmd": "sh", "args": ["-c", "sleep 100 & sleep 50"], "background": True},
               timeout_ms=500)
    ev = s.all()
    assert s.end == {}
    assert end_of(ev)[1:] == (-1, True, "error", "signal: killed")


def test_pty(client):
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "stty size; tty; echo TERM=$TERM"], "pty": {}})
    check_ok(ev, tr)
    out = output(ev, "pty").decode()
    assert "24 80\r\n" in out and "/dev/pts/" in out and "TERM=xterm-256color" in out
    assert output(ev) == b"" and output(ev, "stderr") == b""
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "stty size; echo TERM=$TERM"],
                          "pty": {"cols": 132, "rows": 50}, "env": {"TERM": "dumb"}})
    out = output(ev, "pty").decode()
    assert "50 132\r\n" in out and "TERM=dumb" in out
    # PTY reads are at most 16 KiB
    ev, tr = run(client, {"cmd": "head", "args": ["-c", "200000", "/dev/zero"], "pty": {}})
    sizes = [len(e[2]) for e in ev if e[0] == "data"]
    assert sum(sizes) == 200000 and max(sizes) <= 16384


def test_pipe_reads_bounded(client):
    ev, tr = run(client, {"cmd": "head", "args": ["-c", "1000000", "/dev/zero"]}, proto=True)
    sizes = [len(e[2]) for e in ev if e[0] == "data"]
    assert sum(sizes) == 1000000 and max(sizes) <= 32768


def fds_settled(pid, timeout=3.0):
    """The child's fds once its dynamic loader has closed what it opens
    (ld.so.cache, libc) right after exec: poll until only 0-2 remain, or
    return what stays open."""
    deadline = time.time() + timeout
    while True:
        fds = sorted(os.listdir(f"/proc/{pid}/fd"))
        if fds == ["0", "1", "2"] or time.time() > deadline:
            return fds
        time.sleep(0.02)


def test_clean_children(client):
    """Default dispositions, empty mask, only fds 0-2, own group / session."""
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the test runner's own, irrelevant to the agent
    pid = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "clean"})
    assert fds_settled(pid) == ["0", "1", "2"]
    status = open(f"/proc/{pid}/status").read()
    assert re.search(r"^SigIgn:\s+0+$", status, re.M), status
    assert re.search(r"^SigBlk:\s+0+$", status, re.M)
    assert re.search(r"^Umask:\s+0022$", status, re.M)
    stat = open(f"/proc/{pid}/stat").read()
    f = stat[stat.rindex(")") + 2:].split()
    assert int(f[2]) == pid and int(f[3]) != pid  # own group, not a session
    send_signal(client, {"pid": pid}, 9)
    pid = start_bg(client, {"cmd": "sleep", "args": ["30"], "pty": {"cols": 10, "rows": 5}})
    assert fds_settled(pid) == ["0", "1", "2"]
    stat = open(f"/proc/{pid}/stat").read()
    f = stat[stat.rindex(")") + 2:].split()
    assert int(f[2]) == pid and int(f[3]) == pid and int(f[4]) != 0  # session leader with a ctty
    p = [x for x in list_procs(client) if x["pid"] == pid][0]
    assert p["config"]["pty"] == {"cols": 10, "rows": 5}
    send_signal(client, {"pid": pid}, 9)


def test_signal_reaches_group(client):
    pid = start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 300; true"], "tag": "grp"})
    members = wait_for(lambda: [m for m in group_members(pid) if m != pid], 5)
    assert members, "sleep not started"
    st, body, _ = send_signal(client, {"tag": "grp"}, 15)
    assert st == 200
    assert wait_for(lambda: all(gone(m) for m in members) and gone(pid), 5)


def test_connect_retained_exit(client):
    pid = start_bg(client, {"cmd": "sh", "args": ["-c", "exit 4"], "tag": "retained"})
    assert wait_for(lambda: not [x for x in list_procs(client) if x["pid"] == pid], 5)
    for sel in ({"pid": pid}, {"tag": "retained"}):
        s = Stream(client, CONNECT, {"process": sel})
        assert s.all() == [("start", pid), ("end", 4, True, "error", "exit status 4")]
        assert s.end == {}
        st, body, _ = send_signal(client, sel, 15)
        assert st == 404
    # a retained tag is free again
    pid2 = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": "retained"})
    s = Stream(client, CONNECT, {"process": {"tag": "retained"}})
    assert s.next() == ("start", pid2)
    s.close()
    send_signal(client, {"pid": pid2}, 9)


def test_retention_expires_and_keepalive():
    srv = Server(name="proc-ka", env={"CONCH_PROC_RETAIN_MS": "500", "CONCH_PROC_KEEPALIVE_MS": "300"})
    try:
        c = Client(srv.url, srv.token)
        pid = start_bg(c, {"cmd": "true", "tag": "short"})
        s = Stream(c, CONNECT, {"process": {"tag": "short"}})
        s.all()
        time.sleep(1.0)
        s = Stream(c, CONNECT, {"process": {"pid": pid}})
        assert s.all() == [] and err_of(s.end)[0] == "not_found"
        ev, tr = run(c, {"cmd": "sleep", "args": ["1"]})
        assert tr == {} and ev[0][0] == "start" and end_of(ev)[1] == 0
        kas = [e for e in ev if e == ("keepalive",)]
        assert 2 <= len(kas) <= 4, ev
        # JSON form of a keepalive
        r = curl("-X", "POST", srv.url + SP, "-H", "Content-Type: application/connect+json",
                 "-H", f"conch-init-token: {srv.token}", "--data-binary", "@-",
                 input=envelope(json.dumps({"cmd": "sleep", "args": ["0.5"]}).encode()))
        assert b'{"keepalive":{}}' in r.stdout
    finally:
        text = srv.stop()
    assert sanitizer_report(text) is None


def test_vanished_foreground_client_kills_group(client):
    s = Stream(client, SP, {"cmd": "sh", "args": ["-c", "sleep 100 & echo $!; sleep 200"]})
    pid = s.next()[1]
    gpid = int(s.next()[2])
    s.close()
    assert wait_for(lambda: gone(pid) and gone(gpid), 5)


def test_foreground_flow_control(client, server):
    """A slow client slows the child; nothing dropped; server memory bounded."""
    total = 256 << 20

    def rss_kib():
        return status_kib(server.proc.pid, "VmRSS")

    rss0 = rss_kib()
    s = Stream(client, SP, pb.StartProcessRequest(cmd="head", args=["-c", str(total), "/dev/zero"]), proto=True)
    pid = s.next()[1]
    got = 0
    while got < (1 << 20):
        e = s.next()
        got += len(e[2])
    time.sleep(2)  # stop reading: the child must block on its full pipe
    assert proc_state(pid) == "S", proc_state(pid)
    rss = rss_kib()
    assert not gone(pid)
    while True:
        e = s.next()
        if e is None:
            break
        if e[0] == "data":
            got += len(e[2])
        else:
            assert e == ("end", 0, True, "exited", "")
    assert got == total
    # the agent holds a few MiB for this stream, not the 256 MiB produced
    assert rss - rss0 < 48 * 1024, (rss0, rss)
    s.close()


def test_background_never_blocks_on_absent_reader(client):
    """50 MiB printed with a subscriber that never reads: exits on time, gone from List."""
    total = 50 << 20
    t0 = time.time()
    s = Stream(client, SP, {"cmd": "head", "args": ["-c", str(total), "/dev/zero"], "background": True,
                            "tag": "flood"})
    # do not read at all
    assert wait_for(lambda: not [x for x in list_procs(client) if x["tag"] == "flood"], 20)
    took = time.time() - t0
    assert took < 15
    ev = s.all()
    got = sum(len(e[2]) for e in ev if e[0] == "data")
    assert ev[0][0] == "start" and end_of(ev)[1] == 0
    assert got < total  # events were dropped, the end event was not
    s.close()


def test_two_subscribers_one_stalled(client, server):
    total = 48 << 20
    pid = start_bg(client, {"cmd": "sh", "args": ["-c", f"sleep 1; head -c {total} /dev/zero; sleep 1; echo; echo DONE"],
                            "tag": "fanout"})
    stalled = Stream(client, CONNECT, {"process": {"tag": "fanout"}})
    active = Stream(client, CONNECT, pb.ConnectProcessRequest(process=pb.ProcessSelector(tag="fanout")), proto=True)
    assert active.next() == ("start", pid)
    got, tail = 0, b""
    while True:
        e = active.next()
        if e is None:
            break
        if e[0] == "data":
            got += len(e[2])
            tail = (tail + e[2])[-16:]
        elif e[0] == "end":
            assert e[1] == 0
    assert active.end == {}
    assert got > (8 << 20)
    # the active one still receives what comes after the flood (its queue
    # drains during the pause; during the flood a slow reader may drop too)
    assert tail.endswith(b"DONE\n")
    ev = stalled.all()
    assert end_of(ev)[1] == 0
    assert sum(len(e[2]) for e in ev if e[0] == "data") < total
    stalled.close()
    active.close()
    log = open(server.log_path, errors="replace").read()
    assert re.search(rf"process ended pid={pid} .*dropped_events=[1-9]", log)


def test_thousand_background_processes(client):
    n = 1000
    pids = []
    for i in range(n):
        pids.append(start_bg(client, {"cmd": "sleep", "args": ["300"], "tag": f"many-{i}"}))
    procs = [p for p in list_procs(client) if p["tag"].startswith("many-")]
    assert [p["pid"] for p in procs] == pids  # start order
    conn = client.conn()
    for i in range(n):
        st, body, _ = client.unary(SIGNAL, {"process": {"tag": f"many-{i}"}, "signal": 9}, conn=conn)
        assert st == 200, body
    conn.close()
    assert wait_for(lambda: not [p for p in list_procs(client) if p["tag"].startswith("many-")], 30)
    assert wait_for(lambda: all(gone(p) for p in pids), 10)


def test_orphan_storm_exit_codes(client, server):
    results = []

    def one(i):
        ev, tr = run(client, {"cmd": "sh", "args": ["-c", f"for i in $(seq 200); do (sleep 0.01 &) ; done; exit {i}"]})
        results.append((i, end_of(ev)))

    ts = [threading.Thread(target=one, args=(i + 1,)) for i in range(5)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert sorted(results) == [(i, ("end", i, True, "error", f"exit status {i}")) for i in range(1, 6)]
    # every orphan came to the agent (a subreaper) and was reaped
    time.sleep(0.5)
    assert wait_for(lambda: not [c for c in children_of(server.proc.pid) if c[1] == "Z"], 5)


def test_grandchild_holding_pipe_does_not_hang(client):
    """The end comes ~100 ms after the exit even though a backgrounded
    grandchild keeps stdout open; its later output is read and discarded
    (it neither blocks nor dies of SIGPIPE)."""
    t0 = time.time()
    ev, tr = run(client, {"cmd": "sh", "args": ["-c", "(sleep 0.5; echo late; exec sleep 30) & echo $!"]})
    assert time.time() - t0 < 2
    check_ok(ev, tr)
    gpid = int(output(ev))
    time.sleep(1.5)  # it has written "late" into the pipe by now
    assert proc_state(gpid) == "S"
    os.kill(gpid, signal.SIGKILL)


def test_nul_in_request_string(client):
    ev, tr = run(client, {"cmd": "echo", "args": ["a\u0000b"]})
    assert ev == []
    assert err_of(tr) == ("invalid_argument",
                          "failed to execute process: invalid argument (NUL byte in a string field)")


@pytest.mark.parametrize("http2", [False, True], ids=["http1", "h2"])
def test_curl_list_and_signal(server, client, http2):
    pid = start_bg(client, {"cmd": "sleep", "args": ["30"], "tag": f"curl-{int(http2)}", "env": {"A": "1"}})
    code, body = curl_unary(server, LIST, {}, http2=http2)
    assert code == 200
    p = [x for x in body["processes"] if x["pid"] == pid][0]
    assert p["config"]["env"] == {"A": "1"} and p["config"]["cwd"] == "/root"
    code, body = curl_unary(server, SIGNAL, {"process": {"pid": pid}, "signal": 15}, http2=http2)
    assert (code, body) == (200, {})
    ev, tr = curl_stream(server, CONNECT, {"process": {"pid": pid}}, http2=http2)
    assert ev[0] == ("start", pid) and end_of(ev)[1:] == (-1, True, "error", "signal: terminated")
    code, body = curl_unary(server, SIGNAL, {"process": {"pid": pid}, "signal": 15}, http2=http2)
    assert (code, body) == (404, {"code": "not_found", "message": f"process pid {pid} not found"})
