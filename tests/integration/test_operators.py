"""Operators (api.md §9): a log nobody reads never stops the agent, logs
to the host as JSON lines, Prometheus metrics that Prometheus scrapes."""
import json
import os
import secrets
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import BIN, LOGDIR, sanitizer_report
from conch import Client, free_port
from test_process import check_ok, output, run


class Agent:
    """`conch-init serve` whose stderr is a pipe this test reads only when it
    says so (a console nobody drains)."""

    def __init__(self, *args, env=None):
        self.token = secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        e.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        e.update(env or {})
        os.makedirs(LOGDIR, exist_ok=True)
        self.out = open(os.path.join(LOGDIR, f"operators-{self.port}.out"), "wb")
        self.proc = subprocess.Popen(
            [BIN, "serve", "--listen", f"127.0.0.1:{self.port}", "--token", self.token, *args],
            stdout=self.out, stderr=subprocess.PIPE, env=e)
        self.err = b""
        self.reader = None
        deadline = time.time() + 20
        while time.time() < deadline:
            assert self.proc.poll() is None, "conch-init exited early"
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.05)
        self.client = Client(self.url, self.token)

    def drain(self):
        """Start reading stderr (in a thread, into self.err)."""
        def loop():
            while True:
                b = os.read(self.proc.stderr.fileno(), 65536)
                if not b:
                    return
                self.err += b
        self.reader = threading.Thread(target=loop, daemon=True)
        self.reader.start()

    def stop(self):
        if self.reader is None:
            self.drain()
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=10)
        self.out.close()
        rep = sanitizer_report(self.err.decode(errors="replace"))
        assert rep is None, rep
        return self.err.decode(errors="replace")


class HealthWatch:
    """GET /health every 20 ms in a thread; the slowest answer is kept."""

    def __init__(self, url):
        self.url, self.worst, self.count, self.failed = url, 0.0, 0, None
        self.stop_ = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while not self.stop_.is_set():
            t0 = time.monotonic()
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    r.read()
            except OSError as e:
                self.failed = repr(e)
            self.worst = max(self.worst, time.monotonic() - t0)
            self.count += 1
            time.sleep(0.02)

    def done(self):
        self.stop_.set()
        self.t.join(timeout=10)
        return self.worst


def test_stalled_stderr_pipe_never_stops_the_agent():
    """A stderr pipe nobody reads (a VMM console nobody drains): 2000
    commands at info, every output exact, /health < 1 s throughout; once the
    pipe is read the drop line arrives."""
    a = Agent("--log-level", "info")
    try:
        hw = HealthWatch(a.url)
        for i in range(2000):
            ev, tr = run(a.client, {"cmd": "echo", "args": [f"line {i}"]})
            check_ok(ev, tr)
            assert output(ev) == f"line {i}\n".encode()
        worst = hw.done()
        assert hw.failed is None, hw.failed
        assert hw.count > 10
        assert worst < 1.0, f"/health took {worst:.3f} s with the log stalled"
        a.drain()
        deadline = time.time() + 20
        while b"log lines dropped" not in a.err and time.time() < deadline:
            ev, tr = run(a.client, {"cmd": "true"})  # a line that gets through after the drops
            time.sleep(0.1)
        assert b"log lines dropped" in a.err
        line = next(l for l in a.err.decode().splitlines() if "log lines dropped" in l)
        assert "[WARN] log.c:" in line and int(line.split("] ")[-1].split()[0]) > 0, line
    finally:
        a.stop()


def listen_unix(path):
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(4)
    s.settimeout(20)
    return s


def read_lines(conn, pred, timeout=20):
    """JSON lines from conn until one satisfies pred."""
    conn.settimeout(0.5)
    buf, lines, deadline = b"", [], time.time() + timeout
    while time.time() < deadline:
        try:
            b = conn.recv(65536)
        except socket.timeout:
            continue
        if not b:
            break
        buf += b
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            lines.append(json.loads(line))
            if pred(lines[-1]):
                return lines
    raise AssertionError(f"no matching line in {lines[-5:]}")


