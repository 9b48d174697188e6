"""FileService integration tests (api.md §7, seed 001): the seed's curl
examples as written (tests/cases/api-examples.sh) over HTTP/1.1, h2c prior
knowledge and h2c upgrade, and every FileService error text.

Run: make asan && tests/run-integration.sh   (or, from the repo root,
PYTHONPATH=build/py:tests/integration /usr/bin/python3 -m pytest tests/integration/test_files.py)
"""
import base64
import hashlib
import json
import os
import socket
import stat
import subprocess
import threading
import time

import pytest

from api_examples import api_curl
from conch import Client, envelope, parse_envelopes
from files_util import (HTTP_MODES, SEED_DIR, chunk_bytes, curl_post, json_envelopes,
                        make_seed_tree, run_seed_curl, split_stream, temp_leftovers,
                        upload_msgs)

# the guide's curl examples, as written (tests/cases/api-examples.sh)
LIST_CURL = api_curl("/pb.FileService/ListFiles")
SEARCH_CURL = api_curl("/pb.FileService/SearchFiles")

SEED_LIST_DEPTH2 = [  # the seed's SDK output, in order: path, type, size, is_directory
    ("/tmp/conch-doc-api/a.txt", "file", 1, False),
    ("/tmp/conch-doc-api/linked", "directory", None, True),
    ("/tmp/conch-doc-api/linked/main.py", "file", 12, False),
    ("/tmp/conch-doc-api/remote.txt", "file", 6, False),
    ("/tmp/conch-doc-api/target", "directory", None, True),
    ("/tmp/conch-doc-api/target/main.py", "file", 12, False),
]

UPLOAD = "/pb.FileService/PostFileStream"
DOWNLOAD = "/pb.FileService/GetFileStream"
LIST = "/pb.FileService/ListFiles"
SEARCH = "/pb.FileService/SearchFiles"


@pytest.fixture()
def seed_tree():
    root = make_seed_tree()
    yield root


@pytest.fixture()
def client(server):
    return Client(server.url, server.token)


def check_entry_shape(e):
    assert set(e) <= {"name", "path", "type", "size", "permissions", "modifiedTime",
                      "metadata", "isDirectory"}, e
    assert e["name"] == os.path.basename(e["path"])
    assert e["type"] in ("file", "directory")
    assert e.get("isDirectory", False) == (e["type"] == "directory")
    mt = e["modifiedTime"]
    assert len(mt) == 20 and mt[10] == "T" and mt.endswith("Z"), mt
    assert e.get("metadata", {}) == {}


# ---------------------------------------------------------------- seed curl

@pytest.mark.parametrize("mode", list(HTTP_MODES))
def test_seed_list_curl(server, seed_tree, mode):
    p = run_seed_curl(LIST_CURL, server.url, server.token, HTTP_MODES[mode])
    assert p.returncode == 0, p.stderr
    entries = json.loads(p.stdout)["entries"]
    got = [(e["path"], e["type"], int(e.get("size", "0")), e.get("isDirectory", False))
           for e in entries]
    assert len(got) == len(SEED_LIST_DEPTH2)
    for g, want in zip(got, SEED_LIST_DEPTH2):
        assert g[0] == want[0] and g[1] == want[1] and g[3] == want[3]
        if want[2] is not None:
            assert g[2] == want[2]
    for e in entries:
        check_entry_shape(e)
        assert isinstance(e.get("size", "0"), str)  # int64 as a JSON string
    files = {e["path"]: e for e in entries}
    assert files["/tmp/conch-doc-api/remote.txt"]["permissions"] == "-rw-r--r--"
    assert files["/tmp/conch-doc-api/linked"]["permissions"].startswith("d")


@pytest.mark.parametrize("mode", list(HTTP_MODES))
def test_seed_search_curl(server, seed_tree, mode):
    with open(os.path.join(seed_tree, "target", "old.py.bak"), "w") as f:
        f.write("x")
    p = run_seed_curl(SEARCH_CURL, server.url, server.token, HTTP_MODES[mode])
    assert p.returncode == 0, p.stderr
    entries = json.loads(p.stdout)["entries"]
    assert [(e["path"], e["type"]) for e in entries] == [
        ("/tmp/conch-doc-api/linked/main.py", "file"),
        ("/tmp/conch-doc-api/target/main.py", "file"),
    ]
    for e in entries:
        check_entry_shape(e)
        assert e["size"] == "12"


