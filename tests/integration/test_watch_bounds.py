"""WatchDir against a hostile tree: a watched
directory swapped for a symlink to a directory outside is never followed;
a tree deeper than a path can name is still watched, and one deeper than
the walk's bound says so (an error, or an overflow) instead of going
silent; 65 000 watched directories moved out are dropped without holding
the pool (Stat from another connection within 1 s); 140 streams leave root
its inotify instances (the agent shares one)."""
import ctypes
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import serve
from conch import envelope, parse_envelopes
from files_util import curl_post
from test_files_more import FS, MODES, Watch1, Watch2, fs_events, inotify_watches, open_watch, wait_no_inotify

AT_FDCWD = -100
RENAME_EXCHANGE = 2
MAX_DEPTH = 128  # fs/watch_int.h WD_MAX_DEPTH
libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture(scope="module")
def server():
    # its own server: the inotify counts must see this module's watches only
    yield from serve("test_watch_bounds")


def exchange(a, b):
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e), a)


def drain(w, seconds):
    """Every message for `seconds` (keepalives left out)."""
    out = [m for m, _ in w.pending]
    w.pending = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and w.end is None:
        out += [m for m in w.poll(0.05) if "keepalive" not in m]
    return out


def watched_inodes(pid):
    """Inode numbers the daemon's inotify instances watch."""
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                for line in f:
                    if line.startswith("inotify wd:"):
                        out.add(int(line.split(" ino:")[1].split()[0], 16))
        except FileNotFoundError:
            pass
    return out


def stream_curl(server, req, timeout=60):
    code, data = curl_post(server.url, FS + "WatchDir", envelope(json.dumps(req).encode()),
                           "application/connect+json", server.token, MODES["http1"],
                           extra_headers=["Connect-Timeout-Ms: 3000"], timeout=timeout)
    assert code == 200
    msgs, end = [], None
    for flags, p in parse_envelopes(data):
        if flags & 2:
            end = json.loads(p)
        else:
            msgs.append(json.loads(p))
    return msgs, end


# ------------------------------------------------------------------ a watched directory swapped for a symlink

@pytest.mark.parametrize("kind", ["http1", "h2"])
def test_watch_symlink_swap_never_followed(server, kind, tmp_path):
    """A watched directory p is swapped (RENAME_EXCHANGE) for a symlink to a
    directory outside the tree right after a directory is made in it, 300
    times; the outside directory holds a directory of that name with
    SECRET files, and gets LATE files while the symlink is in place.  No
    event ever names an outside file, and the real p is still reported."""
    root, out = tmp_path / "r", tmp_path / "outside"
    (root / "p").mkdir(parents=True)
    out.mkdir()
    n = 300
    for i in range(n):
        (out / f"x{i}").mkdir()
        (out / f"x{i}" / f"SECRET{i}").write_text("s")
    (out / "SECRETTOP").write_text("s")
    os.symlink(out, root / "lnk")
    outside = {os.stat(out).st_ino} | {os.stat(out / f"x{i}").st_ino for i in range(n)}
    w = open_watch(server, kind, str(root), recursive=True)
    msgs, watched_outside = [], set()
    try:
        for i in range(n):
            os.mkdir(root / "p" / f"x{i}")
            exchange(root / "p", root / "lnk")  # p is the symlink now, lnk the real directory
            time.sleep(0.003)
            (out / f"x{i}" / f"LATE{i}").write_text("l")
            exchange(root / "p", root / "lnk")  # and back
            if i % 20 == 0:
                msgs += drain(w, 0.01)
                watched_outside |= watched_inodes(server.proc.pid) & outside
        msgs += drain(w, 1.0)
        watched_outside |= watched_inodes(server.proc.pid) & outside
        (root / "p" / "final").write_text("f")
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not any(
                m.get("filesystem", {}).get("name") == "p/final" for m in msgs):
            msgs += drain(w, 0.1)
    finally:
        w.close()
    names = [m["filesystem"]["name"] for m in msgs if "filesystem" in m]
    leaked = [x for x in names if "SECRET" in x or "LATE" in x]
    print(f"{len(names)} events, {sum(1 for m in msgs if 'overflow' in m)} overflow(s), leaked {leaked[:5]}, "
          f"{len(watched_outside)} outside directories watched")
    assert not watched_outside, f"{len(watched_outside)} directories outside the tree were watched"
    assert not leaked, f"{len(leaked)} events name files of the outside directory: {leaked[:5]}"
    for m in msgs:
        e = m.get("filesystem", {}).get("entry")
        assert e is None or e["path"].startswith(str(root) + "/"), e
    assert "p/final" in names, "the real directory is still reported"
    wait_no_inotify(server.proc.pid)