def test_log_stream_json_kept_while_nobody_listens():
    """--log-stream unix:PATH: the lines logged before the host listened
    arrive first, as JSON objects; after the host went away and came back,
    the lines of the meantime arrive too.  --log-format json: the same
    objects on stderr."""
    d = tempfile.mkdtemp(prefix="conch-logstream-")
    path = os.path.join(d, "log.sock")
    a = Agent("--log-stream", f"unix:{path}", "--log-format", "json")
    a.drain()
    try:
        ls = listen_unix(path)
        c, _ = ls.accept()
        lines = read_lines(c, lambda o: "standalone" in o["msg"])
        first = next(o for o in lines if "standalone" in o["msg"])
        assert set(first) >= {"ts", "level", "src", "sandboxId", "msg", "pid"}, first
        assert first["level"] == "info" and first["src"].startswith("main.c:")
        assert first["pid"] == str(a.proc.pid) and first["ts"].endswith("Z")
        c.close()
        ls.close()
        os.unlink(path)
        for i in range(3):  # logged while nobody listens
            run(a.client, {"cmd": "sh", "args": ["-c", f"exit {41 + i}"]})
        ls = listen_unix(path)
        c, _ = ls.accept()  # the agent comes back by itself (backoff)
        lines = read_lines(c, lambda o: o.get("exit_code") == "43")
        assert [o for o in lines if o.get("exit_code") == "41"], lines[-5:]
        c.close()
        ls.close()
    finally:
        err = a.stop()
    objs = [json.loads(l) for l in err.splitlines() if l.startswith("{")]
    assert any("standalone" in o["msg"] for o in objs), err[-2000:]
    assert all(l.startswith("{") for l in err.splitlines() if l), err[-2000:]


