"""Shared fixtures: a conch-init server per test session, real clients.

The binary is $CONCH_INIT_BIN or build/asan/conch-init (ASan+UBSan).  The
server's stderr is kept in build/test-logs/; a sanitizer report in it fails
the session.
"""
import os
import secrets
import subprocess
import sys
import time
import urllib.request

import pytest

sys.path.insert(0, os.path.dirname(__file__))

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("CONCH_INIT_BIN", os.path.join(ROOT, "build", "asan", "conch-init"))
LOGDIR = os.path.join(ROOT, "build", "test-logs")

# The protobuf classes (tests/run-integration.sh makes them; a suite run
# alone gets them here).
try:
    import agent_pb2  # noqa: F401
except ImportError:
    _gen = os.path.join(ROOT, "build", "py")
    os.makedirs(_gen, exist_ok=True)
    subprocess.run(["protoc", f"--python_out={_gen}", "-Iproto", "proto/agent.proto"], cwd=ROOT, check=True)
    sys.path.insert(0, _gen)


from conch import free_port  # noqa: E402,F401  (re-exported: tests import it from here)


class Server:
    def __init__(self, token=None, extra_args=(), env=None, name="server", wrap=()):
        self.token = token if token is not None else secrets.token_hex(16)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        os.makedirs(LOGDIR, exist_ok=True)
        self.log_path = os.path.join(LOGDIR, f"{name}-{self.port}.log")
        self.log = open(self.log_path, "wb")
        args = [*wrap, BIN, "serve", "--listen", f"127.0.0.1:{self.port}", *extra_args]
        if self.token:
            args += ["--token", self.token]
        e = dict(os.environ)
        e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        e.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        if env:
            e.update(env)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=e)
        deadline = time.time() + 20
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"conch-init exited early: {open(self.log_path).read()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("conch-init did not come up")

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        text = open(self.log_path, errors="replace").read()
        return text


def status_kib(pid, field):
    """A "<field>: N kB" line of /proc/<pid>/status (VmRSS, VmHWM), in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


def sanitizer_report(text):
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        if marker in text:
            return text[text.index(marker) - 200 if text.index(marker) > 200 else 0:][:6000]
    return None


def serve(name, **kw):
    """Run a server for a fixture's scope; fail on a sanitizer report."""
    s = Server(name=name, **kw)
    yield s
    text = s.stop()
    rep = sanitizer_report(text)
    assert rep is None, f"sanitizer report in server log:\n{rep}"


@pytest.fixture(scope="session")
def server():
    yield from serve("server")


@pytest.fixture(scope="module")
def own_server(request):
    """A module's own conch-init: a module whose hostile or crash-prone
    traffic must not take other suites down with it overrides `server` with
    this, and a sanitizer report is charged to that module."""
    yield from serve(request.module.__name__.rsplit(".", 1)[-1])


@pytest.fixture()
def fresh_server():
    """A private server for tests that may disturb others."""
    yield from serve("fresh")


@pytest.fixture()
def tmpdir_abs(tmp_path):
    return str(tmp_path)
