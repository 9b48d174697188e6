"""PID 1 never exits: when the process service cannot start (CONCH_FAULT=
proc_init, the test seam for that failure) PID 1 logs it, boots, answers
the init message, serves /health and FileService, and ProcessService calls
fail cleanly — where `exit(1)` would have panicked the kernel."""
import json
import os
import time

import pytest

import sandbox as sbx
from test_pid1 import BIN, wait_for


@pytest.fixture(scope="module")
def sb():
    s = sbx.Sandbox(BIN, with_disk=False, entrypoint=False)
    old = os.environ.get("CONCH_FAULT")
    os.environ["CONCH_FAULT"] = "proc_init"
    try:
        s.build()
        s.boot()
        s.init_until_ready(s.request())
        yield s
    finally:
        if old is None:
            os.environ.pop("CONCH_FAULT", None)
        else:
            os.environ["CONCH_FAULT"] = old
        print("\n---- PID 1 console ----\n" + s.console()[-4000:])
        assert s.close() == []


def test_pid1_lives_without_process_service(sb):
    log = sb.console()
    assert "cannot start the process service: ProcessService unavailable, PID 1 goes on" in log, log
    assert "sandbox ready" in log
    assert sb.health().endswith("200")
    code, body = sb.unary("/pb.FileService/ListFiles", {"path": "/"}, "tok-1")
    assert code == 200, body
    code, body = sb.unary("/pb.ProcessService/List", {}, "tok-1")
    assert code == 404, (code, body)  # the service was never registered
    # still PID 1, still ignoring SIGTERM, still reaping
    r = sbx.run("nsenter", "-t", str(sb.pid1), "-p", "-m", "sh", "-c", "kill -TERM 1; echo ok", check=False)
    assert r.stdout == "ok\n", r.stderr
    time.sleep(0.3)
    assert os.path.exists(f"/proc/{sb.pid1}")
    assert wait_for(lambda: not [p for p in sb.ns_processes() if p[1] != 1], timeout=10), sb.ns_processes()
