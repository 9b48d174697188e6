"""FileService flow control, bounds and concurrency (api.md §7 "Never block
the loop on the disk", rpc.h backpressure): memory stays bounded against a
slow reader or a fast writer, many transfers run at once, a deadline stops a
long walk, and a slow disk operation does not stall other connections.
"""
import base64
import hashlib
import os
import socket
import threading
import time

import pytest

from conch import Client, envelope
from files_util import split_stream, temp_leftovers
from conftest import serve, status_kib

DOWNLOAD = "/pb.FileService/GetFileStream"
UPLOAD = "/pb.FileService/PostFileStream"
SEARCH = "/pb.FileService/SearchFiles"
LIST = "/pb.FileService/ListFiles"


@pytest.fixture()
def lean_server():
    """A private server whose ASan quarantine is small, so RSS tracks live memory."""
    yield from serve("files-flow",
                     env={"ASAN_OPTIONS": "quarantine_size_mb=1:detect_leaks=1:abort_on_error=0"})


def recv_until(s, marker):
    data = b""
    while marker not in data:
        b = s.recv(65536)
        assert b, "connection closed"
        data += b
    return data


def read_chunked_response(s, head):
    """Rest of a chunked HTTP/1.1 response on s; head = bytes read so far
    (at least the header block).  Returns the de-chunked body."""
    hdr, _, rest = head.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in hdr.lower(), hdr
    body = bytearray()
    buf = bytearray(rest)

    def need(n):
        while len(buf) < n:
            b = s.recv(1 << 20)
            assert b, "connection closed early"
            buf.extend(b)

    while True:
        while b"\r\n" not in buf:
            need(len(buf) + 1)
        i = buf.index(b"\r\n")
        n = int(bytes(buf[:i]), 16)
        del buf[:i + 2]
        need(n + 2)
        if n == 0:
            return bytes(body)
        body += buf[:n]
        del buf[:n + 2]


def slow_download(srv, path):
    """A proto GetFileStream over HTTP/1.1 on a socket with a small receive
    buffer, read up to the end of the response head: (socket, head)."""
    pb = pytest.importorskip("agent_pb2")
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    body = envelope(pb.GetFileRequest(filepath=path).SerializeToString())
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+proto\r\n"
               "conch-init-token: %s\r\nContent-Length: %d\r\n\r\n"
               % (DOWNLOAD, srv.token, len(body))).encode() + body)
    return s, recv_until(s, b"\r\n\r\n")


def test_download_slow_reader_bounded(lean_server, tmp_path):
    """A client that stops reading: the server stops reading the file once
    ~RPC_OUTQ_HIGH is queued, then resumes and delivers everything."""
    pb = pytest.importorskip("agent_pb2")
    p = str(tmp_path / "big")
    size = 96 << 20
    h = hashlib.sha256()
    with open(p, "wb") as f:
        for _ in range(size >> 20):
            block = os.urandom(1 << 20)
            h.update(block)
            f.write(block)
    srv = lean_server
    time.sleep(0.3)
    base = status_kib(srv.proc.pid, "VmRSS")
    s, head = slow_download(srv, p)
    time.sleep(1.5)  # not reading: the server must not buffer the file
    after = status_kib(srv.proc.pid, "VmRSS")
    assert after - base < 24 * 1024, (base, after)
    s.settimeout(60)
    data = read_chunked_response(s, head)
    s.close()
    got = hashlib.sha256()
    total, chunks = 0, 0
    off = 0
    while off < len(data):
        flags, n = data[off], int.from_bytes(data[off + 1:off + 5], "big")
        payload = data[off + 5:off + 5 + n]
        off += 5 + n
        if flags & 2:
            assert payload == b"{}"
            assert off == len(data)
            break
        ch = pb.FileChunk.FromString(payload)
        assert (ch.filepath == p) == (chunks == 0)
        got.update(ch.content)
        total += len(ch.content)
        chunks += 1
    assert total == size and chunks == size >> 20
    assert got.hexdigest() == h.hexdigest()


