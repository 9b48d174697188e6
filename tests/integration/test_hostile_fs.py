"""Hostile paths against the file surface.

* A cross-filesystem Move whose source a second client keeps
  swapping between a regular file and a FIFO must never block a pool
  thread (the copy opened the FIFO after checking it was a regular file);
  Stat and StartProcess still answer within 3 s after 20 s of it.
* Remove of a tree holding a bind mount of the same filesystem
  (same st_dev) never descends into the mount: the bind source stays.
* A cross-filesystem Move of a tree holding a mount refuses before
  it changes anything (no copy left, the source whole).
* An upload whose directory is renamed meanwhile, and a `content`
  script whose cwd is renamed, leave no temp file behind.

The server runs in a private mount namespace (`unshare -m`, propagation
private): the bind mounts are made in it with nsenter, so nothing is ever
mounted on the host.  /dev/shm (tmpfs) and the test tree (the repository's
disk) are the two filesystems of the cross-filesystem moves.
"""
import base64
import json
import os
import shutil
import socket
import subprocess
import threading
import time

import pytest

import conftest
from conch import Client
from files_util import temp_leftovers
from test_process import wait_for

FS = "/pb.FileService/"
SP = "/pb.ProcessService/StartProcess"
RACE_S = float(os.environ.get("CONCH_FS_RACE_S", "20"))
ANSWER_S = 3.0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    wrap = tmp_path_factory.mktemp("unshare") / "conch-init-unshared"
    wrap.write_text(f'#!/bin/sh\nexec unshare -m --propagation private {conftest.BIN} "$@"\n')
    wrap.chmod(0o755)
    saved = conftest.BIN
    conftest.BIN = str(wrap)  # conftest.Server runs conftest.BIN
    try:
        gen = conftest.serve("test_hostile_fs")
        s = next(gen)
    finally:
        conftest.BIN = saved
    yield s
    for _ in gen:
        pass


@pytest.fixture()
def shm_dir():
    d = f"/dev/shm/conch-hostile-{os.getpid()}-{time.monotonic_ns()}"
    os.makedirs(d)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def in_ns(server, *cmd):
    """Run cmd in the server's mount namespace."""
    subprocess.run(["nsenter", "-t", str(server.proc.pid), "-m", *cmd], check=True)


def call(server, method, body, timeout=60):
    cl = Client(server.url, server.token)
    c = cl.conn(timeout=timeout)
    try:
        st, ans, _ = cl.unary(FS + method, body, conn=c)
    finally:
        c.close()
    return st, ans



def names(d, prefix):
    try:
        return [n for n in os.listdir(d) if n.startswith(prefix)]
    except FileNotFoundError:
        return []


# ------------------------------------------------ Remove and mounts

def test_remove_never_enters_a_bind_mount_of_the_same_fs(server, shm_dir):
    t = os.path.join(shm_dir, "t")
    mnt = os.path.join(t, "a", "mnt")
    src = os.path.join(shm_dir, "volume")  # the bind source, same tmpfs
    os.makedirs(mnt)
    os.makedirs(os.path.join(src, "sub"))
    for p in ("keep", "sub/deep"):
        with open(os.path.join(src, p), "w") as f:
            f.write("precious")
    open(os.path.join(t, "a", "other"), "w").close()
    assert os.stat(src).st_dev == os.stat(t).st_dev
    in_ns(server, "mount", "--bind", src, mnt)
    try:
        st, ans = call(server, "Remove", {"path": t})
        assert (st, ans) == (500, {"code": "internal", "message": f"remove {mnt}: device or resource busy"})
        assert sorted(os.listdir(src)) == ["keep", "sub"] and os.listdir(os.path.join(src, "sub")) == ["deep"]
        # the mount point itself as the path: not entered either
        st, ans = call(server, "Remove", {"path": mnt})
        assert (st, ans) == (500, {"code": "internal", "message": f"remove {mnt}: device or resource busy"})
        assert sorted(os.listdir(src)) == ["keep", "sub"]
        with open(os.path.join(src, "sub", "deep")) as f:
            assert f.read() == "precious"
    finally:
        in_ns(server, "umount", mnt)
    # once unmounted the rest goes as usual
    st, ans = call(server, "Remove", {"path": t})
    assert (st, ans) == (200, {}) and not os.path.exists(t) and os.path.isfile(os.path.join(src, "keep"))


# ------------------------------------- cross-fs Move of a mount

def tree_snapshot(root):
    out = []
    for d, dirs, files in os.walk(root):
        dirs.sort()
        for n in sorted(files):
            p = os.path.join(d, n)
            with open(p) as f:
                out.append((os.path.relpath(p, root), f.read()))
        out.append((os.path.relpath(d, root) + "/", None))
    return out


