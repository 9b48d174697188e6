"""Hostile and malformed input: each is answered with a clear error, and the
daemon keeps serving (an autouse fixture checks /health after every test; the
session's server fixture fails the run on any ASan/UBSan report).

Raw sockets for what http.client would not send; conch.Client for
well-formed HTTP carrying bad RPC content; H2Client for HTTP/2.
"""
import gzip
import json
import os
import random
import socket
import struct
import threading
import time

import pytest

import agent_pb2 as pb
from conch import Client, envelope, parse_envelopes
from conftest import Server, sanitizer_report, status_kib
from h2conn import H2Client

FS = "/pb.FileService/"
LIST = FS + "ListFiles"
GET = FS + "GetFileStream"
POST = FS + "PostFileStream"
MiB = 1024 * 1024
MAX_MSG = 16 * MiB

CPV_MISSING = 'missing required header: set Connect-Protocol-Version to "1"'


@pytest.fixture(scope="module")
def server(own_server):
    return own_server  # this module's own conch-init (see conftest.own_server)


# ---------------------------------------------------------------- helpers

def health_ok(server, timeout=5):
    try:
        s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
        s.close()
        return data.startswith(b"HTTP/1.1 200") and data.endswith(b'{"status":"OK","message":"OK"}')
    except OSError:
        return False


@pytest.fixture(autouse=True)
def still_serving(server):
    yield
    assert server.alive(), "conch-init died"
    assert health_ok(server), "conch-init stopped answering /health"


def raw(server, data, timeout=5.0, shut=False):
    """Send bytes on a fresh connection; read until the server closes or
    timeout.  Returns (bytes received, closed-by-server)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    try:
        out, closed = b"", False
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may stop reading and close early: read what it said
        deadline = time.time() + timeout
        while time.time() < deadline:
            s.settimeout(max(0.01, deadline - time.time()))
            try:
                b = s.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                closed = True
                break
            if not b:
                closed = True
                break
            out += b
        return out, closed
    finally:
        s.close()


def frame_types(data):
    """Types of the HTTP/2 frames in data (a server's byte stream)."""
    types, off = [], 0
    while off + 9 <= len(data):
        types.append(data[off + 3])
        off += 9 + int.from_bytes(data[off:off + 3], "big")
    return types


def status_of(resp):
    assert resp.startswith(b"HTTP/1.1 "), resp[:200]
    return int(resp.split(b" ", 2)[1])


def split_response(resp):
    head, _, body = resp.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    hdrs = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        hdrs[k.strip().lower()] = v.strip()
    return int(lines[0].split(" ", 2)[1]), hdrs, body


def err(code, message):
    return {"code": code, "message": message}


@pytest.fixture()
def cl(server):
    return Client(server.url, server.token)


def stream_error(status, msgs, end):
    """(status, msgs, end) of Client.stream → the error object of the end message."""
    assert status == 200, (status, msgs)
    assert end is not None and "error" in end, end
    return end["error"]


def list_body(path="/"):
    return json.dumps({"path": path}).encode()


# ---------------------------------------------------------------- HTTP/1.1 framing

MALFORMED_REQUEST_LINES = [
    b"GARBAGE\r\n\r\n",
    b"GET\r\n\r\n",
    b"FOO /health HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1 trailing\r\nHost: x\r\n\r\n",
    b"GET /he\x01alth HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/x.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\n\x00\r\n\r\n",
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32) + b"\r\n\r\n",  # a TLS ClientHello
]


def no_leftovers(d):
    """The directory is empty when the client has the error answer: the
    server answers an upload's error — its own or one the protocol layer
    raised (a broken envelope, the deadline) — only after the temp file is
    gone (rpc_defer_end)."""
    return os.listdir(d) == []


@pytest.mark.parametrize("req", MALFORMED_REQUEST_LINES, ids=range(len(MALFORMED_REQUEST_LINES)))
def test_malformed_request_line(server, req):
    resp, closed = raw(server, req)
    assert status_of(resp) == 400, resp
    assert closed, "connection should be closed after a framing error"


MALFORMED_HEADERS = [
    b"GET /health HTTP/1.1\r\nHost example.com\r\n\r\n",                       # no colon
    b"GET /health HTTP/1.1\r\nBad Name: x\r\n\r\n",                              # space in name
    b"GET /health HTTP/1.1\r\nX-A : x\r\n\r\n",                                # space before colon (RFC 9112 5.1: MUST 400)
    b"GET /health HTTP/1.1\r\nX-A: a\x00b\r\n\r\n",                              # NUL in value
    b"GET /health HTTP/1.1\r\nX-\x7fA: b\r\n\r\n",                               # DEL in name
    b"POST /pb.FileService/ListFiles HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /pb.FileService/ListFiles HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
    b"POST /pb.FileService/ListFiles HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n",
    b"POST /pb.FileService/ListFiles HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Type: "
    b"application/json\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",                        # bad chunk size
    b"POST /pb.FileService/ListFiles HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Type: "
    b"application/json\r\n\r\nfffffffffffffffffffff\r\n",                       # chunk size overflow
]