def test_download_truncated_mid_stream_is_data_loss(server, tmp_path):
    """A proto download over HTTP/1.1 whose file is truncated while the
    client has stopped reading: the chunks already read still arrive, whole
    and from the start of the file, and the stream then ends with data_loss
    "file changed during download: <p>" rather than OK with fewer bytes.
    The daemon goes on serving."""
    pb = pytest.importorskip("agent_pb2")
    p = str(tmp_path / "shrinks")
    size = 64 << 20
    data = os.urandom(size)  # every MiB its own: a skipped or repeated chunk shows
    with open(p, "wb") as f:
        f.write(data)
    srv = server
    s, head = slow_download(srv, p)
    time.sleep(1.0)  # not reading: the server waits for room in its queue
    os.truncate(p, 0)
    s.settimeout(30)
    body = read_chunked_response(s, head)
    s.close()
    msgs, end = split_stream(body, json_codec=False)
    assert end == {"error": {"code": "data_loss", "message": f"file changed during download: {p}"}}
    got = b"".join(pb.FileChunk.FromString(m).content for m in msgs)
    assert 0 < len(got) < size and len(got) % (1 << 20) == 0
    assert got == data[:len(got)]
    assert srv.alive()
    # the daemon still serves, downloads included
    q = str(tmp_path / "after")
    open(q, "wb").write(b"still here")
    st, out, end = Client(srv.url, srv.token).stream(
        DOWNLOAD, [pb.GetFileRequest(filepath=q).SerializeToString()], json_codec=False)
    assert st == 200 and end == {}
    assert pb.FileChunk.FromString(out[0]).content == b"still here"


def test_upload_fast_writer_bounded(lean_server, tmp_path):
    """A 64 MiB upload in 1 MiB chunks: the server pauses input while a
    write is in flight, so its memory does not grow with the file."""
    pb = pytest.importorskip("agent_pb2")
    srv = lean_server
    target = str(tmp_path / "up.bin")
    block = os.urandom(1 << 20)
    env = envelope(pb.FileChunk(filepath=target, content=block).SerializeToString())
    later = envelope(pb.FileChunk(content=block).SerializeToString())
    n = 64
    s = socket.create_connection(("127.0.0.1", srv.port))
    total = len(env) + (n - 1) * len(later)
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+proto\r\n"
               "conch-init-token: %s\r\nContent-Length: %d\r\n\r\n"
               % (UPLOAD, srv.token, total)).encode())
    base = status_kib(srv.proc.pid, "VmRSS")
    peak = base
    s.sendall(env)
    for _ in range(n - 1):
        s.sendall(later)
        peak = max(peak, status_kib(srv.proc.pid, "VmRSS"))
    resp = b""
    s.settimeout(60)
    while b"\x02\x00\x00\x00\x02{}" not in resp:
        b = s.recv(65536)
        assert b
        resp += b
    s.close()
    assert peak - base < 32 * 1024, (base, peak)
    assert os.path.getsize(target) == n << 20
    with open(target, "rb") as f:
        for _ in range(n):
            assert f.read(1 << 20) == block


def test_many_transfers_at_once(server, tmp_path):
    c = Client(server.url, server.token)
    errors = []
    datas = {}

    def worker(i):
        try:
            p = str(tmp_path / f"w{i}" / "f.bin")
            data = os.urandom((1 << 20) + i * 1000)
            datas[p] = data
            msgs = [{"filepath": p, "content": base64.b64encode(data[:1 << 20]).decode()},
                    {"content": base64.b64encode(data[1 << 20:]).decode()}]
            st, out, end = c.stream(UPLOAD, msgs)
            assert st == 200 and end == {}, end
            st, out, end = c.stream(DOWNLOAD, [{"filepath": p}])
            assert st == 200 and end == {}, end
            got = b"".join(base64.b64decode(m["content"]) for m in out)
            assert got == data
            st, r, _ = c.unary(LIST, {"path": str(tmp_path / f"w{i}")})
            assert st == 200 and r["entries"][0]["size"] == str(len(data))
        except Exception as e:  # noqa: BLE001
            errors.append(repr(e))

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert errors == []