@pytest.mark.parametrize("mode", list(HTTP_MODES))
def test_seed_upload_then_download_request_examples(server, mode):
    """The seed's request examples for PostFileStream and GetFileStream
    (Connect streaming JSON), sent with curl in each HTTP mode."""
    os.makedirs(SEED_DIR, exist_ok=True)
    target = "/tmp/conch-doc-api/remote.txt"
    if os.path.exists(target):
        os.unlink(target)
    body = envelope(json.dumps({"filepath": target, "content": "aGVsbG8K"}).encode())
    code, data = curl_post(server.url, UPLOAD, body, "application/connect+json", server.token,
                           HTTP_MODES[mode])
    assert code == 200
    msgs, end = split_stream(data)
    assert end == {}
    assert msgs == [{"uploadedCount": 1, "entries": [
        {"name": "remote.txt", "path": target, "type": "file"}]}]
    with open(target, "rb") as f:
        assert f.read() == b"hello\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644

    body = envelope(json.dumps({"filepath": target}).encode())
    code, data = curl_post(server.url, DOWNLOAD, body, "application/connect+json", server.token,
                           HTTP_MODES[mode])
    assert code == 200
    msgs, end = split_stream(data)
    assert end == {}
    assert msgs == [{"filepath": target, "content": "aGVsbG8K"}]
    assert temp_leftovers(SEED_DIR) == []


# ---------------------------------------------------------------- upload

def up(client, msgs, **kw):
    st, out, end = client.stream(UPLOAD, msgs, **kw)
    assert st == 200
    return out, end