@pytest.mark.parametrize("req", MALFORMED_HEADERS, ids=range(len(MALFORMED_HEADERS)))
def test_malformed_headers(server, req):
    resp, closed = raw(server, req)
    assert status_of(resp) == 400, resp
    assert closed


def test_oversized_header_block_is_431(server):
    big = b"X-Big: " + b"a" * (70 * 1024) + b"\r\n"
    resp, closed = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")
    assert status_of(resp) == 431, resp[:200]
    assert closed
    # spread over many headers
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(70))
    resp, closed = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert status_of(resp) == 431
    # in the request target
    resp, closed = raw(server, b"GET /" + b"p" * (70 * 1024) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(resp) == 431
    assert closed


def test_header_block_just_under_the_limit_is_served(server):
    hdr = b"X-Big: " + b"a" * (60 * 1024) + b"\r\n"
    resp, _ = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + hdr + b"\r\n")
    st, _, body = split_response(resp)
    assert st == 200 and body == b'{"status":"OK","message":"OK"}'


def test_too_many_header_fields_is_431(server):
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(300))
    resp, closed = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    assert status_of(resp) == 431
    assert closed


def test_oversized_headers_over_h2(server):
    c = H2Client("127.0.0.1", server.port)
    try:
        c.wait_settings()
        sid = c.request("GET", "/health", {"x-big": "a" * (70 * 1024)})
        deadline = time.time() + 5
        st = c.streams[sid]
        while not st.done and not c.terminated and not c.closed and time.time() < deadline:
            c.pump(0.5)
        # refused: the stream is reset, answered 431, or the connection ends
        assert st.reset is not None or st.status == 431 or c.terminated or c.closed, vars(st)
        assert st.status != 200
    finally:
        c.close()


def test_slow_headers_are_cut_off_while_others_are_served(server):
    """Slowloris: a client trickling header bytes (or nothing, or half an
    HTTP/2 preface, or an HTTP/2 header block that never ends) is
    disconnected after ~10 s; other clients are served meanwhile."""
    t0 = time.time()
    socks = {}

    def conn(name, first):
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        if first:
            s.sendall(first)
        socks[name] = s

    conn("trickle", b"GET /health HTTP/1.1\r\n")
    conn("silent", b"")
    conn("half-preface", b"PRI * HTTP/2.0\r\n")
    # an h2 HEADERS frame without END_HEADERS: a CONTINUATION that never comes
    settings = struct.pack(">I", 0)[1:] + bytes([4, 0]) + struct.pack(">I", 0)
    block = b"\x83\x86\x84"  # :method POST, :scheme http, :path /  (HPACK static table)
    headers = struct.pack(">I", len(block))[1:] + bytes([1, 0x00]) + struct.pack(">I", 1) + block  # no END_HEADERS
    conn("h2-open-header-block", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings + headers)

    closed_at = {}

    def watch(name, s):
        s.settimeout(0.2)
        while time.time() - t0 < 14:
            if name == "trickle" and name not in closed_at:
                try:
                    s.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    closed_at[name] = time.time() - t0
                    return
            try:
                b = s.recv(65536)
                if not b:
                    closed_at[name] = time.time() - t0
                    return
            except socket.timeout:
                pass
            except OSError:
                closed_at[name] = time.time() - t0
                return
            if name == "trickle":
                time.sleep(0.8)

    threads = [threading.Thread(target=watch, args=(n, s)) for n, s in socks.items()]
    for t in threads:
        t.start()
    served = 0
    while time.time() - t0 < 9:
        assert health_ok(server, timeout=2), "another client was not served during the slow one"
        served += 1
        time.sleep(0.3)
    for t in threads:
        t.join()
    for s in socks.values():
        s.close()
    assert served >= 10
    for name in socks:
        assert name in closed_at, f"{name}: connection still open after 14 s"
        assert 8.5 <= closed_at[name] <= 13, f"{name}: closed after {closed_at[name]:.1f} s"


