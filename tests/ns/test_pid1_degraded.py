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
    with sbx.ready(BIN, fault="proc_init", token=None, console_tail=4000, with_disk=False, entrypoint=False) as s:
        yield s


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


def fields(b):
    """(field number, bytes) of every length-delimited field of message b."""
    def varint(i):
        v = shift = 0
        while True:
            v |= (b[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not b[i - 1] & 0x80:
                return v, i
    i, out = 0, []
    while i < len(b):
        key, i = varint(i)
        assert key & 7 == 2, key  # only length-delimited fields in these messages
        n, i = varint(i)
        out.append((key >> 3, b[i:i + n]))
        i += n
    return out


def test_reflection_lists_only_the_services_served(sb):
    """gRPC reflection's list_services (curl, h2c prior knowledge, one
    request message then end of stream) names the services routed:
    FileService, NetworkService, AgentService (its trial runs need only the
    reaper, which PID 1 starts itself) and the two reflection services, no
    ProcessService."""
    import struct
    req = bytes([0x3A, 1, ord("*")])  # ServerReflectionRequest{list_services: "*"}
    body_path = os.path.join(sb.work, "refl.bin")
    out_path = os.path.join(sb.work, "refl.out")
    with open(body_path, "wb") as f:
        f.write(struct.pack(">BI", 0, len(req)) + req)
    r = sb.peer("curl", "-s", "-m", "20", "--http2-prior-knowledge", "-o", out_path, "-w", "%{http_code}",
                "-H", "Content-Type: application/grpc", "-H", "TE: trailers", "-H", "conch-init-token: tok-1",
                "--data-binary", "@" + body_path, sb.url("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"))
    assert r.stdout == "200", r
    data = open(out_path, "rb").read()
    flags, n = struct.unpack(">BI", data[:5])
    assert flags == 0 and len(data) == 5 + n, data
    # ServerReflectionResponse: 6 list_services_response { 1 service { 1 name } }
    [lst] = [v for f, v in fields(data[5:]) if f == 6]
    names = sorted(dict(fields(svc))[1].decode() for f, svc in fields(lst) if f == 1)
    assert names == ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection",
                     "pb.AgentService", "pb.FileService", "pb.NetworkService"], names