def test_upload_multi_chunk_and_repeated_path(client, tmp_path):
    target = str(tmp_path / "deep" / "er" / "f.bin")
    data = os.urandom(3 * (1 << 20) + 17)
    msgs = upload_msgs(target, data, repeat_path=True)
    msgs.insert(1, {"filepath": target})  # empty content is skipped
    msgs.append({"content": ""})
    out, end = up(client, msgs, chunked=True)
    assert end == {}
    assert out == [{"uploadedCount": 1,
                    "entries": [{"name": "f.bin", "path": target, "type": "file"}]}]
    with open(target, "rb") as f:
        assert f.read() == data
    for d in (tmp_path / "deep", tmp_path / "deep" / "er"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert temp_leftovers(os.path.dirname(target)) == []


def test_upload_later_chunks_without_path(client, tmp_path):
    target = str(tmp_path / "g.txt")
    out, end = up(client, [{"filepath": target, "content": "YQ=="}, {"content": "Yg=="},
                           {"filepath": "", "content": "Yw=="}])
    assert end == {} and out[0]["uploadedCount"] == 1
    assert open(target, "rb").read() == b"abc"


def test_upload_empty_file(client, tmp_path):
    target = str(tmp_path / "empty.txt")
    out, end = up(client, [{"filepath": target}])
    assert end == {} and out[0]["entries"][0]["name"] == "empty.txt"
    assert os.path.getsize(target) == 0


def test_upload_existing_target_keeps_mode(client, tmp_path):
    target = str(tmp_path / "keep.sh")
    with open(target, "w") as f:
        f.write("old")
    os.chmod(target, 0o751)
    out, end = up(client, [{"filepath": target, "content": base64.b64encode(b"new!").decode()}])
    assert end == {}
    assert open(target, "rb").read() == b"new!"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o751


def test_upload_exactly_1mib_chunk_ok(client, tmp_path):
    target = str(tmp_path / "mib")
    data = b"x" * (1 << 20)
    out, end = up(client, [{"filepath": target, "content": base64.b64encode(data).decode()}])
    assert end == {}
    assert os.path.getsize(target) == 1 << 20


def expect_upload_error(client, msgs, code, message, target=None):
    st, out, end = client.stream(UPLOAD, msgs)
    assert st == 200
    assert out == []  # no response message on error
    assert end["error"] == {"code": code, "message": message}
    if target:
        assert temp_leftovers(os.path.dirname(target)) == []


def test_upload_chunk_too_large(client, tmp_path):
    target = str(tmp_path / "big")
    data = b"y" * ((1 << 20) + 1)
    expect_upload_error(client, [{"filepath": target, "content": base64.b64encode(data).decode()}],
                        "resource_exhausted", "file chunk exceeds maximum size 1048576 bytes",
                        target)
    assert not os.path.exists(target)


def test_upload_chunk_too_large_later(client, tmp_path):
    target = str(tmp_path / "big2")
    with open(target, "wb") as f:
        f.write(b"original")
    big = base64.b64encode(b"y" * ((1 << 20) + 1)).decode()
    expect_upload_error(client, [{"filepath": target, "content": "YQ=="}, {"content": big}],
                        "resource_exhausted", "file chunk exceeds maximum size 1048576 bytes",
                        target)
    assert open(target, "rb").read() == b"original"


def test_upload_filepath_changed(client, tmp_path):
    a, b = str(tmp_path / "a.txt"), str(tmp_path / "b.txt")
    expect_upload_error(client, [{"filepath": a, "content": "YQ=="},
                                 {"filepath": b, "content": "Yg=="}],
                        "invalid_argument", "filepath changed during stream upload", a)
    assert not os.path.exists(a) and not os.path.exists(b)


def test_upload_filepath_changed_to_nul(client, tmp_path):
    a = str(tmp_path / "a.txt")
    expect_upload_error(client, [{"filepath": a, "content": "YQ=="},
                                 {"filepath": a + "\u0000", "content": "Yg=="}],
                        "invalid_argument", "filepath changed during stream upload", a)
    assert not os.path.exists(a)


def test_upload_no_chunks(client):
    expect_upload_error(client, [], "invalid_argument", "no file chunks provided")


@pytest.mark.parametrize("path,message", [
    ("", "filepath is required for stream upload"),
    ("tmp/x", "filepath must be a normalized absolute guest path for stream upload"),
    ("/tmp/../x", "filepath must be a normalized absolute guest path for stream upload"),
    ("/tmp//x", "filepath must be a normalized absolute guest path for stream upload"),
    ("/tmp/x/", "filepath must be a normalized absolute guest path for stream upload"),
    ("/tmp/./x", "filepath must be a normalized absolute guest path for stream upload"),
    ("/tmp/a\u0000b", "filepath contains a NUL byte for stream upload"),
    ("\u0000", "filepath contains a NUL byte for stream upload"),
])
def test_upload_bad_path(client, path, message):
    expect_upload_error(client, [{"filepath": path, "content": "YQ=="}], "invalid_argument",
                        message)


def test_upload_onto_directory(client, tmp_path):
    d = str(tmp_path / "adir")
    os.mkdir(d)
    expect_upload_error(client, [{"filepath": d, "content": "YQ=="}], "invalid_argument",
                        "path is a directory: " + d, d)
    assert os.path.isdir(d)


def test_upload_parent_is_file(client, tmp_path):
    f = str(tmp_path / "plain")
    open(f, "w").close()
    expect_upload_error(client, [{"filepath": f + "/x/y.txt", "content": "YQ=="}], "internal",
                        "create directory %s/x: not a directory" % f)


def test_upload_permission_denied(client):
    try:
        fd = os.open("/sys/conch-probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink("/sys/conch-probe")
        pytest.skip("/sys is writable here")
    except PermissionError:
        pass
    expect_upload_error(client, [{"filepath": "/sys/conch-x.txt", "content": "YQ=="}],
                        "permission_denied", "create file /sys/conch-x.txt: permission denied")


@pytest.fixture()
def small_fs(tmp_path):
    """A 3 MiB tmpfs of the test's own."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("existing", [False, True])
def test_upload_disk_full_mid_stream(server, small_fs, existing):
    """ENOSPC in a later write (two may be in the pool at once): the error
    text, no temp file left, the space back, the target as it was."""
    client = Client(server.url, server.token)
    target = str(small_fs / "f.bin")
    if existing:
        with open(target, "wb") as f:
            f.write(b"original")
    data = os.urandom(8 << 20)
    expect_upload_error(client, upload_msgs(target, data), "internal",
                        f"write file {target}: no space left on device")
    assert temp_leftovers(str(small_fs), server.proc.pid) == []
    if existing:
        assert open(target, "rb").read() == b"original"
    else:
        assert not os.path.exists(target)
    st = os.statvfs(str(small_fs))
    assert st.f_bfree * st.f_frsize >= (3 << 20) - 64 * 1024  # the temp file's blocks freed
    out, end = up(client, upload_msgs(target, data[:2 << 20]))  # what fits still goes in
    assert end == {} and out[0]["uploadedCount"] == 1
    assert open(target, "rb").read() == data[:2 << 20]
    assert server.alive()


def test_upload_client_disconnect_removes_temp(server, tmp_path):
    """Half an upload, then the client goes away: temp removed, target untouched."""
    target = str(tmp_path / "t.txt")
    with open(target, "wb") as f:
        f.write(b"before")
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
               "conch-init-token: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (UPLOAD, server.token)).encode())
    env = envelope(json.dumps({"filepath": target, "content": "bmV3"}).encode())
    s.sendall(b"%x\r\n%s\r\n" % (len(env), env))
    deadline = time.time() + 10
    while not temp_leftovers(str(tmp_path), server.proc.pid) and time.time() < deadline:
        time.sleep(0.02)
    assert temp_leftovers(str(tmp_path), server.proc.pid), "temp file never appeared"
    s.close()
    deadline = time.time() + 10
    while temp_leftovers(str(tmp_path), server.proc.pid) and time.time() < deadline:
        time.sleep(0.02)
    assert temp_leftovers(str(tmp_path), server.proc.pid) == []
    assert open(target, "rb").read() == b"before"
    assert server.alive()


def test_upload_proto_codec(client, tmp_path):
    pb = pytest.importorskip("agent_pb2")
    target = str(tmp_path / "p.bin")
    data = os.urandom(2 * (1 << 20) + 5)
    msgs = [pb.FileChunk(filepath=target, content=data[:1 << 20]).SerializeToString(),
            pb.FileChunk(content=data[1 << 20:2 << 20]).SerializeToString(),
            pb.FileChunk(filepath=target, content=data[2 << 20:]).SerializeToString()]
    st, out, end = client.stream(UPLOAD, msgs, json_codec=False)
    assert st == 200 and end == {}
    r = pb.PostFilesResponse.FromString(out[0])
    assert r.uploaded_count == 1 and len(r.entries) == 1
    assert (r.entries[0].name, r.entries[0].path, r.entries[0].type) == ("p.bin", target, "file")
    assert open(target, "rb").read() == data


def test_upload_proto_kept_and_copied_chunks(client, tmp_path):
    """Big chunks are queued as their decoded messages, small ones and ones
    padded with other fields (here an unknown field 15) as copies
    (fs/upload.c up_takes): one file made of all kinds comes out whole."""
    import agent_pb2 as pb
    target = str(tmp_path / "mixed.bin")
    sizes = [200 << 10, 100 << 10, 10, 70 << 10, 64 << 10, (64 << 10) - 1, 1 << 20]
    data = os.urandom(sum(sizes))
    pad = bytes([15 << 3 | 2]) + bytes([0x80, 0x40]) + b"u" * 8192  # 8 KiB unknown field
    msgs, off = [], 0
    for i, n in enumerate(sizes):
        m = pb.FileChunk(content=data[off:off + n])
        if i == 0:
            m.filepath = target
        raw = m.SerializeToString()
        msgs.append(raw + pad if i in (3, 5) else raw)
        off += n
    st, out, end = client.stream(UPLOAD, msgs, json_codec=False)
    assert st == 200 and end == {}
    assert pb.PostFilesResponse.FromString(out[0]).uploaded_count == 1
    assert open(target, "rb").read() == data


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_upload_pipelined_odd_pieces(client, tmp_path, framing):
    """HTTP/1.1 Content-Length bodies are read straight into the message being
    assembled (server/http1.c h1_read_into, connect.c on_body_into), never past
    the body; chunked ones are copied: two uploads with odd message sizes,
    sent pipelined on one connection in random pieces with pauses (chunked:
    in chunks of random sizes, 1 byte to 300 KiB), come out whole, both
    answered."""
    import random
    import agent_pb2 as pb
    rnd = random.Random(7)
    files, body = [], b""
    for k in range(2):
        target = str(tmp_path / f"piped{k}.bin")
        sizes = [(1 << 20) - 7, 3, 300 << 10, 1 << 20, 65 << 10]
        data = os.urandom(sum(sizes))
        env, off = b"", 0
        for i, n in enumerate(sizes):
            m = pb.FileChunk(content=data[off:off + n])
            if i == 0:
                m.filepath = target
            env += envelope(m.SerializeToString())
            off += n
        if framing == "chunked":
            framed, i = b"", 0
            while i < len(env):
                n = rnd.choice([1, 7, 4096, 65536, 300 << 10])
                framed += b"%x\r\n" % len(env[i:i + n]) + env[i:i + n] + b"\r\n"
                i += n
            env, te = framed + b"0\r\n\r\n", "Transfer-Encoding: chunked"
        else:
            te = f"Content-Length: {len(env)}"
        head = (f"POST {UPLOAD} HTTP/1.1\r\nHost: t\r\nContent-Type: application/connect+proto\r\n"
                f"conch-init-token: {client.token}\r\n{te}\r\n\r\n").encode()
        body += head + env
        files.append((target, data))
    s = socket.create_connection((client.host, client.port), timeout=60)
    off = 0
    while off < len(body):
        n = rnd.choice([1, 5, 4093, 16 << 10, 70001, 1 << 20])
        s.sendall(body[off:off + n])
        off += n
        if rnd.random() < 0.1:
            time.sleep(0.01)
    got = b""
    while got.count(b"HTTP/1.1 200") < 2 or not got.endswith(b"\r\n0\r\n\r\n"):
        d = s.recv(65536)
        assert d, got
        got += d
        if got.count(b"0\r\n\r\n") >= 2:
            break
    s.close()
    assert got.count(b"HTTP/1.1 200 OK") == 2, got
    assert b"error" not in got, got
    for target, data in files:
        assert open(target, "rb").read() == data


# ---------------------------------------------------------------- download

def down(client, path, **kw):
    st, out, end = client.stream(DOWNLOAD, [{"filepath": path}], **kw)
    assert st == 200
    return out, end


def test_download_1mib_plus_4_is_two_chunks(client, tmp_path):
    p = str(tmp_path / "f")
    data = os.urandom((1 << 20) + 4)
    open(p, "wb").write(data)
    out, end = down(client, p)
    assert end == {}
    assert len(out) == 2
    assert out[0]["filepath"] == p and "filepath" not in out[1]
    assert chunk_bytes(out) == data


def test_download_empty_file_zero_chunks(client, tmp_path):
    p = str(tmp_path / "e")
    open(p, "wb").close()
    out, end = down(client, p)
    assert out == [] and end == {}


@pytest.mark.parametrize("mode", list(HTTP_MODES))
def test_download_large_all_modes(server, tmp_path, mode):
    p = str(tmp_path / "large")
    data = os.urandom(9 * (1 << 20) + 333)
    open(p, "wb").write(data)
    body = envelope(json.dumps({"filepath": p}).encode())
    code, raw = curl_post(server.url, DOWNLOAD, body, "application/connect+json", server.token,
                          HTTP_MODES[mode])
    assert code == 200
    msgs, end = split_stream(raw)
    assert end == {}
    assert len(msgs) == 10
    assert all(len(base64.b64decode(m["content"])) == 1 << 20 for m in msgs[:-1])
    assert [("filepath" in m) for m in msgs] == [True] + [False] * 9
    assert hashlib.sha256(chunk_bytes(msgs)).digest() == hashlib.sha256(data).digest()


def test_download_proto_codec(client, tmp_path):
    pb = pytest.importorskip("agent_pb2")
    p = str(tmp_path / "pp")
    data = os.urandom(3 * (1 << 20))
    open(p, "wb").write(data)
    req = pb.GetFileRequest(filepath=p).SerializeToString()
    st, out, end = client.stream(DOWNLOAD, [req], json_codec=False)
    assert st == 200 and end == {}
    chunks = [pb.FileChunk.FromString(m) for m in out]
    assert len(chunks) == 3
    assert chunks[0].filepath == p and chunks[1].filepath == "" and chunks[2].filepath == ""
    assert b"".join(c.content for c in chunks) == data


@pytest.mark.parametrize("mode", list(HTTP_MODES))
@pytest.mark.parametrize("size", [0, 1, 1 << 20, (1 << 20) + 4, 2 << 20, (2 << 20) + 1,
                                  (5 << 20) + 7])
def test_download_proto_sizes(server, tmp_path, mode, size):
    """With the proto codec a regular file's chunks break at every 1 MiB
    (an empty file has none), only the first names the file, and the bytes
    are the file's."""
    pb = pytest.importorskip("agent_pb2")
    p = str(tmp_path / "m")
    data = os.urandom(size)
    open(p, "wb").write(data)
    body = envelope(pb.GetFileRequest(filepath=p).SerializeToString())
    code, raw = curl_post(server.url, DOWNLOAD, body, "application/connect+proto", server.token,
                          HTTP_MODES[mode])
    assert code == 200
    msgs, end = split_stream(raw, json_codec=False)
    assert end == {}
    chunks = [pb.FileChunk.FromString(m) for m in msgs]
    assert len(chunks) == (size + (1 << 20) - 1) >> 20
    assert all(len(c.content) == 1 << 20 for c in chunks[:-1])
    assert [c.filepath for c in chunks] == ([p] + [""] * (len(chunks) - 1) if chunks else [])
    assert b"".join(c.content for c in chunks) == data


PSEUDO_FILES = ["/proc/version", "/sys/kernel/mm/transparent_hugepage/enabled"]


@pytest.mark.parametrize("json_codec", [True, False])
@pytest.mark.parametrize("path", PSEUDO_FILES)
def test_download_pseudo_file_reads_its_content(client, json_codec, path):
    """procfs files report size 0 and sysfs attributes 4096 yet produce their
    content on read: the download reads until EOF, not up to the size, and
    a short read there is not a file that changed."""
    pb = pytest.importorskip("agent_pb2")
    if not os.path.exists(path):
        pytest.skip(f"{path} not on this machine")
    want = open(path, "rb").read()
    assert want and len(want) != os.stat(path).st_size
    if json_codec:
        out, end = down(client, path)
        assert end == {} and chunk_bytes(out) == want
    else:
        st, out, end = client.stream(DOWNLOAD, [pb.GetFileRequest(filepath=path).SerializeToString()],
                                     json_codec=False)
        assert st == 200 and end == {}
        assert b"".join(pb.FileChunk.FromString(m).content for m in out) == want


def test_download_fifo_streams_until_eof(client, tmp_path):
    p = str(tmp_path / "fifo")
    os.mkfifo(p)

    def writer():
        time.sleep(0.3)  # the download is already waiting for a writer
        with open(p, "wb", buffering=0) as f:
            f.write(b"abc")
            time.sleep(0.2)
            f.write(b"def")

    t = threading.Thread(target=writer)
    t.start()
    out, end = down(client, p)
    t.join()
    assert end == {}
    assert chunk_bytes(out) == b"abcdef"
    assert out[0]["filepath"] == p
    assert all("filepath" not in m for m in out[1:])


def test_download_dev_null(client):
    out, end = down(client, "/dev/null")
    assert out == [] and end == {}


def test_download_dev_zero_client_gone(server, client):
    """An endless special file: the client reads a little and leaves; the
    server stops (and stays healthy)."""
    s = socket.create_connection(("127.0.0.1", server.port))
    body = envelope(json.dumps({"filepath": "/dev/zero"}).encode())
    s.sendall(("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
               "conch-init-token: %s\r\nContent-Length: %d\r\n\r\n"
               % (DOWNLOAD, server.token, len(body))).encode() + body)
    got = 0
    while got < 3 * (1 << 20):
        b = s.recv(1 << 16)
        assert b
        got += len(b)
    s.close()
    time.sleep(0.2)
    out, end = down(client, "/dev/null")
    assert end == {}


def expect_stream_error(client, path, msgs, code, message):
    st, out, end = client.stream(path, msgs)
    assert st == 200
    assert out == []
    assert end["error"] == {"code": code, "message": message}


@pytest.mark.parametrize("path,code,message", [
    ("", "invalid_argument", "filepath is required for stream file retrieval"),
    ("x", "invalid_argument", "filepath must be a normalized absolute guest path for stream file retrieval"),
    ("/a/../b", "invalid_argument", "filepath must be a normalized absolute guest path for stream file retrieval"),
    ("/a\u0000", "invalid_argument", "filepath contains a NUL byte for stream file retrieval"),
    ("/no/such/file", "not_found", "file not found: /no/such/file"),
    ("/tmp", "invalid_argument", "path is a directory: /tmp"),
    ("/", "invalid_argument", "path is a directory: /"),
])
def test_download_errors(client, path, code, message):
    expect_stream_error(client, DOWNLOAD, [{"filepath": path}], code, message)


def test_download_permission_denied(client):
    try:
        os.close(os.open("/proc/1/mem", os.O_RDONLY))
        pytest.skip("/proc/1/mem is readable here")
    except PermissionError:
        pass
    expect_stream_error(client, DOWNLOAD, [{"filepath": "/proc/1/mem"}], "permission_denied",
                        "open file /proc/1/mem: permission denied")


# ---------------------------------------------------------------- list

def test_list_depths_and_order(client, tmp_path):
    root = str(tmp_path)
    for rel in ("b/c/d", "B"):
        os.makedirs(os.path.join(root, rel))
    for rel in ("a.txt", "b/c/d/e.txt", "Z.txt"):
        open(os.path.join(root, rel), "w").close()
    os.symlink("b", os.path.join(root, "lnk"))
    os.symlink("..", os.path.join(root, "b", "up"))  # a cycle
    os.symlink("missing", os.path.join(root, "dangling"))

    def names(depth):
        body = {"path": root} if depth is None else {"path": root, "depth": depth}
        st, r, _ = client.unary(LIST, body)
        assert st == 200, r
        return [e["path"][len(root) + 1:] + ("/" if e.get("isDirectory") else "")
                for e in r.get("entries", [])]

    level1 = ["B/", "Z.txt", "a.txt", "b/", "dangling", "lnk/"]
    assert names(None) == level1
    assert names(0) == level1
    assert names(-5) == level1
    assert names(1) == level1
    assert names(2) == ["B/", "Z.txt", "a.txt", "b/", "b/c/", "b/up/", "dangling", "lnk/",
                        "lnk/c/", "lnk/up/"]
    assert names(100) == ["B/", "Z.txt", "a.txt", "b/", "b/c/", "b/c/d/", "b/c/d/e.txt",
                          "b/up/", "dangling", "lnk/", "lnk/c/", "lnk/c/d/", "lnk/c/d/e.txt",
                          "lnk/up/"]


def test_list_entry_details(client, tmp_path):
    root = str(tmp_path)
    os.symlink("nowhere", os.path.join(root, "broken"))
    su = os.path.join(root, "su")
    open(su, "w").close()
    os.chmod(su, 0o4755)
    st, r, _ = client.unary(LIST, {"path": root})
    assert st == 200
    by = {e["name"]: e for e in r["entries"]}
    assert by["broken"]["type"] == "file"
    assert by["broken"]["permissions"] == "Lrwxrwxrwx"
    assert by["broken"]["size"] == str(len("nowhere"))
    assert by["su"]["permissions"] == "urwxr-xr-x"
    for e in r["entries"]:
        check_entry_shape(e)


def test_list_special_roots(client):
    st, r, _ = client.unary(LIST, {"path": "/dev/null"})
    assert st == 200
    assert [(e["path"], e["type"], e["permissions"]) for e in r["entries"]] == [
        ("/dev/null", "file", "Dcrw-rw-rw-")]
    st, r, _ = client.unary(LIST, {"path": "/"})
    assert st == 200
    by = {e["path"]: e for e in r["entries"]}
    assert by["/tmp"]["permissions"] == "dtrwxrwxrwx"
    assert all(e["path"].count("/") == 1 for e in r["entries"])


def test_list_file_root(client, seed_tree):
    st, r, _ = client.unary(LIST, {"path": "/tmp/conch-doc-api/remote.txt", "depth": 3})
    assert st == 200
    assert len(r["entries"]) == 1
    e = r["entries"][0]
    assert (e["name"], e["path"], e["type"], e["size"]) == (
        "remote.txt", "/tmp/conch-doc-api/remote.txt", "file", "6")


@pytest.mark.parametrize("body,status,code,message", [
    ({}, 400, "invalid_argument", "path is required"),
    ({"path": ""}, 400, "invalid_argument", "path is required"),
    ({"path": "tmp"}, 400, "invalid_argument", "filepath must be a normalized absolute guest path for list files"),
    ({"path": "/tmp/"}, 400, "invalid_argument", "filepath must be a normalized absolute guest path for list files"),
    ({"path": "/../tmp"}, 400, "invalid_argument", "filepath must be a normalized absolute guest path for list files"),
    ({"path": "/tmp\u0000"}, 400, "invalid_argument", "filepath contains a NUL byte for list files"),
    ({"path": "\u0000/tmp"}, 400, "invalid_argument", "filepath contains a NUL byte for list files"),
    ({"path": "/no/such/dir"}, 404, "not_found", "path not found: /no/such/dir"),
])
def test_list_errors(client, body, status, code, message):
    st, r, _ = client.unary(LIST, body)
    assert (st, r) == (status, {"code": code, "message": message})


# ---------------------------------------------------------------- search

def test_search_rel_path_basename_and_excludes(client, tmp_path):
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "src", "pkg"))
    for rel in ("top.py", "src/a.py", "src/pkg/b.py", "src/pkg/c.txt", "src/skip.py"):
        open(os.path.join(root, rel), "w").close()
    os.makedirs(os.path.join(root, "dir.py"))  # directories are never hits

    def search(pattern, excludes=None):
        body = {"path": root, "pattern": pattern}
        if excludes is not None:
            body["excludePatterns"] = excludes
        st, r, _ = client.unary(SEARCH, body)
        assert st == 200, r
        return [e["path"][len(root) + 1:] for e in r.get("entries", [])]

    assert search("*.py") == ["src/a.py", "src/pkg/b.py", "src/skip.py", "top.py"]
    assert search("src/*.py") == ["src/a.py", "src/skip.py"]
    assert search("*.py", ["skip.*"]) == ["src/a.py", "src/pkg/b.py", "top.py"]
    assert search("*.py", ["src/pkg/*"]) == ["src/a.py", "src/skip.py", "top.py"]
    assert search("[a-b].py") == ["src/a.py", "src/pkg/b.py"]
    assert search("[^a-b]*.py") == ["src/skip.py", "top.py"]
    assert search("?.txt") == ["src/pkg/c.txt"]
    assert search("nomatch") == []


