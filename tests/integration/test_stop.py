"""Nothing is left behind.  `serve` stopped by SIGTERM or SIGINT ends its
commands — SIGTERM to each, SIGKILL after 5 s to what ignored it (through
cgroup.kill, or the process group without cgroups), a setsid escapee
included where cgroups are on — and removes its cgroups; an agent killed
with SIGKILL leaves its cgroups, which the next agent to start removes once
they are empty, never the cgroup of a live agent."""
import os
import signal
import time

import pytest

from conch import Client
from conftest import Server, sanitizer_report
from test_process import start_bg, wait_for


def cgroup2_root():
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.startswith("cgroup2 ") and pre.split()[3] == "/":
                return pre.split()[4]
    raise AssertionError("no cgroup2 mount here")


def cgroup_of(pid):
    """The cgroup v2 path of pid, below the hierarchy's root."""
    for line in open(f"/proc/{pid}/cgroup"):
        if line.startswith("0::"):
            return line[3:].strip()
    raise AssertionError(f"pid {pid}: no cgroup v2 line")


def gone(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] in "ZX"
    except OSError:
        return True


def spawn_tree(c, tag, script):
    """A background sh whose pids (its own and its children's) it prints to a file."""
    return start_bg(c, {"cmd": "sh", "args": ["-c", script], "tag": tag})


@pytest.mark.parametrize("how", [("SIGTERM", "cgroups"), ("SIGINT", "cgroups"), ("SIGTERM", "groups")])
def test_stop_ends_commands_and_removes_cgroups(tmp_path, how):
    sig, mode = how
    env = {"CONCH_PROC_CGROUPS": "0"} if mode == "groups" else None
    s = Server(name=f"stop-{sig}-{mode}", env=env)
    try:
        stop_and_check(s, sig, mode, tmp_path)
    finally:
        if s.alive():
            s.proc.kill()


def stop_and_check(s, sig, mode, tmp_path):
    c = Client(s.url, s.token)
    esc = tmp_path / "escapee"
    pids = [spawn_tree(c, "plain", "exec sleep 1000"),
            spawn_tree(c, "deaf", f"trap '' TERM; echo > {tmp_path}/deaf; while :; do sleep 0.1; done")]
    assert wait_for(lambda: (tmp_path / "deaf").exists())  # its trap is set
    if mode == "cgroups":  # its own session: only the cgroup finds it
        spawn_tree(c, "escape", f"setsid sleep 1000 & echo $! > {esc}; wait")
        pids.append(wait_for(lambda: esc.exists() and esc.read_text().strip() and int(esc.read_text())))
        base = os.path.dirname(cgroup_of(pids[0]))
        assert os.path.basename(base).startswith("conch-"), base
        base_dir = cgroup2_root() + base
        assert os.path.isdir(base_dir)
    t0 = time.monotonic()
    s.proc.send_signal(getattr(signal, sig))
    s.proc.wait(timeout=30)
    took = time.monotonic() - t0
    text = s.stop()
    assert sanitizer_report(text) is None, sanitizer_report(text)
    assert s.proc.returncode == 0, text[-2000:]
    assert wait_for(lambda: all(gone(p) for p in pids), 5), [p for p in pids if not gone(p)]
    assert 4.5 <= took <= 15, took  # the deaf one waited its 5 s, then was killed
    assert "SIGKILL" in text
    if mode == "cgroups":
        assert not os.path.exists(base_dir), os.listdir(base_dir)


def test_stop_without_commands_is_prompt():
    s = Server(name="stop-idle")
    t0 = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    s.proc.wait(timeout=30)
    assert time.monotonic() - t0 < 3
    assert sanitizer_report(s.stop()) is None


def test_a_killed_agents_cgroups_are_removed_by_the_next_never_a_live_ones():
    """An agent killed with SIGKILL, its command ended: the next agent to
    start removes its cgroups, not those of a live agent, which goes on
    running commands in them.  (An agent of another pid namespace, whose
    lock alone keeps its cgroups: tests/ns/test_pid1_sweep.py.)"""
    root = cgroup2_root()
    servers = []
    try:
        here = Server(name="sweep-live")
        servers.append(here)
        c = Client(here.url, here.token)
        live_base = root + os.path.dirname(cgroup_of(start_bg(c, {"cmd": "sleep", "args": ["1000"], "tag": "keeper"})))
        dead = Server(name="sweep-dead")
        servers.append(dead)
        pid = start_bg(Client(dead.url, dead.token), {"cmd": "sleep", "args": ["1000"], "tag": "left"})
        dead_base = root + os.path.dirname(cgroup_of(pid))
        dead.proc.kill()
        dead.proc.wait()
        dead.stop()
        assert os.path.isdir(dead_base)  # left behind, with its command
        os.kill(pid, signal.SIGKILL)
        assert wait_for(lambda: gone(pid))
        assert os.path.isdir(dead_base)  # empty now
        newcomer = Server(name="sweep-new")
        servers.append(newcomer)
        assert wait_for(lambda: not os.path.exists(dead_base), 5), os.listdir(dead_base)
        assert "empty cgroups of agents that no longer exist" in open(newcomer.log_path).read()
        assert os.path.isdir(live_base)  # still there, still used
        p2 = start_bg(c, {"cmd": "sleep", "args": ["1000"], "tag": "after"})
        assert root + os.path.dirname(cgroup_of(p2)) == live_base
    finally:
        for srv in servers:
            text = srv.stop()
            assert sanitizer_report(text) is None, sanitizer_report(text)