def test_cross_fs_move_of_a_tree_holding_a_mount_changes_nothing(server, shm_dir, tmp_path):
    assert os.stat(shm_dir).st_dev != os.stat(tmp_path).st_dev, "need two filesystems"
    tree = os.path.join(shm_dir, "tree")
    os.makedirs(os.path.join(tree, "sub", "mnt"))
    os.makedirs(os.path.join(tree, "zz"))
    vol = os.path.join(shm_dir, "volume")
    os.makedirs(vol)
    for p, text in ((os.path.join(tree, "a"), "a"), (os.path.join(tree, "sub", "b"), "b"),
                    (os.path.join(tree, "zz", "c"), "c"), (os.path.join(vol, "keep"), "keep")):
        with open(p, "w") as f:
            f.write(text)
    mnt = os.path.join(tree, "sub", "mnt")
    in_ns(server, "mount", "--bind", vol, mnt)
    try:
        before_tree, before_vol = tree_snapshot(tree), tree_snapshot(vol)
        # into parents that do not exist yet: the refusal leaves none either
        dst = str(tmp_path / "new" / "deeper" / "moved")
        st, ans = call(server, "Move", {"source": tree, "destination": dst})
        assert (st, ans) == (400, {"code": "invalid_argument",
                                   "message": f"cannot move a mount point across filesystems: {mnt}"})
        assert tree_snapshot(tree) == before_tree and tree_snapshot(vol) == before_vol
        assert os.listdir(tmp_path) == []
        # the mount point itself as the source: refused the same way
        st, ans = call(server, "Move", {"source": mnt, "destination": dst})
        assert (st, ans) == (400, {"code": "invalid_argument",
                                   "message": f"cannot move a mount point across filesystems: {mnt}"})
        assert tree_snapshot(vol) == before_vol
        assert os.listdir(tmp_path) == []
    finally:
        in_ns(server, "umount", mnt)
    # without the mount the same Move succeeds and says so
    st, ans = call(server, "Move", {"source": tree, "destination": dst})
    assert st == 200 and ans["entry"]["path"] == dst and ans["entry"]["isDirectory"] is True
    assert tree_snapshot(dst) == before_tree and not os.path.exists(tree)


# ------------------------------------------ temp files by descriptor

