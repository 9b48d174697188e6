"""The rest of the file surface (api.md §9): Stat, MakeDir, Move, Remove,
WatchDir and GET /metrics — over HTTP/1.1 and HTTP/2 (curl, python3-h2,
grpcio), every error text, cross-filesystem moves (/dev/shm is tmpfs, the
test tree is on the repository's disk), symlinks never followed by Remove,
inotify events within 100 ms, overflow with a client that does not read
(bounded RSS, /health still at once), no inotify watch left behind, and
/metrics against /proc."""
import json
import os
import shutil
import signal
import socket
import stat
import struct
import subprocess
import time
import urllib.request

import grpc
import pytest

import agent_pb2 as pb
from conftest import BIN, serve, status_kib
from conch import RawStream, envelope, parse_envelopes
from files_util import curl_post
from h2conn import H2Client

FS = "/pb.FileService/"
MODES = {"http1": ["--http1.1"], "h2-prior": ["--http2-prior-knowledge"]}
KA_MS = 400


@pytest.fixture(scope="module")
def server():
    # its own server: the inotify fd checks must see this module's watches only
    yield from serve("test_files_more", env={"CONCH_FS_WATCH_KEEPALIVE_MS": str(KA_MS)})


@pytest.fixture()
def shm_dir():
    d = f"/dev/shm/conch-test-{os.getpid()}-{time.monotonic_ns()}"
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def call(server, mode, method, body, proto_cls=None):
    """One unary Connect call with curl → (http status, parsed answer)."""
    if proto_cls:
        code, data = curl_post(server.url, FS + method, body.SerializeToString(), "application/proto",
                               server.token, MODES[mode])
        if code == 200:
            return code, proto_cls.FromString(data)
        return code, json.loads(data)
    code, data = curl_post(server.url, FS + method, json.dumps(body).encode(), "application/json",
                           server.token, MODES[mode])
    return code, json.loads(data)


def perms(mode):
    return stat.filemode(mode)


# ------------------------------------------------------------------ path rules

