"""PID 1 started with descriptors 0–2 closed (a kernel that found no
/dev/console): nothing it opens lands on them — not the loop, not a pipe
that would swallow every log line — before /dev exists (a stand-in holds
them) nor after (/dev/null then): it boots, becomes ready, runs commands,
and keeps /dev/null on 0–2 across an upgrade in place."""
import json
import os
import re

import pytest

import sandbox as sbx
from test_pid1 import BIN, run_in_sandbox, wait_for


@pytest.fixture(scope="module")
def sb():
    with sbx.ready(BIN, with_disk=False, entrypoint=False, closed_stdio=True) as s:
        yield s


def stdio_kinds(pid):
    out = []
    for n in range(3):
        st = os.stat(f"/proc/{pid}/fd/{n}")
        out.append((os.major(st.st_rdev), os.minor(st.st_rdev)) if st.st_rdev else os.readlink(f"/proc/{pid}/fd/{n}"))
    return out


def test_pid1_without_stdio_holds_dev_null_on_0_to_2(sb):
    assert stdio_kinds(sb.pid1) == [(1, 3)] * 3, stdio_kinds(sb.pid1)
    assert sb.health().endswith("200")
    assert run_in_sandbox(sb, "echo hi") == "hi\n"
    # no console to say where its cgroups are (close() removes them)
    m = re.search(r"^0::(/\S*conch-1-[0-9a-f]{8})/p\d+$", run_in_sandbox(sb, "cat /proc/self/cgroup"), re.M)
    sb.cgroups = [sbx.cgroup2_mount() + m.group(1)]
    sbx.copy_with_libs(BIN, sb.in_root(""), "/root/conch-init.next")
    code, body = sb.unary("/pb.AgentService/Upgrade", {"path": "/root/conch-init.next"}, sb.token)
    assert code == 200, body

    def upgraded():
        r = sb.peer("curl", "-s", "-m", "5", "-H", f"conch-init-token: {sb.token}", sb.url("/metrics"))
        try:
            return json.loads(r.stdout)["upgrades"] == 1
        except ValueError:
            return False
    assert wait_for(upgraded, 30)
    assert stdio_kinds(sb.pid1) == [(1, 3)] * 3, stdio_kinds(sb.pid1)
    assert run_in_sandbox(sb, "echo again") == "again\n"