# ------------------------------------------------------------------ deep trees, renames, directories moved out

def test_watch_new_dir_of_renamed_parent_is_covered(server, tmp_path):
    """A directory made in a watched one that is renamed at once (before the
    daemon reads the event, so it cannot reopen the parent by its old
    name): once the rename is followed, the new directory is watched under
    the parent's new name — its events arrive, or an overflow says they
    may not."""
    w = open_watch(server, "h2", str(tmp_path), recursive=True)
    try:
        missed = []
        for i in range(20):
            (tmp_path / f"a{i}").mkdir()
            assert ("a%d" % i, "EVENT_TYPE_CREATE") in [e[:2] for e in fs_events(w, 1)]
            os.mkdir(tmp_path / f"a{i}" / "new")
            os.rename(tmp_path / f"a{i}", tmp_path / f"b{i}")
            time.sleep(0.1)
            (tmp_path / f"b{i}" / "new" / "f").touch()
            msgs = drain(w, 0.4)
            names = [m["filesystem"]["name"] for m in msgs if "filesystem" in m]
            if f"b{i}/new/f" not in names and not any("overflow" in m for m in msgs):
                missed.append(i)
    finally:
        w.close()
    assert not missed, f"events of a new directory silently lost in rounds {missed}"
    wait_no_inotify(server.proc.pid)


