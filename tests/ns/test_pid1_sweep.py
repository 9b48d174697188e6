"""The cgroups of a PID 1 that is gone are removed by the next agent to
start; a live PID 1's never are.  Its cgroups are named for pid 1 of its
own namespace (conch-1-…), a pid that is no agent here: while it lives its
lock on them keeps them, even when they look idle for an hour; once it was
killed (SIGKILL, its namespace torn down) and they are empty, a standalone
agent started on the host removes them once they were left alone for 10
minutes (an agent older than the lock, alive in another namespace, keeps
its cgroups while it uses them)."""
import os
import re
import secrets
import signal
import subprocess
import time
import urllib.request

import pytest

import sandbox as sbx
from test_pid1 import BIN, run_in_sandbox, wait_for


@pytest.fixture()
def sb():
    with sbx.ready(BIN, with_disk=False, entrypoint=False) as s:
        yield s


def host_agent_start_and_stop(tmp):
    """A standalone agent on the host (its start sweeps), then stopped."""
    port = int(subprocess.run(["python3", "-c", "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); "
                               "print(s.getsockname()[1])"], capture_output=True, text=True).stdout)
    log = open(os.path.join(tmp, f"host-{port}.log"), "wb")
    p = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{port}", "--token", secrets.token_hex(8)],
                         stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, ASAN_OPTIONS="detect_leaks=0"))
    try:
        def up():
            try:
                return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).status == 200
            except OSError:
                return False
        assert wait_for(up, 20)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=30)
        log.close()
    return open(log.name).read()


def test_a_gone_pid1s_cgroups_are_removed_a_live_ones_kept(sb):
    mnt = sbx.cgroup2_mount()
    m = re.search(r"^0::(/\S*conch-1-[0-9a-f]{8})/p\d+$", run_in_sandbox(sb, "cat /proc/self/cgroup"), re.M)
    assert m, "no command cgroup"
    base = mnt + m.group(1)
    hour_ago = time.time() - 3600
    os.utime(base, (hour_ago, hour_ago))
    host_agent_start_and_stop(sb.work)
    assert os.path.isdir(base), "a live PID 1's cgroup was removed"
    assert run_in_sandbox(sb, "echo still") == "still\n"
    os.kill(sb.pid1, signal.SIGKILL)  # as a VM that is killed: no shutdown
    assert wait_for(lambda: not sb.ns_processes() if os.path.exists(f"/proc/{sb.pid1}") else True, 10)
    assert os.path.isdir(base), "nothing removed it yet"
    # a pid 1 is alive here (not an agent): removed once left alone 10 min
    text = host_agent_start_and_stop(sb.work)
    assert os.path.isdir(base), "removed while it might be an older agent's, busy a moment ago"
    os.utime(base, (hour_ago, hour_ago))
    text = host_agent_start_and_stop(sb.work)
    assert wait_for(lambda: not os.path.exists(base), 5), os.listdir(base)
    assert "empty cgroups of agents that no longer exist" in text, text