def upload_with_rename(server, d, moved, finish):
    """An upload into d whose directory is renamed to moved after the first
    chunk reached the server; the stream then ends (finish) or the client
    disconnects.  → (http status, body) or None after a disconnect."""
    target = os.path.join(d, "f.bin")
    first = os.urandom(64 * 1024)
    env = lambda m: len(json.dumps(m).encode()).to_bytes(5, "big") + json.dumps(m).encode()
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    head = (f"POST {FS}PostFileStream HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
            f"Connect-Protocol-Version: 1\r\nconch-init-token: {server.token}\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()

    def chunk(b):
        return f"{len(b):x}\r\n".encode() + b + b"\r\n"

    sock.sendall(head + chunk(env({"filepath": target, "content": base64.b64encode(first).decode()})))
    # the temp file exists once the first chunk is written (named, or an
    # O_TMPFILE the server holds open)
    assert wait_for(lambda: temp_leftovers(d, server.proc.pid), 10), "the upload never opened its temp file"
    os.rename(d, moved)
    if not finish:
        sock.close()
        return None
    sock.sendall(chunk(env({"content": base64.b64encode(b"tail").decode()})) + chunk(b""))
    data = b""
    while True:
        b = sock.recv(65536)
        if not b:
            break
        data += b
        if data.endswith(b"\r\n0\r\n\r\n"):
            break
    sock.close()
    return data, first + b"tail"


def test_upload_into_a_renamed_directory_leaves_no_temp_file(server, tmp_path):
    d, moved = str(tmp_path / "up"), str(tmp_path / "up-moved")
    os.makedirs(d)
    data, content = upload_with_rename(server, d, moved, finish=True)
    assert b" 200 " in data.split(b"\r\n", 1)[0], data[:300]
    # the file went where its directory went (the directory is held by
    # descriptor from the first chunk), and nothing else did
    assert temp_leftovers(moved, server.proc.pid) == [] and not os.path.exists(d)
    assert b'"uploadedCount":1' in data, data[-300:]
    with open(os.path.join(moved, "f.bin"), "rb") as f:
        assert f.read() == content
    # a client gone after the rename: nothing at all is left
    d2, moved2 = str(tmp_path / "up2"), str(tmp_path / "up2-moved")
    os.makedirs(d2)
    assert upload_with_rename(server, d2, moved2, finish=False) is None
    assert wait_for(lambda: not temp_leftovers(moved2, server.proc.pid), 5), temp_leftovers(moved2, server.proc.pid)
    assert os.listdir(moved2) == []


def test_script_whose_cwd_is_renamed_is_removed(server, tmp_path):
    cwd = str(tmp_path / "work")
    moved = cwd + "-moved"
    cl = Client(server.url, server.token)
    c = cl.conn(timeout=60)
    st, msgs, end = cl.stream(SP, [{"cmd": "sh", "cwd": cwd, "content": f'mv "{cwd}" "{moved}"'}], conn=c)
    c.close()
    assert st == 200 and end == {} and any("end" in m for m in msgs), (msgs, end)
    assert os.path.isdir(moved) and not os.path.exists(cwd)
    assert wait_for(lambda: not names(moved, "conch-script-"), 5), os.listdir(moved)
    # a start that fails after the script was written removes it too
    cwd2 = str(tmp_path / "work2")
    c = cl.conn(timeout=60)
    st, msgs, end = cl.stream(SP, [{"cmd": "no-such-command-here", "cwd": cwd2, "content": "x"}], conn=c)
    c.close()
    assert st == 200 and end["error"]["code"] == "invalid_argument", end
    assert names(cwd2, "conch-script-") == []


# ------------------------------------------ the Move/FIFO race

def test_move_source_swapped_for_a_fifo_never_wedges_the_pool(server, shm_dir, tmp_path):
    assert os.stat(shm_dir).st_dev != os.stat(tmp_path).st_dev, "need two filesystems"
    src = os.path.join(shm_dir, "src")
    # the two faces of the source, swapped in by hard link + rename; kept
    # under their own names so a FIFO the server blocks on can be opened
    # (and the server freed) when this test fails
    reg, fifo = os.path.join(shm_dir, "reg"), os.path.join(shm_dir, "fifo")
    with open(reg, "w") as f:
        f.write("regular")
    os.mkfifo(fifo)
    stop = threading.Event()
    counts = {"swaps": 0, "moves": 0, "timeouts": 0, "answers": {}}

    def swapper():
        i = 0
        while not stop.is_set():
            tmp = os.path.join(shm_dir, f"swap{i & 1}")
            try:
                os.link(fifo if i & 1 else reg, tmp)
                os.rename(tmp, src)
            except FileNotFoundError:
                pass  # the source was moved away at the wrong moment
            i += 1
            counts["swaps"] = i

    def mover():
        cl = Client(server.url, server.token)
        n = 0
        while not stop.is_set():
            dst = str(tmp_path / f"dst{n % 4}")
            c = cl.conn(timeout=ANSWER_S)
            try:
                st, ans, _ = cl.unary(FS + "Move", {"source": src, "destination": dst}, conn=c)
                key = ans.get("code", st) if isinstance(ans, dict) else st
                counts["answers"][key] = counts["answers"].get(key, 0) + 1
            except (socket.timeout, TimeoutError):
                counts["timeouts"] += 1
            finally:
                c.close()
            n += 1
            counts["moves"] = n

    threads = [threading.Thread(target=swapper), threading.Thread(target=mover)]
    for t in threads:
        t.start()
    try:
        time.sleep(RACE_S)
        stop.set()
        for t in threads:
            t.join(30)
        # afterwards the pool answers at once: Stat and StartProcess
        t0 = time.monotonic()
        st, ans = call(server, "Stat", {"path": str(tmp_path)}, timeout=ANSWER_S)
        assert st == 200 and ans["entry"]["isDirectory"] is True, ans
        cl = Client(server.url, server.token)
        c = cl.conn(timeout=ANSWER_S)
        st, msgs, end = cl.stream(SP, [{"cmd": "true", "cwd": str(tmp_path)}], conn=c)
        c.close()
        assert st == 200 and end == {} and any("end" in m for m in msgs), (msgs, end)
        print(f"Stat + StartProcess after the race: {time.monotonic() - t0:.2f} s")
    finally:
        stop.set()
        print(f"race {RACE_S:.0f} s: {counts}")
        # free any pool thread blocked opening the FIFO (a failing run)
        for _ in range(64):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                break
    assert counts["timeouts"] == 0, counts
    # the race was really run: both faces were met by the copy
    assert counts["swaps"] > 1000 and counts["moves"] > 100, counts
    assert counts["answers"].get(200, 0) > 0, counts
    assert names(tmp_path, ".conch-move-") == []