BAD_PATHS = [
    ("", "filepath is required for {}"),
    ("/a\u0000b", "filepath contains a NUL byte for {}"),
    ("etc/passwd", "filepath must be a normalized absolute guest path for {}"),
    ("/a/../b", "filepath must be a normalized absolute guest path for {}"),
    ("/a//b", "filepath must be a normalized absolute guest path for {}"),
    ("/a/", "filepath must be a normalized absolute guest path for {}"),
    ("/a/./b", "filepath must be a normalized absolute guest path for {}"),
]
VERBS = [("Stat", "path", "stat"), ("MakeDir", "path", "make directory"), ("Remove", "path", "remove"),
         ("Move", "source", "move"), ("Move", "destination", "move")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("method,field,verb", VERBS)
def test_path_rules(server, mode, method, field, verb, tmp_path):
    for bad, text in BAD_PATHS:
        body = {field: bad}
        if method == "Move":
            body = {"source": str(tmp_path / "x"), "destination": str(tmp_path / "y")}
            body[field] = bad
        code, ans = call(server, mode, method, body)
        assert (code, ans) == (400, {"code": "invalid_argument", "message": text.format(verb)}), bad


@pytest.mark.parametrize("mode", MODES)
def test_watch_path_rules(server, mode):
    for bad, text in BAD_PATHS:
        msgs, end = stream_curl(server, mode, {"path": bad})
        assert msgs == [] and end == {"error": {"code": "invalid_argument",
                                                "message": text.format("watch directory")}}, bad


# ------------------------------------------------------------------ Stat

@pytest.mark.parametrize("mode", MODES)
def test_stat(server, mode, tmp_path):
    f = tmp_path / "f.txt"
    f.write_bytes(b"hello")
    os.chmod(f, 0o640)
    os.symlink("nowhere", tmp_path / "broken")
    os.symlink("f.txt", tmp_path / "good")
    st = os.stat(f)
    code, ans = call(server, mode, "Stat", {"path": str(f)})
    assert code == 200
    assert ans == {"entry": {"name": "f.txt", "path": str(f), "type": "file", "size": "5",
                             "permissions": "-rw-r-----",
                             "modifiedTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime))}}
    code, ans = call(server, mode, "Stat", {"path": str(tmp_path)})
    assert code == 200 and ans["entry"]["isDirectory"] is True and ans["entry"]["type"] == "directory"
    # a link is followed; one that leads nowhere is reported itself
    code, ans = call(server, mode, "Stat", {"path": str(tmp_path / "good")})
    assert ans["entry"]["name"] == "good" and ans["entry"]["size"] == "5"
    code, ans = call(server, mode, "Stat", {"path": str(tmp_path / "broken")})
    assert code == 200 and ans["entry"]["permissions"] == "Lrwxrwxrwx" and ans["entry"]["type"] == "file"
    code, ans = call(server, mode, "Stat", {"path": str(tmp_path / "none")})
    assert (code, ans) == (404, {"code": "not_found", "message": f"path not found: {tmp_path}/none"})
    code, ans = call(server, mode, "Stat", {"path": "/"})
    assert code == 200 and ans["entry"]["name"] == "/" and ans["entry"]["path"] == "/"
    # the proto codec
    code, res = call(server, mode, "Stat", pb.StatRequest(path=str(f)), pb.StatResponse)
    assert code == 200 and res.entry.size == 5 and res.entry.permissions == "-rw-r-----"


# ------------------------------------------------------------------ MakeDir

@pytest.mark.parametrize("mode", MODES)
def test_make_dir(server, mode, tmp_path):
    d = tmp_path / "a" / "b" / "c"
    code, ans = call(server, mode, "MakeDir", {"path": str(d)})
    assert code == 200 and ans["entry"]["path"] == str(d) and ans["entry"]["isDirectory"] is True
    for p in (tmp_path / "a", tmp_path / "a" / "b", d):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o755
    code, ans = call(server, mode, "MakeDir", {"path": str(d)})
    assert (code, ans) == (409, {"code": "already_exists", "message": f"directory already exists: {d}"})
    (tmp_path / "file").write_text("x")
    code, ans = call(server, mode, "MakeDir", {"path": str(tmp_path / "file")})
    assert (code, ans) == (409, {"code": "already_exists",
                                 "message": f"path exists and is not a directory: {tmp_path}/file"})
    code, ans = call(server, mode, "MakeDir", {"path": str(tmp_path / "file" / "sub")})
    assert (code, ans) == (500, {"code": "internal",
                                 "message": f"make directory {tmp_path}/file/sub: not a directory"})
    code, ans = call(server, mode, "MakeDir", {"path": "/"})
    assert (code, ans) == (409, {"code": "already_exists", "message": "directory already exists: /"})
    code, res = call(server, mode, "MakeDir", pb.MakeDirRequest(path=str(tmp_path / "p")), pb.MakeDirResponse)
    assert code == 200 and res.entry.is_directory and os.path.isdir(tmp_path / "p")


# ------------------------------------------------------------------ Move

@pytest.mark.parametrize("mode", MODES)
def test_move_same_fs(server, mode, tmp_path):
    (tmp_path / "src.txt").write_text("data")
    dst = tmp_path / "new" / "parent" / "dst.txt"
    code, ans = call(server, mode, "Move", {"source": str(tmp_path / "src.txt"), "destination": str(dst)})
    assert code == 200 and ans["entry"]["path"] == str(dst) and ans["entry"]["size"] == "4"
    assert dst.read_text() == "data" and not (tmp_path / "src.txt").exists()
    code, ans = call(server, mode, "Move", {"source": str(tmp_path / "gone"), "destination": str(dst)})
    assert (code, ans) == (404, {"code": "not_found", "message": f"path not found: {tmp_path}/gone"})
    code, ans = call(server, mode, "Move", {"source": "/", "destination": str(dst)})
    assert (code, ans) == (400, {"code": "invalid_argument", "message": "refusing to move /"})
    code, ans = call(server, mode, "Move", {"source": str(dst), "destination": "/"})
    assert (code, ans) == (400, {"code": "invalid_argument", "message": "refusing to move onto /"})
    # a file onto a directory: the OS error, source untouched
    (tmp_path / "dir").mkdir()
    code, ans = call(server, mode, "Move", {"source": str(dst), "destination": str(tmp_path / "dir")})
    assert (code, ans) == (500, {"code": "internal",
                                 "message": f"move {dst} to {tmp_path}/dir: is a directory"})
    assert dst.read_text() == "data"
    code, res = call(server, mode, "Move", pb.MoveRequest(source=str(dst), destination=str(tmp_path / "z")),
                     pb.MoveResponse)
    assert code == 200 and res.entry.name == "z" and (tmp_path / "z").read_text() == "data"


def leftovers(d):
    return [n for n in os.listdir(d) if n.startswith(".conch-move-")]


@pytest.mark.parametrize("mode", MODES)
def test_move_cross_fs(server, mode, tmp_path, shm_dir):
    assert os.stat(shm_dir).st_dev != os.stat(tmp_path).st_dev, "need two filesystems"
    data = os.urandom(3 * 1024 * 1024 + 7)
    src = os.path.join(shm_dir, "big.bin")
    with open(src, "wb") as f:
        f.write(data)
    os.chmod(src, 0o600)
    os.utime(src, (1_600_000_000, 1_600_000_000))
    dst = tmp_path / "into" / "big.bin"
    code, ans = call(server, mode, "Move", {"source": src, "destination": str(dst)})
    assert code == 200, ans
    assert ans["entry"] == {"name": "big.bin", "path": str(dst), "type": "file", "size": str(len(data)),
                            "permissions": "-rw-------", "modifiedTime": "2020-09-13T12:26:40Z"}
    assert dst.read_bytes() == data and not os.path.exists(src)
    assert leftovers(tmp_path / "into") == []
    # a tree the other way: a file, a subdirectory, a dangling link, a FIFO
    t = tmp_path / "tree"
    (t / "sub").mkdir(parents=True)
    (t / "sub" / "f").write_text("f")
    os.symlink("/nowhere", t / "link")
    os.mkfifo(t / "fifo")
    os.chmod(t / "sub", 0o750)
    back = os.path.join(shm_dir, "tree2")
    code, ans = call(server, mode, "Move", {"source": str(t), "destination": back})
    assert code == 200 and ans["entry"]["isDirectory"] is True
    assert not t.exists()
    assert open(os.path.join(back, "sub", "f")).read() == "f"
    assert os.readlink(os.path.join(back, "link")) == "/nowhere"
    assert stat.S_ISFIFO(os.lstat(os.path.join(back, "fifo")).st_mode)
    assert stat.S_IMODE(os.stat(os.path.join(back, "sub")).st_mode) == 0o750
    assert leftovers(shm_dir) == []
    # onto a non-empty directory of the other filesystem: fails, the source
    # is kept and no copy is left
    (tmp_path / "full" / "x").mkdir(parents=True)
    code, ans = call(server, mode, "Move", {"source": back, "destination": str(tmp_path / "full")})
    assert (code, ans) == (500, {"code": "internal",
                                 "message": f"move {back} to {tmp_path}/full: directory not empty"})
    assert os.path.isdir(back) and leftovers(tmp_path) == []


# ------------------------------------------------------------------ Remove

@pytest.mark.parametrize("mode", MODES)
def test_remove(server, mode, tmp_path):
    outside = tmp_path / "outside"
    (outside / "keep").mkdir(parents=True)
    (outside / "keep" / "precious").write_text("p")
    t = tmp_path / "t"
    (t / "a" / "b").mkdir(parents=True)
    (t / "a" / "b" / "f").write_text("f")
    os.symlink(outside, t / "a" / "link-dir")          # must not be followed
    os.symlink(outside / "keep" / "precious", t / "link-file")
    os.chmod(t / "a" / "b", 0o500)                     # root removes it all the same
    code, ans = call(server, mode, "Remove", {"path": str(t)})
    assert (code, ans) == (200, {})
    assert not t.exists() and (outside / "keep" / "precious").read_text() == "p"
    # a symlink as the path itself: the link goes, its target stays
    os.symlink(outside, tmp_path / "l")
    code, ans = call(server, mode, "Remove", {"path": str(tmp_path / "l")})
    assert code == 200 and not os.path.lexists(tmp_path / "l") and outside.is_dir()
    (tmp_path / "file").write_text("x")
    code, ans = call(server, mode, "Remove", {"path": str(tmp_path / "file")})
    assert code == 200 and not (tmp_path / "file").exists()
    code, ans = call(server, mode, "Remove", {"path": str(tmp_path / "file")})
    assert (code, ans) == (404, {"code": "not_found", "message": f"path not found: {tmp_path}/file"})
    code, ans = call(server, mode, "Remove", {"path": "/"})
    assert (code, ans) == (400, {"code": "invalid_argument", "message": "refusing to remove /"})
    code, res = call(server, mode, "Remove", pb.RemoveRequest(path=str(outside)), pb.RemoveResponse)
    assert code == 200 and not outside.exists()


def test_remove_does_not_enter_mounts(server, shm_dir):
    """A mount point inside the tree is not emptied (here: a bind mount)."""
    t = os.path.join(shm_dir, "t")
    mnt = os.path.join(t, "mnt")
    other = os.path.join(shm_dir, "other")
    os.makedirs(mnt)
    os.makedirs(other)
    open(os.path.join(other, "keep"), "w").close()
    subprocess.run(["mount", "--bind", other, mnt], check=True)
    try:
        # a bind mount of the same tmpfs has the same st_dev: make the mount a
        # tmpfs of its own instead, which is what matters
        subprocess.run(["umount", mnt], check=True)
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", mnt], check=True)
        open(os.path.join(mnt, "inside"), "w").close()
        code, ans = call(server, "http1", "Remove", {"path": t})
        assert (code, ans) == (500, {"code": "internal", "message": f"remove {mnt}: device or resource busy"})
        assert os.path.exists(os.path.join(mnt, "inside"))
    finally:
        subprocess.run(["umount", mnt], check=False)


def test_remove_deep_tree(server, shm_dir):
    """Deeper than PATH_MAX: removed through directory fds."""
    d = os.open(shm_dir, os.O_RDONLY)
    os.mkdir("deep", dir_fd=d)
    fd = os.open("deep", os.O_RDONLY, dir_fd=d)
    os.close(d)
    for _ in range(600):  # 600 × "dddddddddd/" > 4096 bytes
        os.mkdir("dddddddddd", dir_fd=fd)
        nfd = os.open("dddddddddd", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    os.close(fd)
    code, ans = call(server, "http1", "Remove", {"path": os.path.join(shm_dir, "deep")})
    assert (code, ans) == (200, {})
    assert os.listdir(shm_dir) == []


# ------------------------------------------------------------------ gRPC

def grpc_stubs(ch):
    u = lambda name, req, res: ch.unary_unary(FS + name, request_serializer=req.SerializeToString,
                                              response_deserializer=res.FromString)
    return {
        "stat": u("Stat", pb.StatRequest, pb.StatResponse),
        "mkdir": u("MakeDir", pb.MakeDirRequest, pb.MakeDirResponse),
        "move": u("Move", pb.MoveRequest, pb.MoveResponse),
        "remove": u("Remove", pb.RemoveRequest, pb.RemoveResponse),
        "watch": ch.unary_stream(FS + "WatchDir", request_serializer=pb.WatchDirRequest.SerializeToString,
                                 response_deserializer=pb.WatchDirEvent.FromString),
    }


def test_grpc(server, tmp_path):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    grpc.channel_ready_future(ch).result(timeout=10)
    s = grpc_stubs(ch)
    md = [("conch-init-token", server.token)]
    try:
        r = s["mkdir"](pb.MakeDirRequest(path=str(tmp_path / "d")), metadata=md, timeout=10)
        assert r.entry.is_directory and r.entry.permissions == "drwxr-xr-x"
        r = s["stat"](pb.StatRequest(path=str(tmp_path / "d")), metadata=md, timeout=10)
        assert r.entry.name == "d"
        r = s["move"](pb.MoveRequest(source=str(tmp_path / "d"), destination=str(tmp_path / "e")),
                      metadata=md, timeout=10)
        assert r.entry.path == str(tmp_path / "e")
        s["remove"](pb.RemoveRequest(path=str(tmp_path / "e")), metadata=md, timeout=10)
        assert not (tmp_path / "e").exists()
        for stub, req, code, text in [
            ("stat", pb.StatRequest(path=str(tmp_path / "e")), grpc.StatusCode.NOT_FOUND,
             f"path not found: {tmp_path}/e"),
            ("mkdir", pb.MakeDirRequest(path=str(tmp_path)), grpc.StatusCode.ALREADY_EXISTS,
             f"directory already exists: {tmp_path}"),
            ("move", pb.MoveRequest(source="/", destination="/x"), grpc.StatusCode.INVALID_ARGUMENT,
             "refusing to move /"),
            ("remove", pb.RemoveRequest(path="/"), grpc.StatusCode.INVALID_ARGUMENT, "refusing to remove /"),
            ("remove", pb.RemoveRequest(path="x"), grpc.StatusCode.INVALID_ARGUMENT,
             "filepath must be a normalized absolute guest path for remove"),
        ]:
            with pytest.raises(grpc.RpcError) as ei:
                s[stub](req, metadata=md, timeout=10)
            assert (ei.value.code(), ei.value.details()) == (code, text)
        # WatchDir: start, then an event
        it = s["watch"](pb.WatchDirRequest(path=str(tmp_path)), metadata=md, timeout=20)
        first = next(it)
        assert first.WhichOneof("event") == "start"
        (tmp_path / "g").write_text("x")
        ev = next(e for e in it if e.WhichOneof("event") == "filesystem")
        assert (ev.filesystem.name, ev.filesystem.type) == ("g", pb.EVENT_TYPE_CREATE)
        assert ev.filesystem.entry.path == str(tmp_path / "g")
        it.cancel()
        with pytest.raises(grpc.RpcError) as ei:
            list(s["watch"](pb.WatchDirRequest(path=str(tmp_path / "g")), metadata=md, timeout=10))
        assert (ei.value.code(), ei.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT,
                                                         f"path is not a directory: {tmp_path}/g")
    finally:
        ch.close()


# ------------------------------------------------------------------ WatchDir clients

class Watch1(RawStream):
    """A WatchDir stream over HTTP/1.1 on a raw socket (conch.RawStream)."""

    def __init__(self, server, req, rcvbuf=None):
        super().__init__(server.port, server.token, f"{FS}WatchDir", req, rcvbuf)


class Watch2:
    """The same over HTTP/2 (python3-h2)."""

    def __init__(self, server, req):
        self.h = H2Client("127.0.0.1", server.port)
        self.sid = self.h.connect_stream(FS + "WatchDir", [json.dumps(req).encode()], server.token,
                                         ctype="application/connect+json")
        self.used = 0
        self.end = None

    def poll(self, timeout):
        self.h.pump(timeout)
        body = bytes(self.h.streams[self.sid].body)
        out = []
        while len(body) - self.used >= 5:
            flags, n = struct.unpack(">BI", body[self.used:self.used + 5])
            if len(body) - self.used < 5 + n:
                break
            p = body[self.used + 5:self.used + 5 + n]
            self.used += 5 + n
            if flags & 2:
                self.end = json.loads(p)
            else:
                out.append(json.loads(p))
        return out

    def close(self):
        self.h.close()


WATCHERS = {"http1": Watch1, "h2": Watch2}


def next_event(w, timeout=5.0, want=None):
    """The next message that is not a keepalive (or the one `want` accepts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for m in w.poll(0.02):
            if "keepalive" in m:
                continue
            if want is None or want(m):
                return m
        if w.end is not None:
            return None
    raise AssertionError("no event in time")


def fs_events(w, n, timeout=5.0):
    """Up to n filesystem events as (name, type, entry, arrival time); what
    arrived beyond them waits in w.pending for the next call."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        if not w.pending:
            if time.monotonic() >= deadline:
                break
            now = time.monotonic()
            w.pending = [(m, now) for m in w.poll(0.02)]
            continue
        m, at = w.pending.pop(0)
        if "filesystem" in m:
            out.append((m["filesystem"]["name"], m["filesystem"]["type"], m["filesystem"].get("entry"), at))
    return out


def open_watch(server, kind, path, recursive=False):
    w = WATCHERS[kind](server, {"path": path, "recursive": recursive})
    w.pending = []
    first = next_event(w)
    assert first == {"start": {}}
    return w


def inotify_watches(pid):
    """{fd: number of watches} of the daemon's inotify instances."""
    out = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                out[fd] = sum(1 for line in f if line.startswith("inotify wd:"))
        except FileNotFoundError:
            pass
    return out


def wait_no_inotify(pid, timeout=5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not inotify_watches(pid):
            return
        time.sleep(0.02)
    raise AssertionError(f"inotify watches left: {inotify_watches(pid)}")


def stream_curl(server, mode, req):
    """A whole (short) WatchDir call with curl → (messages, end)."""
    code, data = curl_post(server.url, FS + "WatchDir", envelope(json.dumps(req).encode()),
                           "application/connect+json", server.token, MODES[mode])
    assert code == 200
    msgs, end = [], None
    for flags, p in parse_envelopes(data):
        if flags & 2:
            end = json.loads(p)
        else:
            msgs.append(json.loads(p))
    return msgs, end


# ------------------------------------------------------------------ WatchDir

@pytest.mark.parametrize("kind", WATCHERS)
def test_watch_events_flat(server, kind, tmp_path):
    wait_no_inotify(server.proc.pid)
    (tmp_path / "sub").mkdir()
    w = open_watch(server, kind, str(tmp_path))
    try:
        assert list(inotify_watches(server.proc.pid).values()) == [1]  # not recursive: the root only
        steps = []

        def step(fn, name, typ, has_entry=True):
            t0 = time.monotonic()
            fn()
            ev = fs_events(w, 1)
            assert ev, f"no event for {typ} {name}"
            got_name, got_type, entry, t1 = ev[0]
            assert (got_name, got_type) == (name, typ)
            assert (entry is not None) == has_entry
            steps.append((typ, round((t1 - t0) * 1000, 1)))
            assert t1 - t0 < 0.1, f"{typ} took {(t1 - t0) * 1000:.1f} ms"
            return entry

        f = tmp_path / "a.txt"
        e = step(lambda: os.close(os.open(f, os.O_CREAT | os.O_WRONLY, 0o644)), "a.txt", "EVENT_TYPE_CREATE")
        assert e["path"] == str(f) and e["name"] == "a.txt" and e["type"] == "file"

        def write():
            with open(f, "ab") as fh:
                fh.write(b"12345")
        e = step(write, "a.txt", "EVENT_TYPE_WRITE")
        assert e["size"] == "5"
        e = step(lambda: os.chmod(f, 0o600), "a.txt", "EVENT_TYPE_CHMOD")
        assert e["permissions"] == "-rw-------"
        step(lambda: os.rename(f, tmp_path / "b.txt"), "a.txt", "EVENT_TYPE_RENAME", has_entry=False)
        ev = fs_events(w, 1)
        assert ev[0][:2] == ("b.txt", "EVENT_TYPE_RENAME") and ev[0][2]["path"] == str(tmp_path / "b.txt")
        step(lambda: os.unlink(tmp_path / "b.txt"), "b.txt", "EVENT_TYPE_REMOVE", has_entry=False)
        # not recursive: inside sub nothing is reported
        (tmp_path / "sub" / "inner").write_text("x")
        step(lambda: os.mkdir(tmp_path / "d2"), "d2", "EVENT_TYPE_CREATE")
        print("latencies (ms):", steps)
    finally:
        w.close()
    wait_no_inotify(server.proc.pid)


@pytest.mark.parametrize("kind", WATCHERS)
def test_watch_recursive(server, kind, tmp_path):
    wait_no_inotify(server.proc.pid)
    (tmp_path / "x" / "y").mkdir(parents=True)
    w = open_watch(server, kind, str(tmp_path), recursive=True)
    try:
        assert list(inotify_watches(server.proc.pid).values()) == [3]
        t0 = time.monotonic()
        (tmp_path / "x" / "y" / "deep.txt").write_text("d")
        ev = fs_events(w, 2)
        assert [e[:2] for e in ev] == [("x/y/deep.txt", "EVENT_TYPE_CREATE"), ("x/y/deep.txt", "EVENT_TYPE_WRITE")]
        assert ev[0][3] - t0 < 0.1
        # a new directory is followed, and what it already holds is reported
        os.makedirs(tmp_path / "n1" / "n2")
        (tmp_path / "n1" / "n2" / "f").write_text("f")
        ev = fs_events(w, 4)
        names = [(e[0], e[1]) for e in ev]
        assert names[:3] == [("n1", "EVENT_TYPE_CREATE"), ("n1/n2", "EVENT_TYPE_CREATE"),
                             ("n1/n2/f", "EVENT_TYPE_CREATE")], names
        assert inotify_watches(server.proc.pid) and list(inotify_watches(server.proc.pid).values()) == [5]
        fs_events(w, 1, timeout=0.3)  # the write, maybe
        # a directory renamed inside the tree keeps being watched under its new name
        os.rename(tmp_path / "n1", tmp_path / "m1")
        ev = fs_events(w, 2)
        assert [(e[0], e[1], e[2] is None) for e in ev] == [("n1", "EVENT_TYPE_RENAME", True),
                                                          ("m1", "EVENT_TYPE_RENAME", False)]
        t0 = time.monotonic()
        os.chmod(tmp_path / "m1" / "n2" / "f", 0o600)
        ev = fs_events(w, 1)
        assert ev[0][:2] == ("m1/n2/f", "EVENT_TYPE_CHMOD") and ev[0][3] - t0 < 0.1
        # removing a subtree drops its watches
        shutil.rmtree(tmp_path / "m1")
        ev = fs_events(w, 3)
        assert ("m1/n2/f", "EVENT_TYPE_REMOVE") in [e[:2] for e in ev]
        deadline = time.monotonic() + 2
        while list(inotify_watches(server.proc.pid).values()) != [3] and time.monotonic() < deadline:
            fs_events(w, 1, timeout=0.05)
        assert list(inotify_watches(server.proc.pid).values()) == [3]
    finally:
        w.close()
    wait_no_inotify(server.proc.pid)


@pytest.mark.parametrize("kind", WATCHERS)
def test_watch_root_removed_ends_ok(server, kind, tmp_path):
    wait_no_inotify(server.proc.pid)
    root = tmp_path / "r"
    (root / "s").mkdir(parents=True)
    w = open_watch(server, kind, str(root), recursive=True)
    shutil.rmtree(root)
    evs = []
    deadline = time.monotonic() + 5
    while w.end is None and time.monotonic() < deadline:
        evs += [m for m in w.poll(0.05) if "filesystem" in m]
    assert w.end == {}, "the stream ends OK"
    assert evs[-1] == {"filesystem": {"name": ".", "type": "EVENT_TYPE_REMOVE"}}
    assert {"filesystem": {"name": "s", "type": "EVENT_TYPE_REMOVE"}} in evs
    w.close()
    wait_no_inotify(server.proc.pid)


def test_watch_root_renamed_ends_ok(server, tmp_path):
    """The watched directory renamed: RENAME "." and the stream ends OK."""
    wait_no_inotify(server.proc.pid)
    (tmp_path / "r").mkdir()
    w = open_watch(server, "http1", str(tmp_path / "r"))
    os.rename(tmp_path / "r", tmp_path / "r2")
    evs = []
    deadline = time.monotonic() + 5
    while w.end is None and time.monotonic() < deadline:
        evs += [m for m in w.poll(0.05) if "filesystem" in m]
    assert w.end == {} and evs == [{"filesystem": {"name": ".", "type": "EVENT_TYPE_RENAME"}}]
    w.close()
    wait_no_inotify(server.proc.pid)


def test_watch_dir_moved_out_is_dropped(server, tmp_path):
    """A directory moved out of a recursive watch loses its watches; one
    moved in gains them."""
    pid = server.proc.pid
    wait_no_inotify(pid)
    (tmp_path / "in" / "d" / "e").mkdir(parents=True)
    (tmp_path / "out" / "m" / "n").mkdir(parents=True)
    w = open_watch(server, "h2", str(tmp_path / "in"), recursive=True)
    try:
        assert list(inotify_watches(pid).values()) == [3]
        os.rename(tmp_path / "in" / "d", tmp_path / "out" / "d")
        assert fs_events(w, 1)[0][:2] == ("d", "EVENT_TYPE_RENAME")
        (tmp_path / "out" / "d" / "x").write_text("x")  # outside now: not reported
        os.rename(tmp_path / "out" / "m", tmp_path / "in" / "m")
        ev = fs_events(w, 1)
        assert ev[0][:2] == ("m", "EVENT_TYPE_RENAME") and ev[0][2]["isDirectory"] is True
        t0 = time.monotonic()
        (tmp_path / "in" / "m" / "n" / "y").write_text("y")
        ev = fs_events(w, 1)
        assert ev[0][:2] == ("m/n/y", "EVENT_TYPE_CREATE") and ev[0][3] - t0 < 0.1
        assert list(inotify_watches(pid).values()) == [3]  # root, m, m/n
    finally:
        w.close()
    wait_no_inotify(pid)


@pytest.mark.parametrize("mode", MODES)
def test_watch_errors(server, mode, tmp_path):
    (tmp_path / "f").write_text("x")
    assert stream_curl(server, mode, {"path": str(tmp_path / "f")}) == (
        [], {"error": {"code": "invalid_argument", "message": f"path is not a directory: {tmp_path}/f"}})
    assert stream_curl(server, mode, {"path": str(tmp_path / "no")}) == (
        [], {"error": {"code": "not_found", "message": f"path not found: {tmp_path}/no"}})


def test_watch_keepalive_and_deadline(server, tmp_path):
    """keepalive after KA_MS of silence; a deadline ends the stream and its watch."""
    code, data = curl_post(server.url, FS + "WatchDir",
                           envelope(json.dumps({"path": str(tmp_path)}).encode()),
                           "application/connect+json", server.token, MODES["h2-prior"],
                           extra_headers=["Connect-Timeout-Ms: 1100"])
    msgs = [json.loads(p) for f, p in parse_envelopes(data) if not f & 2]
    end = [json.loads(p) for f, p in parse_envelopes(data) if f & 2]
    assert msgs[0] == {"start": {}}
    assert msgs[1:] and all(m == {"keepalive": {}} for m in msgs[1:]), msgs
    assert 1 <= len(msgs) - 1 <= 3
    assert end[0]["error"]["code"] == "deadline_exceeded"
    wait_no_inotify(server.proc.pid)


@pytest.fixture()
def lean_server():
    """A server whose ASan quarantine does not count freed memory as held."""
    yield from serve("watch-overflow", env={
        "ASAN_OPTIONS": "quarantine_size_mb=1:allocator_release_to_os_interval_ms=200:detect_leaks=1:"
                        "abort_on_error=0"})


def test_watch_overflow_slow_client(lean_server, shm_dir):
    """100 000 events into a stream whose client does not read: one overflow,
    bounded RSS, /health at once; then events resume."""
    server = lean_server
    pid = server.proc.pid
    rss0 = status_kib(pid, "VmRSS")
    w = Watch1(server, {"path": shm_dir}, rcvbuf=64 * 1024)
    w.pending = []
    try:
        overflow_body(server, w, shm_dir, rss0)
    finally:
        w.close()
    wait_no_inotify(pid)


def overflow_body(server, w, shm_dir, rss0):
    pid = server.proc.pid
    assert next_event(w) == {"start": {}}
    stem = "n" * 120
    fd = os.open(shm_dir, os.O_RDONLY)
    t0 = time.monotonic()
    for i in range(100_000):
        os.close(os.open(f"{stem}{i:06d}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    os.close(fd)
    made = time.monotonic() - t0
    time.sleep(1.0)
    rss1 = status_kib(pid, "VmRSS")
    t1 = time.monotonic()
    with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
        assert r.read() == b'{"status":"OK","message":"OK"}'
    health_ms = (time.monotonic() - t1) * 1000
    # now read it all
    creates, overflows, after_ovf = 0, 0, 0
    deadline = time.monotonic() + 120
    quiet = 0
    while time.monotonic() < deadline and quiet < 20:
        got = w.poll(0.1)
        quiet = 0 if got else quiet + 1
        for m in got:
            if "overflow" in m:
                overflows += 1
            elif "filesystem" in m:
                creates += 1
                if overflows:
                    after_ovf += 1
    print(f"made 100000 files in {made:.1f}s; received {creates} creates, {overflows} overflow(s); "
          f"RSS {rss0} -> {rss1} KiB; /health {health_ms:.1f} ms")
    assert overflows == 1
    assert 0 < creates < 100_000
    assert rss1 - rss0 < 40 * 1024, f"RSS grew {rss1 - rss0} KiB"
    assert health_ms < 500
    # events resume after the overflow
    open(os.path.join(shm_dir, "after"), "w").close()
    ev = fs_events(w, 1)
    assert ev and ev[0][:2] == ("after", "EVENT_TYPE_CREATE")


MAX_QUEUED = "/proc/sys/fs/inotify/max_queued_events"


@pytest.mark.parametrize("kind", WATCHERS)
def test_watch_kernel_queue_overflow(server, kind, tmp_path):
    """The kernel's own queue overflowing (IN_Q_OVERFLOW) becomes one
    `overflow` event, then events resume.  The inotify instance is made
    with a 16-event kernel queue (max_queued_events is read when an
    instance is created), the daemon is stopped while 200 files appear:
    the kernel drops all but 16 of them, far below the stream's own bound
    (4096), so the overflow can only be the kernel's."""
    with open(MAX_QUEUED) as f:
        saved = f.read().strip()
    with open(MAX_QUEUED, "w") as f:
        f.write("16")
    try:
        w = open_watch(server, kind, str(tmp_path))
    finally:
        with open(MAX_QUEUED, "w") as f:
            f.write(saved)
    pid = server.proc.pid
    try:
        os.kill(pid, signal.SIGSTOP)
        try:
            for i in range(200):
                (tmp_path / f"f{i:03d}").touch()
        finally:
            os.kill(pid, signal.SIGCONT)
        msgs = []
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any("overflow" in m for m in msgs):
            msgs += [m for m in w.poll(0.05) if "keepalive" not in m]
        kinds = [next(iter(m)) for m in msgs]
        assert kinds.count("overflow") == 1, kinds
        creates = [m for m in msgs if "filesystem" in m]
        assert len(creates) <= 16, len(creates)
        assert all(m["filesystem"]["type"] == "EVENT_TYPE_CREATE" for m in creates)
        # and events resume
        (tmp_path / "after").touch()
        ev = fs_events(w, 1)
        assert ev and ev[0][:2] == ("after", "EVENT_TYPE_CREATE"), ev
    finally:
        w.close()
    wait_no_inotify(pid)


def test_watch_many_streams_no_leak(server, tmp_path):
    """Streams share one inotify instance and hold each watch together
    (the last one to drop a directory removes its watch); streams opened
    and dropped (disconnects) leave no inotify instance."""
    pid = server.proc.pid
    wait_no_inotify(pid)
    (tmp_path / "a" / "b").mkdir(parents=True)
    ws = []
    try:
        for i in range(10):
            ws.append(open_watch(server, "http1" if i % 2 else "h2", str(tmp_path), recursive=True))
        assert list(inotify_watches(pid).values()) == [3]  # one instance, one watch per directory
        for w in ws[:5]:
            w.close()
        ws = ws[5:]
        time.sleep(0.3)
        assert list(inotify_watches(pid).values()) == [3]  # still held by the other five
        (tmp_path / "a" / "b" / "f").touch()
        for w in ws:
            assert fs_events(w, 1)[0][:2] == ("a/b/f", "EVENT_TYPE_CREATE")
    finally:
        for w in ws:
            w.close()
    wait_no_inotify(pid)


# ------------------------------------------------------------------ /metrics

def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            out[k] = int(v.split()[0]) * 1024
    return out


def children(pid):
    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            s = open(f"/proc/{d}/stat").read()
        except OSError:
            continue
        rest = s[s.rindex(")") + 2:].split()
        if int(rest[1]) == pid and rest[0] not in "ZX":
            n += 1
    return n


@pytest.mark.parametrize("mode", MODES)
def test_metrics(server, mode):
    pid = server.proc.pid
    # two background processes and two idle connections more
    for tag in ("m1", "m2"):
        body = envelope(json.dumps({"cmd": "sleep", "args": ["30"], "background": True,
                                    "tag": f"{tag}-{mode}"}).encode())
        p = subprocess.Popen(["curl", "-sS", "-N", "--max-time", "1", *MODES[mode], "-X", "POST",
                              server.url + "/pb.ProcessService/StartProcess",
                              "-H", "Content-Type: application/connect+json",
                              "-H", f"conch-init-token: {server.token}", "--data-binary", "@-"],
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        p.communicate(body)
    extra = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(2)]
    try:
        time.sleep(0.2)
        r = subprocess.run(["curl", "-sS", *MODES[mode], "-w", "\n%{http_code}\n%{content_type}",
                            server.url + "/metrics", "-H", f"conch-init-token: {server.token}"],
                           capture_output=True, timeout=30, check=True)
        body, code, ctype = r.stdout.decode().rsplit("\n", 2)
        assert code == "200" and ctype == "application/json"
        m = json.loads(body)
        assert set(m) == {"ts", "cpuCount", "cpuUsedPct", "memTotal", "memUsed", "diskTotal", "diskUsed",
                          "processes", "connections", "agentRss",
                          "workloadMemoryMax", "workloadPidsMax", "oomKills",  # api.md §9, the envelope
                          "version", "upgrades",  # api.md §9, upgrading in place
                          "relaysHeld", "relaysReset"}  # port forwarding's relays
        for k in ("workloadMemoryMax", "workloadPidsMax", "oomKills", "upgrades", "relaysHeld", "relaysReset"):
            assert isinstance(m[k], int) and m[k] >= 0, (k, m[k])
        assert m["version"] == subprocess.run([BIN, "--version"], capture_output=True, text=True).stdout.split()[1]
        mi = meminfo()
        sv = os.statvfs("/")
        assert abs(m["ts"] - time.time()) < 5
        assert m["cpuCount"] == os.sysconf("SC_NPROCESSORS_ONLN")
        assert 0 <= m["cpuUsedPct"] <= 100
        assert m["memTotal"] == mi["MemTotal"]
        assert abs(m["memUsed"] - (mi["MemTotal"] - mi["MemAvailable"])) < 256 * 1024 * 1024
        assert m["diskTotal"] == sv.f_blocks * sv.f_frsize
        assert abs(m["diskUsed"] - (sv.f_blocks - sv.f_bfree) * sv.f_frsize) < 1024 * 1024 * 1024
        assert m["processes"] == children(pid) and m["processes"] >= 2
        assert m["connections"] >= 3  # this one and the two idle ones
        rss = status_kib(pid, "VmRSS") * 1024
        assert abs(m["agentRss"] - rss) < max(rss // 5, 4 * 1024 * 1024)
    finally:
        for s in extra:
            s.close()
        for tag in ("m1", "m2"):
            subprocess.run(["curl", "-sS", *MODES[mode], "-X", "POST",
                            server.url + "/pb.ProcessService/SendSignal",
                            "-H", "Content-Type: application/json", "-H", "Connect-Protocol-Version: 1",
                            "-H", f"conch-init-token: {server.token}",
                            "--data", json.dumps({"process": {"tag": f"{tag}-{mode}"}, "signal": 9})],
                           capture_output=True, timeout=30)


@pytest.mark.parametrize("mode", MODES)
def test_metrics_auth_and_method(server, mode):
    def get(*args):
        r = subprocess.run(["curl", "-sS", *MODES[mode], "-w", "\n%{http_code}", *args],
                           capture_output=True, timeout=30, check=True)
        body, code = r.stdout.decode().rsplit("\n", 1)
        return int(code), body
    assert get(server.url + "/metrics") == (401, '{"code":"unauthenticated","message":"agent token is required"}')
    assert get(server.url + "/metrics", "-H", "conch-init-token: wrong") == (
        401, '{"code":"unauthenticated","message":"agent token is invalid"}')
    code, _ = get("-X", "POST", server.url + "/metrics", "-H", f"conch-init-token: {server.token}")
    assert code == 405