def test_random_garbage(server):
    """Seeded random bytes: as a whole request, after a request line, as the
    body of a streaming call and as the body of a unary proto call."""
    rnd = random.Random(20240601)
    tok = server.token.encode()
    for i in range(48):
        n = rnd.choice([1, 7, 24, 100, 1000, 5000, 70000])
        data = bytes(rnd.getrandbits(8) for _ in range(n))
        kind = i % 4
        if kind == 1:
            data = b"POST /pb.FileService/ListFiles HTTP/1.1\r\n" + data
        elif kind == 2:
            data = (b"POST /pb.FileService/GetFileStream HTTP/1.1\r\nContent-Type: application/connect+proto\r\n"
                    b"conch-init-token: " + tok + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n) + data
        elif kind == 3:
            data = (b"POST /pb.FileService/ListFiles HTTP/1.1\r\nContent-Type: application/proto\r\n"
                    b"Connect-Protocol-Version: 1\r\nconch-init-token: " + tok +
                    b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % n) + data
        resp, _ = raw(server, data, timeout=2 if kind >= 2 else 0.5, shut=kind < 2)
        if kind < 2:
            if resp:
                assert resp.startswith(b"HTTP/1.1 4"), resp[:200]
        elif kind == 2:
            # a Connect stream error in the end-of-stream envelope
            assert resp.startswith(b"HTTP/1.1 200"), resp[:300]
            assert b'{"error":{"code":"' in resp, resp[:300]
        else:
            st = status_of(resp)
            assert st in (400, 404), resp[:300]
            assert b'"code":"' in resp
        assert server.alive()
    assert health_ok(server)


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_h2_preface_then_garbage(server, seed):
    rnd = random.Random(seed)
    garbage = bytes(rnd.getrandbits(8) for _ in range(200))
    resp, closed = raw(server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + garbage, timeout=5)
    assert closed, "connection not closed after garbage frames"
    # the server's frames: SETTINGS first, and a GOAWAY
    types = frame_types(resp)
    assert types and types[0] == 4, types
    assert 7 in types, f"no GOAWAY in {types}"


def test_h2_settings_then_garbage_frames(server):
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    # DATA on stream 0, a WINDOW_UPDATE of size 3, a HEADERS with bad HPACK
    for bad in (b"\x00\x00\x04\x00\x00\x00\x00\x00\x00abcd",
                b"\x00\x00\x03\x08\x00\x00\x00\x00\x00abc",
                b"\x00\x00\x04\x01\x05\x00\x00\x00\x01\xff\xff\xff\xff"):
        resp, closed = raw(server, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings + bad, timeout=5)
        assert closed
        assert 7 in frame_types(resp), f"no GOAWAY in {frame_types(resp)}"


# ---------------------------------------------------------------- envelopes

def test_truncated_envelope_header(cl):
    # no envelope at all: a server-streaming call needs its one request
    st, msgs, end = cl.stream(GET, [])
    assert stream_error(st, msgs, end)["code"] == "invalid_argument"
    c = cl.conn()
    c.request("POST", GET, body=b"\x00\x00\x00", headers=cl.headers(ctype="application/connect+json"))
    r = c.getresponse()
    envs = parse_envelopes(r.read())
    c.close()
    end = json.loads(envs[-1][1])
    assert envs[-1][0] == 2
    assert end["error"]["code"] == "invalid_argument"
    assert "incomplete envelope" in end["error"]["message"]


