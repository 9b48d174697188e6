"""One memory budget for everything held on behalf of clients (issue 23,
rows 2-6), and JSON file chunks encoded off the loop.

Each attack runs against a private server (the ASan build, small
quarantine) while test_hostile_io's monitor samples VmRSS from
/proc/<pid>/status every 0.1 s and asks /health on a fresh connection
every 0.5 s: RSS may grow by at most 64 MiB (96 MiB for the attacks that
send input), and every /health must be answered within 1 s.  An attack
stops early once the bound is passed (the old code grew by hundreds of
MiB; the machine is shared).
"""
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from h2conn import H2Client
from test_hostile_io import ASAN_ENV, FS, MiB, Attack, finish, start, tcp_small

pb = pytest.importorskip("agent_pb2")

OUT_BOUND_KIB = 64 * 1024  # attacks that leave output unread
IN_BOUND_KIB = 96 * 1024   # attacks that send input nobody reads
PROC = "/pb.ProcessService/"


@pytest.fixture()
def srv():
    s = start("budget")
    yield s
    finish(s)


def big_file(tmp_path, size=64 * MiB):
    p = str(tmp_path / "big.bin")
    with open(p, "wb") as f:
        f.truncate(size)
    return p


def warm(srv, path):
    """One JSON download read to the end (code paged in, pool threads and
    their arenas started) before the baseline is taken."""
    r = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "60",
                        "-H", "Content-Type: application/connect+json", "-H", "conch-init-token: " + srv.token,
                        "--data-binary", "@-", srv.url + FS + "GetFileStream"],
                       input=envelope(json.dumps({"filepath": path}).encode()), capture_output=True)
    assert r.stdout == b"200", r
    time.sleep(1.5)


def envelope(payload, flags=0):
    return bytes([flags]) + len(payload).to_bytes(4, "big") + payload


# ---------------------------------------------------------------- row 6

def h1_json_downloads_unread(att, srv, path, n):
    """n HTTP/1.1 connections, each a JSON GetFileStream of path, never read."""
    body = envelope(json.dumps({"filepath": path}).encode())
    req = (b"POST /pb.FileService/GetFileStream HTTP/1.1\r\nHost: x\r\n"
           b"Content-Type: application/connect+json\r\nconch-init-token: %s\r\n"
           b"Content-Length: %d\r\n\r\n%s" % (srv.token.encode(), len(body), body))
    socks = []
    try:
        for _ in range(n):
            if att.stop.is_set():
                break
            s = tcp_small(srv)
            s.sendall(req)
            socks.append(s)
            att.add("conns")
        att.stop.wait()
    finally:
        for s in socks:
            s.close()


def curl_json_downloads(att, srv, path, n):
    """n curls, each a JSON GetFileStream of path read to the end, again and again."""
    body = envelope(json.dumps({"filepath": path}).encode())
    procs = []

    def one():
        p = subprocess.Popen(["curl", "-s", "-o", "/dev/null", "--max-time", "120",
                              "-H", "Content-Type: application/connect+json",
                              "-H", "conch-init-token: " + srv.token, "--data-binary", "@-",
                              srv.url + FS + "GetFileStream"], stdin=subprocess.PIPE)
        p.stdin.write(body)
        p.stdin.close()
        return p

    try:
        procs = [one() for _ in range(n)]
        att.add("conns", n)
        while not att.stop.wait(0.2):
            for i, p in enumerate(procs):
                if p.poll() is not None:
                    att.add("sent")  # one download done
                    procs[i] = one()
    finally:
        for p in procs:
            p.kill()
            p.wait()


@pytest.mark.parametrize("kind", ["unread", "curls"])
def test_json_downloads_are_encoded_off_the_loop(srv, tmp_path, kind):
    """Row 6: 200 HTTP/1.1 connections asking a JSON GetFileStream of a
    64 MiB file and never reading, or 100 curls that read: each 1 MiB chunk
    is base64/JSON-encoded in the thread pool, not on the loop (/health
    within 1 s throughout), and the unread ones hold a bounded total (the
    old code encoded on the loop: /health 1.4-7.3 s and 1.14 s)."""
    p = big_file(tmp_path)
    warm(srv, p)
    if kind == "unread":
        att = Attack(srv, [lambda a: h1_json_downloads_unread(a, srv, p, 200)], seconds=6,
                     limit_kib=OUT_BOUND_KIB).run()
        att.check()
        assert att.stats["conns"] == 200, att.stats
    else:
        att = Attack(srv, [lambda a: curl_json_downloads(a, srv, p, 100)], seconds=6,
                     limit_kib=OUT_BOUND_KIB).run()
        att.check()
        assert att.stats["conns"] == 100, att.stats


# ---------------------------------------------------------------- row 4

def h2_window_shut_streams(att, srv, path, reqs, ctype="application/connect+proto"):
    """One HTTP/2 connection, stream window 0: one streaming call per
    request in reqs, whose answers are never let through."""
    c = H2Client("127.0.0.1", srv.port, stream_window=0, auto_ack=False)
    att.add("conns")
    try:
        for r in reqs:
            c.connect_stream(path, [r], srv.token, ctype=ctype)
            att.add("sent")
        while not att.stop.is_set():
            c.pump(0.1)  # read (HEADERS, SETTINGS): the window stays shut
            if c.closed:
                raise AssertionError("server closed the connection")
    finally:
        c.close()


def test_foreground_output_stops_while_the_stream_is_held(srv):
    """Row 4: 100 foreground `head -c 64M /dev/zero` on one HTTP/2
    connection whose stream window stays 0: once a stream holds a few
    hundred KiB its pipe is not read until the transport has room, so the
    connection holds a bounded total (the old code read each pipe until
    its stream held 4 MiB: +434 MiB)."""
    req = pb.StartProcessRequest(cmd="head", args=["-c", "64M", "/dev/zero"]).SerializeToString()
    att = Attack(srv, [lambda a: h2_window_shut_streams(a, srv, PROC + "StartProcess", [req] * 100)],
                 seconds=6, limit_kib=OUT_BOUND_KIB).run()
    att.check()
    assert att.stats["sent"] == 100, att.stats
    # and the output still flows to a reader, to the end
    c = H2Client("127.0.0.1", srv.port, conn_window=64 * MiB, stream_window=16 * MiB)
    try:
        sid = c.connect_stream(PROC + "StartProcess", [pb.StartProcessRequest(
            cmd="head", args=["-c", "8M", "/dev/zero"]).SerializeToString()], srv.token)
        st = c.wait(sid, timeout=60)[0]
    finally:
        c.close()
    evs = [pb.ProcessEvent.FromString(e) for f, e in H2Client.envelopes(st.body) if f == 0]
    assert sum(len(e.data.stdout) for e in evs if e.HasField("data")) == 8 * MiB
    assert evs[-1].HasField("end") and evs[-1].end.exit_code == 0