def test_search_follows_links_once(client, seed_tree):
    os.symlink("..", os.path.join(seed_tree, "target", "up"))  # cycle back to the root
    st, r, _ = client.unary(SEARCH, {"path": seed_tree, "pattern": "main.py"})
    assert st == 200
    assert [e["path"] for e in r["entries"]] == [
        "/tmp/conch-doc-api/linked/main.py",
        "/tmp/conch-doc-api/target/main.py",
    ]


def test_search_file_root(client, seed_tree):
    st, r, _ = client.unary(SEARCH, {"path": "/tmp/conch-doc-api/remote.txt", "pattern": "*.txt"})
    assert st == 200 and [e["path"] for e in r["entries"]] == ["/tmp/conch-doc-api/remote.txt"]
    st, r, _ = client.unary(SEARCH, {"path": "/tmp/conch-doc-api/remote.txt", "pattern": "*.py"})
    assert st == 200 and r.get("entries", []) == []


@pytest.mark.parametrize("body,status,code,message", [
    ({"pattern": "*"}, 400, "invalid_argument", "path is required"),
    ({"path": "/tmp"}, 400, "invalid_argument", "pattern is required"),
    ({"path": "/tmp", "pattern": ""}, 400, "invalid_argument", "pattern is required"),
    ({"path": "tmp", "pattern": "*"}, 400, "invalid_argument", "filepath must be a normalized absolute guest path for search files"),
    ({"path": "/tmp/\u0000", "pattern": "*"}, 400, "invalid_argument", "filepath contains a NUL byte for search files"),
    ({"path": "/tmp", "pattern": "["}, 400, "invalid_argument", 'invalid search pattern "[": syntax error in pattern'),
    ({"path": "/tmp", "pattern": "[]a]"}, 400, "invalid_argument", 'invalid search pattern "[]a]": syntax error in pattern'),
    ({"path": "/tmp", "pattern": "a[b-]"}, 400, "invalid_argument", 'invalid search pattern "a[b-]": syntax error in pattern'),
    ({"path": "/tmp", "pattern": "*", "excludePatterns": ["ok", "x["]}, 400, "invalid_argument", 'invalid exclude pattern "x[": syntax error in pattern'),
    ({"path": "/no/such", "pattern": "*"}, 404, "not_found", "path not found: /no/such"),
])
def test_search_errors(client, body, status, code, message):
    st, r, _ = client.unary(SEARCH, body)
    assert (st, r) == (status, {"code": code, "message": message})