def make_chain(top, names):
    """Directories top/names[0]/names[1]/... made by descriptor (the path
    may be longer than PATH_MAX); returns the deepest one's fd."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for nm in names:
        os.mkdir(nm, dir_fd=fd)
        nfd = os.open(nm, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def rm_chain(top, names):
    """Remove a chain made by make_chain (rmtree cannot name its depths)."""
    fds = [os.open(top, os.O_RDONLY | os.O_DIRECTORY)]
    for nm in names:
        fds.append(os.open(nm, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
    for i in range(len(names), 0, -1):
        d = fds.pop()
        for e in os.listdir(d):
            os.unlink(e, dir_fd=d)
        os.close(d)
        os.rmdir(names[i - 1], dir_fd=fds[-1])
    os.close(fds[0])


@pytest.mark.parametrize("kind", ["http1", "h2"])
def test_watch_deeper_than_path_max_is_watched(server, kind, tmp_path):
    """30 levels of 200-character names (6 KB of path, past PATH_MAX): a
    file made at the bottom is reported (with its entry), not lost."""
    names = [f"{i:03d}" + "d" * 197 for i in range(30)]
    fd = make_chain(tmp_path, names)
    try:
        w = open_watch(server, kind, str(tmp_path), recursive=True)
        try:
            os.close(os.open("bottom.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
            msgs = []
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and not any("overflow" in m or "filesystem" in m for m in msgs):
                msgs += drain(w, 0.1)
        finally:
            w.close()
        rel = "/".join(names) + "/bottom.txt"
        fsev = [m["filesystem"] for m in msgs if "filesystem" in m]
        assert fsev, f"nothing reported for a file {len(rel)} characters down: {msgs}"
        assert fsev[0]["name"] == rel and fsev[0]["type"] == "EVENT_TYPE_CREATE"
        assert fsev[0]["entry"]["path"] == f"{tmp_path}/{rel}" and fsev[0]["entry"]["type"] == "file"
    finally:
        os.close(fd)
        rm_chain(tmp_path, names)
    wait_no_inotify(server.proc.pid)


def test_watch_too_deep_says_so(server, tmp_path):
    """Deeper than the walk's bound (128 levels below the root): setup
    fails with resource_exhausted; a watch that starts within the bound and
    sees a subtree grow past it gets an overflow."""
    names = ["d"] * (MAX_DEPTH + 5)
    os.close(make_chain(tmp_path, names))
    msgs, end = stream_curl(server, {"path": str(tmp_path), "recursive": True})
    assert msgs == [] and end == {"error": {"code": "resource_exhausted", "message":
                                  f"watch directory {tmp_path}: directory tree deeper than {MAX_DEPTH} levels"}}
    # within the bound at the start, then mkdir -p past it
    top = tmp_path / "d" / "d" / "d" / "d" / "d" / "d"
    w = open_watch(server, "http1", str(top), recursive=True)  # 127 levels below it: within
    try:
        deep = "/".join(["e"] * 10)
        bottom = top
        for p in names[6:]:
            bottom = bottom / p
        os.makedirs(bottom / deep)
        msgs = drain(w, 1.5)
    finally:
        w.close()
    kinds = [next(iter(m)) for m in msgs]
    assert "overflow" in kinds, kinds
    wait_no_inotify(server.proc.pid)


def stat_ms(server, path):
    t0 = time.monotonic()
    code, data = curl_post(server.url, FS + "Stat", json.dumps({"path": path}).encode(), "application/json",
                           server.token, MODES["h2-prior"], timeout=30)
    assert code == 200, data
    return (time.monotonic() - t0) * 1000


def test_watch_65k_moved_out_drops_linearly(server, tmp_path):
    """65 000 watched directories moved out of a recursive watch at once:
    their watches go, and Stat from another connection answers within 1 s
    all along (the drop was quadratic: 3.3 s pool jobs)."""
    pid = server.proc.pid
    wait_no_inotify(pid)
    root, big, out = tmp_path / "r", tmp_path / "r" / "big", tmp_path / "out"
    big.mkdir(parents=True)
    out.mkdir()
    n = 65_000
    fd = os.open(big, os.O_RDONLY | os.O_DIRECTORY)
    for i in range(n):
        os.mkdir(f"s{i}", dir_fd=fd)
    os.close(fd)
    t0 = time.monotonic()
    w = open_watch(server, "h2", str(root), recursive=True)
    setup_s = time.monotonic() - t0
    try:
        assert sum(inotify_watches(pid).values()) == n + 2
        os.rename(big, out / "big")
        (root / "after").touch()  # the event that settles the rename: the drop runs now
        t1 = time.monotonic()
        worst, probes = 0.0, 0
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            worst = max(worst, stat_ms(server, str(root)))
            probes += 1
            if sum(inotify_watches(pid).values()) == 1 and probes >= 5:
                break
        left = sum(inotify_watches(pid).values())
        drop_s = time.monotonic() - t1
        ev = [e[:2] for e in fs_events(w, 2, timeout=5)]
        print(f"setup {setup_s:.1f} s; {probes} Stat probes in {drop_s:.2f} s, slowest {worst:.0f} ms; "
              f"watches left {left}")
        assert left == 1, f"{left} watches left after the move"
        assert worst < 1000, f"Stat took {worst:.0f} ms"
        assert ("big", "EVENT_TYPE_RENAME") in ev and ("after", "EVENT_TYPE_CREATE") in ev, ev
    finally:
        w.close()
        shutil.rmtree(out, ignore_errors=True)
    wait_no_inotify(pid, timeout=30)


# ------------------------------------------------------------------ many streams, one inotify instance

INIT1 = ("import ctypes, os, sys; c = ctypes.CDLL(None, use_errno=True); fd = c.inotify_init1(0); "
         "print(fd if fd >= 0 else os.strerror(ctypes.get_errno())); sys.exit(0 if fd >= 0 else 1)")


def test_watch_140_streams_share_one_instance(server, tmp_path):
    """140 WatchDir streams (HTTP/1.1 and h2) take one inotify instance, not
    140 of root's 128: another root process's inotify_init1 still works."""
    pid = server.proc.pid
    wait_no_inotify(pid)
    ws, firsts = [], []
    try:
        for i in range(140):
            d = tmp_path / f"w{i}"
            d.mkdir()
            w = (Watch1 if i % 2 else Watch2)(server, {"path": str(d), "recursive": True})
            w.pending = []
            ws.append(w)
            msgs = []
            deadline = time.monotonic() + 5
            while not msgs and w.end is None and time.monotonic() < deadline:
                msgs = w.poll(0.02)
            firsts.append(msgs[0] if msgs else w.end)
        other = subprocess.run([sys.executable, "-c", INIT1], capture_output=True, text=True, timeout=30)
        instances = len(inotify_watches(pid))
        started = sum(1 for f in firsts if f == {"start": {}})
        print(f"{started} streams started; agent holds {instances} inotify instance(s); "
              f"other process: {other.stdout.strip()}")
        assert other.returncode == 0, f"another root process's inotify_init1 failed: {other.stdout.strip()}"
        assert started == 140, [f for f in firsts if f != {"start": {}}][:3]
        assert instances == 1
        assert sum(inotify_watches(pid).values()) == 140
        (tmp_path / "w139" / "f").touch()
        assert fs_events(ws[139], 1)[0][:2] == ("f", "EVENT_TYPE_CREATE")
    finally:
        for w in ws:
            w.close()
    wait_no_inotify(pid)