def test_search_deadline_and_loop_stays_responsive(server, tmp_path):
    """A long walk (the whole filesystem) with a short deadline ends with
    deadline_exceeded, and other calls are answered meanwhile."""
    c = Client(server.url, server.token)
    results = {}

    def long_search():
        results["search"] = c.unary(SEARCH, {"path": "/", "pattern": "no-such-file-*.xyz"},
                                    headers={"Connect-Timeout-Ms": "1500"})

    t = threading.Thread(target=long_search)
    t.start()
    time.sleep(0.2)
    t0 = time.time()
    st, body, _ = c.unary(LIST, {"path": str(tmp_path)})
    assert st == 200
    assert time.time() - t0 < 1.0
    t.join(30)
    assert not t.is_alive()
    st, body, _ = results["search"]
    if st == 200:  # the walk finished first on a tiny filesystem
        assert body.get("entries", []) == []
    else:
        assert (st, body["code"]) == (504, "deadline_exceeded")
    # the server still serves file calls promptly (the walk was stopped)
    for _ in range(4):
        st, body, _ = c.unary(LIST, {"path": str(tmp_path)})
        assert st == 200


def make_wide_dir(root, n, name_len=240):
    """n files whose names are mostly \\x01 bytes: 1 byte each in protobuf,
    6 ("\\u0001") in JSON."""
    os.makedirs(root, exist_ok=True)
    for i in range(n):
        name = "\x01" * name_len + "%06d" % i
        open(os.path.join(root, name), "wb").close()


def test_list_json_response_over_cap(server, tmp_path):
    """Small as protobuf, over 16 MiB as JSON: proto succeeds, JSON gets
    resource_exhausted (never a truncated or hung answer)."""
    pb = pytest.importorskip("agent_pb2")
    root = str(tmp_path / "wide")
    make_wide_dir(root, 6000)
    c = Client(server.url, server.token)
    st, body, hdr = c.unary(LIST, pb.ListFilesRequest(path=root).SerializeToString(),
                            ctype="application/proto")
    assert st == 200 and isinstance(body, bytes), body
    r = pb.ListFilesResponse.FromString(body)
    assert len(r.entries) == 6000
    st, body, _ = c.unary(LIST, {"path": root})
    assert (st, body) == (429, {"code": "resource_exhausted",
                                "message": "file list exceeds maximum message size 16777216 bytes"})


def test_list_proto_response_over_cap(server, tmp_path):
    pb = pytest.importorskip("agent_pb2")
    root = str(tmp_path / "wider")
    make_wide_dir(root, 30000)
    c = Client(server.url, server.token)
    st, body, _ = c.unary(LIST, pb.ListFilesRequest(path=root).SerializeToString(),
                          ctype="application/proto")
    assert st == 429
    assert body == {"code": "resource_exhausted",
                    "message": "file list exceeds maximum message size 16777216 bytes"}


@pytest.fixture()
def one_thread_server():
    """A private server with one thread-pool thread: a long walk holds every
    disk operation behind it."""
    yield from serve("files-one-thread", env={"UV_THREADPOOL_SIZE": "1"})


def test_layer_error_answered_after_temp_removed(one_thread_server, tmp_path):
    """An upload ended by an error the protocol layer raises (a broken
    envelope) is answered only once its temp file is gone, even when the
    removal waits behind a long walk in the thread pool: a client that gets
    the error never finds a .conch-upload-* file."""
    srv = one_thread_server
    target = str(tmp_path / "held.txt")
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
               "conch-init-token: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (UPLOAD, srv.token)).encode())
    env = envelope(b'{"filepath": "%s", "content": "aGVsbG8="}' % target.encode())
    s.sendall(b"%x\r\n%s\r\n" % (len(env), env))
    deadline = time.time() + 10
    while not temp_leftovers(str(tmp_path), srv.proc.pid):
        assert time.time() < deadline, "temp file never appeared"
        time.sleep(0.02)
    # occupy the only pool thread with a walk of /usr (about a second)
    c = Client(srv.url, srv.token)
    t = threading.Thread(target=lambda: c.unary(SEARCH, {"path": "/usr", "pattern": "no-such-*.xyz"}))
    t.start()
    time.sleep(0.2)
    bad = b"\x00\x00\x00\x00\x05{\"no"  # an envelope whose JSON is cut short
    s.sendall(b"%x\r\n%s\r\n0\r\n\r\n" % (len(bad), bad))
    s.settimeout(30)
    resp = b""
    while not resp.endswith(b"0\r\n\r\n"):
        d = s.recv(65536)
        assert d, resp
        resp += d
    left = temp_leftovers(str(tmp_path), srv.proc.pid)
    s.close()
    t.join(30)
    assert b"invalid_argument" in resp, resp
    assert left == [], "the error came before the temp file was removed"
    assert not os.path.exists(target)
