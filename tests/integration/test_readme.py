"""README.md "Routes": the set-up block and every curl line of the route
table, run as written (bash, real curl) in table order against a daemon of
its own; each answers HTTP 200, every stream ends with the `{}` envelope,
and the table names every route the daemon serves.  The Upgrade row runs
last, after every stream has ended, with the binary under test in place of
build/dev/conch-init: once answered, the agent hands over to it."""
import os
import re
import subprocess
import time

import pytest

import agent_pb2
from conch import Client
from conftest import BIN, ROOT

README = os.path.join(ROOT, "README.md")
CODE_200 = re.compile(r"^HTTP (\d{3})$", re.M)
STREAM_OK = b"\x02\x00\x00\x00\x02{}"
UPGRADE = "/pb.AgentService/Upgrade"


def routes_section():
    text = open(README).read()
    start = text.index("\n## Routes\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def setup_block(sec):
    """The indented code block before the table."""
    lines, seen = [], False
    for line in sec.splitlines():
        if line.startswith("    "):
            seen = True
            lines.append(line[4:])
        elif seen and line.strip():
            break
    return lines


def table_rows(sec):
    rows = []
    for line in sec.splitlines():
        m = re.match(r"^\| `([^`]+)` \| [^|]+ \| `(.+)` \|$", line)
        if m:
            rows.append((m.group(1), m.group(2).replace("\\|", "|")))
    return rows


@pytest.fixture()
def demo(fresh_server, tmp_path):
    yield fresh_server, str(tmp_path / "demo")


def test_table_names_every_route():
    served = {"GET /health", "GET /metrics", "GET /files", "PUT /files"}
    for name, svc in agent_pb2.DESCRIPTOR.services_by_name.items():
        served |= {f"/pb.{name}/{m}" for m in svc.methods_by_name}
    served |= {f"/grpc.reflection.{v}.ServerReflection/ServerReflectionInfo" for v in ("v1", "v1alpha")}
    assert sorted(r for r, _ in table_rows(routes_section())) == sorted(served)


def test_readme_curl_lines_run(demo, tmp_path):
    server, demo_dir = demo
    sec = routes_section()
    setup = setup_block(sec)
    assert setup[0].startswith("u=http://127.0.0.1:4064 tok=")
    # the same lines, pointed at this test's daemon and directory; curl also
    # writes the HTTP status to stderr
    defs = [f"u={server.url} tok={server.token}", "curl() { command curl -w '%{stderr}HTTP %{http_code}\\n' \"$@\"; }"]
    defs += [line for line in setup[1:] if "curl" not in line and "mkdir" not in line]
    prelude = "set -eo pipefail\n" + "\n".join(defs) + "\n"

    def run(line, name):
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        line = line.replace("/tmp/demo", demo_dir).replace("$PWD/build/dev/conch-init", BIN)
        with open(out, "wb") as o, open(err, "wb") as e:
            r = subprocess.run(["bash", "-c", prelude + line], stdout=o, stderr=e, timeout=30)
        return r.returncode, out, err

    for i, line in enumerate(setup[1:]):
        if "curl" in line or "mkdir" in line:
            rc, _, err = run(line, f"setup{i}")
            assert rc == 0, err.read_text()
    time.sleep(0.5)  # the two background processes have started
    later = []
    rows = table_rows(sec)
    for i, (route, line) in enumerate(rows):
        if route == UPGRADE:
            continue  # last of all
        rc, out, err = run(line, f"row{i}")
        assert rc == 0, (route, err.read_text())
        if line.endswith("&"):
            later.append((route, line, out, err))  # its stream ends on a later row
            time.sleep(0.3)
            continue
        check(route, line, out, err)
    for route, line, out, err in later:
        deadline = time.time() + 20
        while not CODE_200.search(err.read_text()) and time.time() < deadline:
            time.sleep(0.1)
        check(route, line, out, err)
    # the process rows did their work: job got both inputs and ended on SendSignal
    connect = [o for r, _, o, _ in later if r.endswith("/Connect")][0].read_bytes()
    assert connect.count(b'"stdout":"aGkK"') == 2 and b'"signal: terminated"' in connect
    assert not os.path.exists(demo_dir + "/d")
    st, _, _ = Client(server.url, server.token).unary("/pb.ProcessService/SendSignal",
                                                      {"process": {"tag": "term"}, "signal": 9})
    assert st == 200
    [(i, line)] = [(i, line) for i, (route, line) in enumerate(rows) if route == UPGRADE]
    rc, out, err = run(line, f"row{i}")
    assert rc == 0, (UPGRADE, err.read_text())
    check(UPGRADE, line, out, err)
    assert b'"toVersion"' in out.read_bytes()


def check(route, line, out, err):
    codes = CODE_200.findall(err.read_text())
    want = "201" if route == "PUT /files" else "200"  # a new file
    assert codes == [want], (route, err.read_text(), out.read_bytes()[:300])
    body = out.read_bytes()
    if "Connect-Timeout-Ms" in line:  # a watch that never ends by itself: its deadline ends it
        assert body.endswith(b'"code":"deadline_exceeded","message":"the operation timed out"}}'), (route, body[-300:])
    elif "application/connect+json" in line or "${S[@]}" in line:
        assert body.endswith(STREAM_OK), (route, body[-300:])
    elif not route.startswith("GET"):
        assert b'"code"' not in body, (route, body)


def run_recipe(*args):
    """The serve line `make run` would execute (make -n: nothing built or run)."""
    r = subprocess.run(["make", "-n", "-s", "run", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if "conch-init serve" in l]
    assert len(lines) == 1, r.stdout
    return lines[0]


def test_make_run_listens_on_loopback_unless_told():
    """`make run` serves a root command API: loopback only by default; the
    README's way to listen wider (RUN_LISTEN) reaches the daemon's --listen."""
    assert "--listen '127.0.0.1:4064'" in run_recipe()
    assert "0.0.0.0" not in run_recipe()
    head = open(README).read().split("\n## ", 1)[0]
    m = re.search(r"`make run (RUN_LISTEN=0\.0\.0\.0:4064)`", head)
    assert m, "the README's opening says how to listen on every interface"
    assert "--listen '0.0.0.0:4064'" in run_recipe(m.group(1))