def test_search_pattern_quoted_like_go(client):
    # a trailing backslash is a syntax error; Go's %q doubles the backslash
    st, r, _ = client.unary(SEARCH, {"path": "/tmp", "pattern": "a\\"})
    assert (st, r) == (400, {"code": "invalid_argument",
                             "message": 'invalid search pattern "a\\\\": syntax error in pattern'})


# ---------------------------------------------------------------- errors over h2

@pytest.mark.parametrize("mode", ["h2-prior", "h2-upgrade"])
def test_errors_over_h2(server, mode):
    flags = HTTP_MODES[mode]
    code, data = curl_post(server.url, LIST, b'{"path":"/no/such"}', "application/json",
                           server.token, flags)
    assert code == 404
    assert json.loads(data) == {"code": "not_found", "message": "path not found: /no/such"}
    code, data = curl_post(server.url, DOWNLOAD, json_envelopes([{"filepath": "/tmp"}]),
                           "application/connect+json", server.token, flags)
    assert code == 200
    msgs, end = split_stream(data)
    assert msgs == [] and end["error"] == {"code": "invalid_argument",
                                           "message": "path is a directory: /tmp"}
    code, data = curl_post(server.url, UPLOAD, b"", "application/connect+json", server.token,
                           flags)
    assert code == 200
    msgs, end = split_stream(data)
    assert msgs == [] and end["error"] == {"code": "invalid_argument",
                                           "message": "no file chunks provided"}