def test_log_stream_tcp():
    """--log-stream tcp:IP:PORT: the same JSON lines over TCP."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    ls.settimeout(20)
    a = Agent("--log-stream", f"tcp:127.0.0.1:{ls.getsockname()[1]}")
    try:
        c, _ = ls.accept()
        lines = read_lines(c, lambda o: "standalone" in o["msg"])
        assert lines[-1]["level"] == "info" and lines[-1]["pid"] == str(a.proc.pid), lines[-1]
        c.close()
    finally:
        ls.close()
        a.stop()


def test_log_stream_bad_spec():
    r = subprocess.run([BIN, "serve", "--log-stream", "tcp:nohost"], capture_output=True, timeout=20)
    assert r.returncode == 2
    assert b"--log-stream needs vsock:CID:PORT, unix:PATH or tcp:IP:PORT" in r.stderr


def metrics_text(srv, headers):
    req = urllib.request.Request(srv.url + "/metrics", headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.headers.get("Content-Type"), r.read().decode()


def sample(text, name):
    """The value of an unlabelled sample, or of the first with these labels."""
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in the exposition")


def test_metrics_prometheus_text_and_promtool():
    """Accept: text/plain or ?format=prometheus → text format 0.0.4 that
    promtool finds clean; JSON stays the default; the token also as
    Authorization: Bearer."""
    a = Agent()
    try:
        for i in range(5):
            ev, tr = run(a.client, {"cmd": "true"})
            check_ok(ev, tr)
        st, body, _ = a.client.unary("/pb.ProcessService/List", {})
        assert st == 200
        ctype, text = metrics_text(a, {"Authorization": f"Bearer {a.token}", "Accept": "text/plain"})
        assert ctype == "text/plain; version=0.0.4; charset=utf-8"
        _, text2 = metrics_text(a, {"conch-init-token": a.token})
        assert json.loads(text2)["version"]  # JSON stays the default
        req = urllib.request.Request(a.url + "/metrics?format=prometheus", headers={"conch-init-token": a.token})
        with urllib.request.urlopen(req, timeout=30) as r:
            assert r.read().decode().startswith("# HELP ")
        for bad in ({"Authorization": "Bearer nope"}, {"Authorization": f"Basic {a.token}"}, {}):
            try:
                metrics_text(a, bad)
                raise AssertionError("accepted without the token")
            except urllib.error.HTTPError as e:
                assert e.code == 401
        chk = subprocess.run(["promtool", "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
        assert chk.returncode == 0 and chk.stdout == b"" and chk.stderr == b"", (chk.stdout, chk.stderr, text)
        assert sample(text, "conch_processes_started_total") == 5
        assert sample(text, "conch_processes_running") == 0
        assert 'conch_rpc_requests_total{service="pb.ProcessService",method="StartProcess",code="ok"} 5' in text
        assert 'conch_rpc_requests_total{service="pb.ProcessService",method="List",code="ok"} 1' in text
        assert 'conch_rpc_duration_seconds_count{service="pb.ProcessService",method="List"} 1' in text
        assert 'conch_rpc_duration_seconds_bucket{service="pb.ProcessService",method="List",le="+Inf"} 1' in text
        for name in ("conch_process_oom_kills_total", "conch_upgrades_total", "conch_connections_open",
                     "conch_connections_refused_total", "conch_memory_budget_held_bytes", "conch_forwarded_ports",
                     "conch_workload_memory_bytes", "process_resident_memory_bytes", "process_open_fds",
                     "process_cpu_seconds_total", "process_start_time_seconds"):
            sample(text, name)
        assert sample(text, "conch_connections_open") >= 1
        assert sample(text, "process_resident_memory_bytes") > 1e6
        assert abs(sample(text, "process_start_time_seconds") - time.time()) < 600
        for dest in ("console", "file", "stream"):
            assert f'conch_log_lines_dropped_total{{dest="{dest}"}} 0' in text
        for mode in ("steered", "relayed"):
            assert f'conch_forwarded_connections_total{{mode="{mode}"}} 0' in text
        assert 'conch_build_info{version="' in text
    finally:
        a.stop()


def test_prometheus_scrapes_the_agent():
    """Debian's Prometheus scrapes /metrics with `authorization: {type:
    Bearer}`; its query API answers conch_processes_started_total after a
    known number of commands."""
    a = Agent()
    d = tempfile.mkdtemp(prefix="conch-prom-")
    tokfile = os.path.join(d, "token")
    with open(tokfile, "w") as f:
        f.write(a.token)
    cfg = os.path.join(d, "prometheus.yml")
    with open(cfg, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: conch
    authorization:
      type: Bearer
      credentials_file: {tokfile}
    static_configs:
      - targets: ['127.0.0.1:{a.port}']
""")
    pport = free_port()
    plog = open(os.path.join(LOGDIR, f"prometheus-{pport}.log"), "wb")
    prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={d}/data",
                             f"--web.listen-address=127.0.0.1:{pport}"], stdout=plog, stderr=subprocess.STDOUT)
    try:
        for i in range(7):
            ev, tr = run(a.client, {"cmd": "true"})
            check_ok(ev, tr)
        q = urllib.parse.urlencode({"query": "conch_processes_started_total"})
        deadline, got = time.time() + 90, None
        while time.time() < deadline:
            assert prom.poll() is None, open(plog.name).read()[-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{pport}/api/v1/query?{q}", timeout=5) as r:
                    res = json.load(r)["data"]["result"]
                if res:
                    got = res[0]
                    if got["value"][1] == "7":
                        break
            except OSError:
                pass
            time.sleep(0.5)
        assert got is not None and got["value"][1] == "7", got
        assert got["metric"]["job"] == "conch" and got["metric"]["instance"] == f"127.0.0.1:{a.port}"
        q = urllib.parse.urlencode({"query": 'up{job="conch"}'})
        with urllib.request.urlopen(f"http://127.0.0.1:{pport}/api/v1/query?{q}", timeout=5) as r:
            assert json.load(r)["data"]["result"][0]["value"][1] == "1"
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        plog.close()
        a.stop()
