"""PID 1 upgraded in place while one part of the state cannot be restored,
in the new program and again in the rollback (CONCH_FAULT=handover_ports):
every other part restores on its own.  The init listener is kept, so the
host can still send init messages (a token rotation works); the API
listener is kept, its commands too; Upgrade is usable again."""
import json

import pytest

import sandbox as sbx
from test_pid1 import BIN, run_in_sandbox, wait_for


@pytest.fixture(scope="module")
def sb():
    with sbx.ready(BIN, fault="handover_ports", console_tail=5000, with_disk=False, entrypoint=False) as s:
        yield s


def test_pid1_keeps_its_init_listener_when_the_ports_part_fails(sb):
    code, _, _ = sb.start_process("/bin/sh", ["-c", "sleep 600 &"], sb.token)
    assert code == 200
    sbx.copy_with_libs(BIN, sb.in_root(""), "/root/conch-init.next")
    code, body = sb.unary("/pb.AgentService/Upgrade", {"path": "/root/conch-init.next"}, sb.token)
    assert code == 200, body
    assert wait_for(lambda: "upgrade rolled back" in sb.console(), 30), sb.console()[-3000:]
    log = sb.console()
    assert "part ports abandoned" in log and "boots again" not in log, log[-3000:]
    # the init listener: a new token through it
    resp, _ = sb.init_until_ready(sb.request(token="tok-2"))
    assert resp == '{"version":1,"status":"ready","retryable":false}', resp
    assert sb.unary("/pb.ProcessService/List", {}, "tok-1")[0] == 401
    sb.token = "tok-2"
    assert run_in_sandbox(sb, "echo after") == "after\n"
    # Upgrade works again (and rolls back again: the fault holds)
    code, body = sb.unary("/pb.AgentService/Upgrade", {"path": "/root/conch-init.next"}, sb.token)
    assert code == 200, body
    assert wait_for(lambda: sb.console().count("upgrade rolled back") == 2, 30), sb.console()[-3000:]
    assert sb.health().endswith("200")