def test_length_prefix_larger_than_body(cl, tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("x")
    payload = json.dumps({"filepath": str(p)}).encode()
    body = struct.pack(">BI", 0, len(payload) + 1000) + payload
    c = cl.conn()
    c.request("POST", GET, body=body, headers=cl.headers(ctype="application/connect+json"))
    r = c.getresponse()
    assert r.status == 200
    envs = parse_envelopes(r.read())
    c.close()
    assert len(envs) == 1 and envs[0][0] == 2, envs
    e = json.loads(envs[0][1])["error"]
    assert e["code"] == "invalid_argument"
    assert "incomplete envelope" in e["message"]


def test_length_prefix_larger_than_body_upload(cl, tmp_path):
    target = tmp_path / "t.txt"
    first = json.dumps({"filepath": str(target), "content": "aGVsbG8="}).encode()
    body = envelope(first) + struct.pack(">BI", 0, 5000) + b"short"
    c = cl.conn()
    c.request("POST", POST, body=body, headers=cl.headers(ctype="application/connect+json"))
    r = c.getresponse()
    envs = parse_envelopes(r.read())
    c.close()
    e = json.loads(envs[-1][1])["error"]
    assert e["code"] == "invalid_argument"
    assert not target.exists()
    assert no_leftovers(tmp_path)


@pytest.mark.parametrize("proto", ["connect+json", "connect+proto"])
def test_oversized_envelope_is_resource_exhausted(cl, proto):
    # only the 5-byte prefix: the server must refuse without waiting for 16 MiB
    body = struct.pack(">BI", 0, MAX_MSG + 1)
    c = cl.conn(timeout=10)
    c.request("POST", GET, body=body, headers=cl.headers(ctype="application/" + proto))
    r = c.getresponse()
    assert r.status == 200
    envs = parse_envelopes(r.read())
    c.close()
    e = json.loads(envs[-1][1])["error"]
    assert e["code"] == "resource_exhausted", e
    assert e["message"]


@pytest.mark.parametrize("codec", ["json", "proto"])
def test_message_of_tiny_values_is_refused_with_bounded_memory(codec):
    """A 16 MiB SearchFiles request of empty exclude patterns (3 bytes each
    in JSON, 2 in protobuf) used to take 540 MB (JSON tree) or 320 MB
    (protobuf-c's allocations) and keep most of it.  Decoding has a memory
    budget now (at most 64 MiB): resource_exhausted, and the peak stays far
    below what the decode would have taken."""
    if codec == "json":
        n = (MAX_MSG - 64) // 3
        body = b'{"path":"/tmp","pattern":"x","excludePatterns":[' + b'"",' * (n - 1) + b'""]}'
    else:
        n = (MAX_MSG - 64) // 2
        body = b"\x0a\x04/tmp\x12\x01x" + b"\x1a\x00" * n  # path, pattern, exclude_patterns
    assert len(body) <= MAX_MSG
    # ASan's quarantine would hold freed memory back from the peak count
    s = Server(name="budget-" + codec, env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:quarantine_size_mb=8"})
    try:
        before = status_kib(s.proc.pid, "VmHWM")
        c = Client(s.url, s.token)
        for _ in range(2):
            st, e, _ = c.unary("/pb.FileService/SearchFiles", body, ctype="application/" + codec)
            assert st == 429, (st, e)
            assert e["code"] == "resource_exhausted"
            assert "bytes of memory to decode" in e["message"]
        grew = status_kib(s.proc.pid, "VmHWM") - before
        # the body (16 MiB) + the 64 MiB budget + allocator and sanitizer overhead
        assert grew < 200 * 1024, f"peak grew by {grew} KiB"
        # an ordinary request on the same server still works
        st, r, _ = c.unary("/pb.FileService/ListFiles", {"path": "/"})
        assert st == 200, r
    finally:
        rep = sanitizer_report(s.stop())
        assert rep is None, rep


def test_oversized_envelope_over_h2(server):
    c = H2Client("127.0.0.1", server.port)
    try:
        sid = c.request("POST", POST, c.connect_headers(server.token, "application/connect+proto"),
                        struct.pack(">BI", 0, 0xFFFFFFFF) + b"xx", end_stream=False)
        (st,) = c.wait(sid, timeout=10)
        envs = H2Client.envelopes(st.body)
        assert json.loads(envs[-1][1])["error"]["code"] == "resource_exhausted"
    finally:
        c.close()


def test_oversized_unary_body_is_resource_exhausted(cl):
    # declared: answered from the headers alone
    c = cl.conn(timeout=10)
    c.putrequest("POST", LIST)
    for k, v in cl.headers().items():
        c.putheader(k, v)
    c.putheader("Content-Length", str(MAX_MSG + 1))
    c.endheaders()
    r = c.getresponse()
    assert r.status == 429
    assert json.loads(r.read())["code"] == "resource_exhausted"
    c.close()
    # chunked, no length: refused once 16 MiB have gone by
    blob = b'{"path":"/' + b"a" * (MAX_MSG + 10) + b'"}'

    def gen():
        for i in range(0, len(blob), MiB):
            yield blob[i:i + MiB]
    c = cl.conn(timeout=30)
    try:
        c.request("POST", LIST, body=gen(), headers=cl.headers(), encode_chunked=True)
        r = c.getresponse()
        assert r.status == 429
        assert json.loads(r.read())["code"] == "resource_exhausted"
    except (BrokenPipeError, ConnectionResetError):
        pass  # the server may close before the whole body went out
    finally:
        c.close()


def test_gzip_bomb_is_resource_exhausted(cl):
    bomb = gzip.compress(b'{"path":"/' + b"a" * (MAX_MSG + 100) + b'"}', 9)
    assert len(bomb) < 100_000
    st, body, _ = cl.unary(LIST, bomb, headers={"Content-Encoding": "gzip"})
    assert st == 429 and body["code"] == "resource_exhausted", (st, body)
    payload = gzip.compress(b'{"filepath":"/' + b"a" * (MAX_MSG + 100) + b'"}', 9)
    c = cl.conn()
    c.request("POST", GET, body=envelope(payload, 1),
              headers=cl.headers({"Connect-Content-Encoding": "gzip"}, ctype="application/connect+json"))
    envs = parse_envelopes(c.getresponse().read())
    c.close()
    assert json.loads(envs[-1][1])["error"]["code"] == "resource_exhausted"


# ---------------------------------------------------------------- message content

BAD_JSON = [
    b'{"path":',
    b"",
    b"[]",
    b'"just a string"',
    b'{"path": 5}',
    b'{"path": "/tmp", "depth": "x"}',
    b'{"path": "/tmp"} trailing',
    b"{'path': '/tmp'}",
    b'{"path": "/tmp",}',
    b'{"path": "\\ud800"}',
    b'{"path": "/tmp", "depth": 1e400}',
    b'{"path": "/tmp", "depth": 99999999999}',
    b'{"x":' + b"[" * 100000 + b"]" * 100000 + b"}",
    b'{"path": "/tmp", "path": "/etc"}',
]


@pytest.mark.parametrize("body", BAD_JSON, ids=range(len(BAD_JSON)))
def test_invalid_json_unary(cl, body):
    st, resp, hdrs = cl.unary(LIST, body)
    assert st == 400, (st, resp)
    assert hdrs["content-type"] == "application/json"
    assert resp["code"] == "invalid_argument"
    assert resp["message"]


@pytest.mark.parametrize("body", [b'{"filepath":', b"[1,2]", b'{"filepath": 7}', b"\xff\xfe"])
def test_invalid_json_in_envelope(cl, body):
    st, msgs, end = cl.stream(GET, [body])
    e = stream_error(st, msgs, end)
    assert e["code"] == "invalid_argument" and e["message"]


BAD_PROTO = [
    b"\x0a\xff\xff\xff\xff\x0f",      # length beyond the buffer
    b"\x0a\x05abc",                  # truncated string
    b"\x0a",                         # tag without value
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff",  # overlong varint tag
    b"\x10\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",  # overlong varint value
    b"\x0f",                         # wire type 7
]


@pytest.mark.parametrize("body", BAD_PROTO, ids=range(len(BAD_PROTO)))
def test_invalid_proto_unary(cl, body):
    st, resp, _ = cl.unary(LIST, body, ctype="application/proto")
    assert st == 400, (st, resp)
    assert resp["code"] == "invalid_argument" and resp["message"]


def test_invalid_proto_in_envelope(cl, tmp_path):
    st, msgs, end = cl.stream(GET, [b"\x0a\xff\xff\xff\xff\x0f"], json_codec=False)
    assert stream_error(st, msgs, end)["code"] == "invalid_argument"
    target = tmp_path / "never.txt"
    good = pb.FileChunk(filepath=str(target), content=b"x").SerializeToString()
    st, msgs, end = cl.stream(POST, [good, b"\x12\x10short"], json_codec=False)
    assert stream_error(st, msgs, end)["code"] == "invalid_argument"
    assert not target.exists() and no_leftovers(tmp_path)


@pytest.mark.parametrize("content", ["!!!!", "aGVsbG8=x", "aGV sbG8=", "a", "aGVsbG8===", "=aGVsbG8", "\u00e9A=="])
def test_invalid_base64(cl, tmp_path, content):
    target = tmp_path / "b64.txt"
    st, msgs, end = cl.stream(POST, [{"filepath": str(target), "content": content}])
    e = stream_error(st, msgs, end)
    assert e["code"] == "invalid_argument", e
    assert "base64" in e["message"], e
    assert not target.exists() and no_leftovers(tmp_path)


@pytest.mark.parametrize("content", ["aGVsbG8=", "aGVsbG8", "aGVs-G8_", "aGVs+G8/"])
def test_valid_base64_forms_accepted(cl, tmp_path, content):
    """The positive control for the base64 rejects (api.md §3: standard and
    URL-safe, with or without padding)."""
    import base64
    target = tmp_path / "ok.txt"
    st, msgs, end = cl.stream(POST, [{"filepath": str(target), "content": content}])
    assert st == 200 and end == {}, (msgs, end)
    alt = content.replace("-", "+").replace("_", "/")
    assert target.read_bytes() == base64.b64decode(alt + "=" * (-len(alt) % 4))


def test_invalid_utf8_json(cl):
    for body in (b'{"path":"/tmp/\xff"}', b'{"path":"/tmp/\xc3\x28"}', b'{"path":"/tmp/\xed\xa0\x80"}',
                 b'{"path":"/tmp/\xf8\x88\x80\x80\x80"}', b'{"path":"/\xc0\xaf"}', b'{"\xff":1}'):
        st, resp, _ = cl.unary(LIST, body)
        assert st == 400, (body, st, resp)
        assert resp["code"] == "invalid_argument"


def test_invalid_utf8_proto(cl, tmp_path):
    # ListFilesRequest.path (field 1, string) = b"/tmp/\xff"
    for bad in (b"/tmp/\xff", b"/\xc3\x28", b"/\xed\xa0\x80"):
        body = b"\x0a" + bytes([len(bad)]) + bad
        st, resp, _ = cl.unary(LIST, body, ctype="application/proto")
        assert st == 400, (bad, st, resp)
        assert resp["code"] == "invalid_argument"
    # in a stream: FileChunk.filepath
    target = str(tmp_path).encode() + b"/\xff.txt"
    chunk = b"\x0a" + bytes([len(target)]) + target + b"\x12\x01x"
    st, msgs, end = cl.stream(POST, [chunk], json_codec=False)
    assert stream_error(st, msgs, end)["code"] == "invalid_argument"
    assert no_leftovers(tmp_path)


def test_json_strings_have_one_form(cl, tmp_path):
    """Every JSON writer escapes alike (proto/text.h): a byte that is not
    UTF-8 becomes the escaped \\ufffd, a real U+FFFD stays raw, control
    characters by name or \\u00xx, nothing HTML-escaped.  Checked on the
    wire bytes of a ListFiles answer (the message codec) and of an error
    body that echoes a header (the error writer)."""
    d = tmp_path / "names"
    d.mkdir()
    for name in (b"bad\xff\xc3", b"real\xef\xbf\xbd", b"ctl\n\x01\x7f", b"html<>&\xe2\x80\xa8"):
        open(os.path.join(os.fsencode(d), name), "wb").close()
    c = cl.conn()
    c.request("POST", LIST, body=json.dumps({"path": str(d)}).encode(), headers=cl.headers())
    r = c.getresponse()
    raw = r.read()
    c.close()
    assert r.status == 200, raw
    names = sorted(e["name"] for e in json.loads(raw)["entries"])
    assert names == ["bad\ufffd\ufffd", "ctl\n\x01\x7f", "html<>&\u2028", "real\ufffd"]
    assert b'"name":"bad\\ufffd\\ufffd"' in raw
    assert b'"name":"real\xef\xbf\xbd"' in raw
    assert b'"name":"ctl\\n\\u0001\x7f"' in raw
    assert b'"name":"html<>&\xe2\x80\xa8"' in raw
    # the error body: the Connect-Protocol-Version value is echoed
    c = cl.conn()
    c.putrequest("POST", LIST, skip_accept_encoding=True)
    for k, v in cl.headers(version=False).items():
        c.putheader(k, v)
    c.putheader("Connect-Protocol-Version", b"\xe9<\"")
    body = json.dumps({"path": "/"}).encode()
    c.putheader("Content-Length", str(len(body)))
    c.endheaders(body)
    r = c.getresponse()
    raw = r.read()
    c.close()
    assert r.status == 400
    assert raw == b'{"code":"invalid_argument","message":"Connect-Protocol-Version must be \\"1\\": got \\"\\ufffd<\\"\\""}', raw


def test_duplicate_map_key_proto_rejected_like_json(cl):
    """A map key twice is legal protobuf wire data, but List would echo the
    stored env as a JSON object with a repeated key: refused in both codecs
    (found by tests/fuzz/fuzz_pbwire)."""
    def entry(k, v):
        e = pb.StartProcessRequest.EnvEntry(key=k, value=v).SerializeToString()
        return b"\x1a" + bytes([len(e)]) + e
    raw = pb.StartProcessRequest(cmd="true").SerializeToString() + entry("A", "1") + entry("A", "2")
    st, msgs, end = cl.stream("/pb.ProcessService/StartProcess", [raw], json_codec=False)
    assert (st, msgs) == (200, []) and end["error"] == err(
        "invalid_argument", 'unmarshal into pb.StartProcessRequest: duplicate map key in field "env"'), end
    st, msgs, end = cl.stream("/pb.ProcessService/StartProcess", [b'{"cmd":"true","env":{"A":"1","A":"2"}}'])
    assert st == 200 and end["error"]["code"] == "invalid_argument" and "duplicate map key" in end["error"]["message"]
    # distinct keys still work
    raw = pb.StartProcessRequest(cmd="true").SerializeToString() + entry("A", "1") + entry("B", "2")
    st, msgs, end = cl.stream("/pb.ProcessService/StartProcess", [raw], json_codec=False)
    assert st == 200 and end == {}, end


def test_nul_in_path_is_rejected(cl, tmp_path):
    st, resp, _ = cl.unary(LIST, json.dumps({"path": str(tmp_path) + "/a\u0000b"}).encode())
    assert (st, resp) == (400, err("invalid_argument", "filepath contains a NUL byte for list files"))
    body = b"\x0a\x08/tmp/a\x00b"
    st, resp, _ = cl.unary(LIST, body, ctype="application/proto")
    assert (st, resp) == (400, err("invalid_argument", "filepath contains a NUL byte for list files"))


# ---------------------------------------------------------------- content types and methods

@pytest.mark.parametrize("path,ctype", [
    (LIST, "text/plain"),
    (LIST, None),
    (LIST, "application/xml"),
    (LIST, "application/connect+json"),     # streaming type on a unary route
    (GET, "application/json"),              # unary type on a streaming route
    (POST, "application/proto"),
    (LIST, "application/jsonx"),
    (LIST, "multipart/form-data; boundary=x"),
    (LIST, "application/grpc"),             # gRPC needs HTTP/2
])
def test_wrong_content_type_is_415(cl, path, ctype):
    c = cl.conn()
    h = cl.headers()
    h.pop("Content-Type")
    if ctype:
        h["Content-Type"] = ctype
    c.request("POST", path, body=b"{}", headers=h)
    r = c.getresponse()
    r.read()
    assert r.status == 415
    # the connection stays usable
    c.request("POST", LIST, body=list_body("/"), headers=cl.headers())
    r = c.getresponse()
    r.read()
    assert r.status == 200
    c.close()


@pytest.mark.parametrize("ctype", ["application/json; charset=utf-8", "Application/JSON",
                                   "application/json;charset=UTF-8"])
def test_content_type_parameters_accepted(cl, ctype):
    st, resp, hdrs = cl.unary(LIST, list_body("/"), ctype=ctype)
    assert st == 200, resp
    assert "entries" in resp


def test_wrong_method_is_405_with_allow(server, cl):
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        c = cl.conn()
        c.request(method, LIST, headers=cl.headers())
        r = c.getresponse()
        r.read()
        assert r.status == 405, method
        assert r.getheader("Allow") == "POST"
        c.close()
    for method in ("POST", "PUT", "DELETE"):
        c = cl.conn()
        c.request(method, "/health", body=b"x")
        r = c.getresponse()
        r.read()
        assert r.status == 405, method
        assert r.getheader("Allow") == "GET"
        c.close()
    h = H2Client("127.0.0.1", server.port)
    try:
        a = h.request("GET", LIST)
        b = h.request("POST", "/health", body=b"x")
        h.wait(a, b)
        assert h.streams[a].status == 405 and h.streams[a].headers["allow"] == "POST"
        assert h.streams[b].status == 405 and h.streams[b].headers["allow"] == "GET"
    finally:
        h.close()


# ---------------------------------------------------------------- auth (api.md §4)

TOKEN_CASES = [
    ("missing", None, "agent token is required"),
    ("empty", "", "agent token is required"),
    ("wrong", "wrong-token", "agent token is invalid"),
    ("oversized", "t" * 4097, "agent token is invalid"),
    ("4096 wrong", "t" * 4096, "agent token is invalid"),
]


@pytest.mark.parametrize("name,tok,msg", TOKEN_CASES, ids=[c[0] for c in TOKEN_CASES])
def test_token_errors(server, cl, name, tok, msg):
    extra = None if tok is None else {"conch-init-token": tok}
    st, resp, hdrs = cl.unary(LIST, list_body("/"), headers=extra, token=False)
    assert st == 401
    assert hdrs["content-type"] == "application/json"
    assert resp == err("unauthenticated", msg)
    c = cl.conn()
    h = cl.headers(extra, token=False, ctype="application/connect+json")
    c.request("POST", GET, body=envelope(b'{"filepath":"/etc/hostname"}'), headers=h)
    r = c.getresponse()
    assert r.status == 200
    envs = parse_envelopes(r.read())
    c.close()
    assert len(envs) == 1 and envs[0][0] == 2
    assert json.loads(envs[0][1])["error"] == err("unauthenticated", msg)
    # over HTTP/2
    h2c = H2Client("127.0.0.1", server.port)
    try:
        sid = h2c.connect_unary(LIST, list_body("/"), None, extra=extra)
        (s,) = h2c.wait(sid)
        assert s.status == 401 and json.loads(bytes(s.body)) == err("unauthenticated", msg)
    finally:
        h2c.close()


def test_token_header_name_is_case_insensitive(server, cl):
    st, resp, _ = cl.unary(LIST, list_body("/"), headers={"CONCH-INIT-TOKEN": server.token}, token=False)
    assert st == 200, resp


def test_token_not_initialized(monkeypatch):
    monkeypatch.delenv("CONCH_INIT_TOKEN", raising=False)
    s = Server(token="", name="notoken")
    try:
        c = Client(s.url, "whatever")
        st, resp, _ = c.unary(LIST, list_body("/"))
        assert (st, resp) == (401, err("unauthenticated", "agent token is not initialized"))
        st, resp, _ = c.unary(LIST, list_body("/"), token=False)
        assert (st, resp) == (401, err("unauthenticated", "agent token is not initialized"))
        st, msgs, end = c.stream(GET, [{"filepath": "/etc/hostname"}])
        assert stream_error(st, msgs, end) == err("unauthenticated", "agent token is not initialized")
        assert health_ok(s)
    finally:
        text = s.stop()
    assert sanitizer_report(text) is None


# ---------------------------------------------------------------- Connect protocol headers

def test_connect_protocol_version_missing_unary(cl):
    st, resp, _ = cl.unary(LIST, list_body("/"), version=False)
    assert (st, resp) == (400, err("invalid_argument", CPV_MISSING))


@pytest.mark.parametrize("v", ["2", "0", "1.0", "one", "11"])
def test_connect_protocol_version_invalid(cl, v):
    st, resp, _ = cl.unary(LIST, list_body("/"), headers={"Connect-Protocol-Version": v})
    assert (st, resp) == (400, err("invalid_argument", f'Connect-Protocol-Version must be "1": got "{v}"'))
    st, msgs, end = cl.stream(GET, [{"filepath": "/etc/hostname"}], headers={"Connect-Protocol-Version": v})
    assert stream_error(st, msgs, end) == err("invalid_argument", f'Connect-Protocol-Version must be "1": got "{v}"')


def test_connect_protocol_version_optional_on_streams(cl, tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("hi")
    c = cl.conn()
    h = cl.headers(ctype="application/connect+json", version=False)
    c.request("POST", GET, body=envelope(json.dumps({"filepath": str(p)}).encode()), headers=h)
    envs = parse_envelopes(c.getresponse().read())
    c.close()
    assert envs[-1] == (2, b"{}")
    assert json.loads(envs[0][1])["content"] == "aGk="


@pytest.mark.parametrize("v", ["abc", "-1", "12345678901", "1.5", "1e3", "0x10", "+5", ""])
def test_malformed_connect_timeout(cl, v):
    st, resp, _ = cl.unary(LIST, list_body("/"), headers={"Connect-Timeout-Ms": v})
    assert st == 400, resp
    assert resp["code"] == "invalid_argument" and resp["message"]
    st, msgs, end = cl.stream(GET, [{"filepath": "/etc/hostname"}], headers={"Connect-Timeout-Ms": v})
    assert stream_error(st, msgs, end)["code"] == "invalid_argument"


@pytest.mark.parametrize("v", ["0", "60000", "9999999999"])
def test_wellformed_connect_timeout(cl, v):
    st, resp, _ = cl.unary(LIST, list_body("/"), headers={"Connect-Timeout-Ms": v})
    assert st == 200, resp


# ---------------------------------------------------------------- compression

def test_gzip_unary_request_accepted(cl, tmp_path):
    (tmp_path / "z.txt").write_text("z")
    st, resp, _ = cl.unary(LIST, gzip.compress(list_body(str(tmp_path))), headers={"Content-Encoding": "gzip"})
    assert st == 200, resp
    assert [e["name"] for e in resp["entries"]] == ["z.txt"]
    st, resp, _ = cl.unary(LIST, gzip.compress(pb.ListFilesRequest(path=str(tmp_path)).SerializeToString()),
                           headers={"Content-Encoding": "gzip"}, ctype="application/proto")
    assert st == 200
    assert [e.name for e in pb.ListFilesResponse.FromString(resp).entries] == ["z.txt"]


def test_gzip_stream_request_accepted(cl, tmp_path):
    target = tmp_path / "gz.txt"
    chunks = [gzip.compress(json.dumps({"filepath": str(target), "content": "aGVsbG8g"}).encode()),
              json.dumps({"filepath": str(target), "content": "d29ybGQ="}).encode()]  # mixed: 2nd plain
    body = envelope(chunks[0], 1) + envelope(chunks[1], 0)
    c = cl.conn()
    c.request("POST", POST, body=body,
              headers=cl.headers({"Connect-Content-Encoding": "gzip"}, ctype="application/connect+json"))
    envs = parse_envelopes(c.getresponse().read())
    c.close()
    assert envs[-1] == (2, b"{}"), envs
    assert target.read_bytes() == b"hello world"


def test_compressed_flag_without_encoding(cl):
    c = cl.conn()
    c.request("POST", GET, body=envelope(gzip.compress(b'{"filepath":"/etc/hostname"}'), 1),
              headers=cl.headers(ctype="application/connect+json"))
    envs = parse_envelopes(c.getresponse().read())
    c.close()
    e = json.loads(envs[-1][1])["error"]
    assert e["code"] in ("internal", "invalid_argument"), e
    assert e["message"]


def test_invalid_gzip_data(cl):
    st, resp, _ = cl.unary(LIST, b"\x1f\x8b\x08\x00garbage", headers={"Content-Encoding": "gzip"})
    assert st == 400 and resp["code"] == "invalid_argument", resp
    st, resp, _ = cl.unary(LIST, gzip.compress(list_body("/"))[:-6], headers={"Content-Encoding": "gzip"})
    assert st == 400 and resp["code"] == "invalid_argument", resp


def test_unknown_encoding_is_unimplemented(cl):
    st, resp, _ = cl.unary(LIST, list_body("/"), headers={"Content-Encoding": "br"})
    assert st == 501 and resp["code"] == "unimplemented", resp
    assert "br" in resp["message"]
    st, msgs, end = cl.stream(GET, [{"filepath": "/etc/hostname"}], headers={"Connect-Content-Encoding": "zstd"})
    e = stream_error(st, msgs, end)
    assert e["code"] == "unimplemented" and "zstd" in e["message"]
