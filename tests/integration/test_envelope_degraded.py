"""The workload envelope (api.md §9) where it cannot exist: this host's
cgroup controllers are bound to cgroup v1, so conch-init's cgroup v2
hierarchy (a private mount) has none of cpu, memory, pids.  Everything
degrades, nothing fails: limits are refused with failed_precondition, usage
comes from wait4, oomKilled stays false, and the per-command cgroups (core
files only) still track leftovers, SendSignal by pid/tag after the leader
and process.all.  A second server without cgroups (CONCH_PROC_CGROUPS=0)
shows the process-group fallback."""
import base64
import json
import subprocess
import time

import pytest

from conftest import serve
from conch import Client
from test_process import Stream

SP = "/pb.ProcessService/StartProcess"
LIST = "/pb.ProcessService/List"
SIGNAL = "/pb.ProcessService/SendSignal"
MiB = 1 << 20


@pytest.fixture(scope="module")
def server():
    yield from serve("envelope_degraded")


@pytest.fixture(scope="module")
def nocg_server():
    yield from serve("envelope_nocg", env={"CONCH_PROC_CGROUPS": "0"})


@pytest.fixture
def client(server):
    return Client(server.url, server.token)


def stream(c, req):
    st, msgs, end = c.stream(SP, [req])
    assert st == 200, msgs
    return msgs, end


def end_event(msgs):
    ends = [m["end"] for m in msgs if "end" in m]
    assert len(ends) == 1, msgs
    return ends[0]


def start_bg(c, req):
    s = Stream(c, SP, dict(req, background=True))
    ev = s.next()
    s.close()
    assert ev and ev[0] == "start", (ev, s.end)
    return ev[1]


def running(pattern):
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def wait_gone(pattern, seconds=10):
    deadline = time.time() + seconds
    while running(pattern) and time.time() < deadline:
        time.sleep(0.05)
    return not running(pattern)


# ---------------------------------------------------------------- limits
@pytest.mark.parametrize("limits,code,msg", [
    ({"memoryMaxBytes": "100"}, "invalid_argument", "invalid limits: memoryMaxBytes must be at least 1048576"),
    ({"memoryMaxBytes": "1048575", "cpuMillis": 999999}, "invalid_argument",
     "invalid limits: memoryMaxBytes must be at least 1048576"),
    ({"cpuMillis": 999999}, "invalid_argument", None),  # the cpus of this machine in the text
    ({"memoryMaxBytes": str(64 * MiB)}, "failed_precondition", None),
    ({"pidsMax": 16}, "failed_precondition", None),
    ({"cpuMillis": 100}, "failed_precondition", None),
])
def test_limits_checks_and_texts(client, limits, code, msg):
    msgs, end = stream(client, {"cmd": "true", "limits": limits})
    assert msgs == [], msgs  # a failing check produces no events
    assert end["error"]["code"] == code, end
    text = end["error"]["message"]
    if msg:
        assert text == msg
    elif code == "invalid_argument":
        cpus = int(subprocess.run(["nproc"], capture_output=True, text=True).stdout)
        assert text == f"invalid limits: cpuMillis must not exceed {1000 * cpus}"
    else:
        assert text.startswith("resource limits are not available: "), text
        assert "controllers" in text and "cpu" in text, text


def test_limits_checked_after_pty_size_and_zero_limits_are_none(client):
    msgs, end = stream(client, {"cmd": "true", "pty": {"cols": 70000}, "limits": {"memoryMaxBytes": "5"}})
    assert end["error"]["message"] == "invalid pty size: pty cols must not exceed 65535", end
    msgs, end = stream(client, {"cmd": "true", "limits": {"memoryMaxBytes": "0", "pidsMax": 0}})
    assert end == {} and end_event(msgs)["status"] == "exited", (msgs, end)


# ---------------------------------------------------------------- usage from wait4
def test_usage_from_wait4_and_no_oom(client):
    msgs, end = stream(client, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (20 << 20)"]})
    e = end_event(msgs)
    assert e["status"] == "exited" and "oomKilled" not in e, e
    assert int(e["usage"]["memoryPeakBytes"]) >= 20 * MiB, e
    busy = "import time\nwhile time.process_time() < 0.3: pass\n"  # CPU time, not wall: the host may be busy
    msgs, end = stream(client, {"cmd": "python3", "args": ["-c", busy]})
    u = end_event(msgs)["usage"]
    assert int(u.get("cpuUserUsec", 0)) + int(u.get("cpuSystemUsec", 0)) >= 200000, u


def test_proto_end_event_fields(client):
    """The new fields on the binary codec too."""
    import agent_pb2 as pb
    req = pb.StartProcessRequest(cmd="sh", args=["-c", "sleep 5 >/dev/null 2>&1 &"])
    st, msgs, end = client.stream(SP, [req.SerializeToString()], json_codec=False)
    assert st == 200 and end == {}, end
    evs = [pb.ProcessEvent.FromString(m) for m in msgs]
    e = evs[-1].end
    assert e.exited and e.left_running == 1 and not e.oom_killed and e.usage.memory_peak_bytes > 0, evs
    assert client.unary(SIGNAL, {"process": {"pid": evs[0].start.pid}, "signal": 9})[:2] == (200, {})


def test_list_reads_usage(client):
    start_bg(client, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (20 << 20)\nimport time\ntime.sleep(30)"],
                      "tag": "usage-listed"})
    deadline, p = time.time() + 20, None
    while time.time() < deadline:
        ps = [p for p in client.unary(LIST, {})[1].get("processes", []) if p.get("tag") == "usage-listed"]
        if ps and int(ps[0].get("usage", {}).get("memoryPeakBytes", 0)) >= 20 * MiB:
            p = ps[0]
            break
        time.sleep(0.1)
    assert p and p["running"] is True, p
    assert client.unary(SIGNAL, {"process": {"tag": "usage-listed"}, "signal": 9})[:2] == (200, {})


# ---------------------------------------------------------------- leftovers (cgroup core files)
def test_left_running_then_signal_by_pid(client):
    marker = "sleep 311"
    msgs, end = stream(client, {"cmd": "sh", "args": ["-c", f"{marker} >/dev/null 2>&1 &"]})
    assert end == {}, end
    pid = msgs[0]["start"]["pid"]
    assert end_event(msgs).get("leftRunning") == 1, msgs
    assert running(marker)
    assert client.unary(SIGNAL, {"process": {"pid": pid}, "signal": 9})[:2] == (200, {})
    assert wait_gone(marker)
    # once its cgroup is empty, the command is gone for SendSignal
    deadline = time.time() + 10
    while client.unary(SIGNAL, {"process": {"pid": pid}, "signal": 9})[0] != 404 and time.time() < deadline:
        time.sleep(0.05)
    st, body, _ = client.unary(SIGNAL, {"process": {"pid": pid}, "signal": 9})
    assert (st, body["message"]) == (404, f"process pid {pid} not found"), body


def test_background_leftovers_listed_and_found_by_tag(client):
    marker = "sleep 312"
    st, msgs, end = client.stream(SP, [{"cmd": "sh", "args": ["-c", f"{marker} >/dev/null 2>&1 &"],
                                        "background": True, "tag": "leftover"}])
    assert end == {} and end_event(msgs).get("leftRunning") == 1, msgs
    ps = [p for p in client.unary(LIST, {})[1].get("processes", []) if p.get("tag") == "leftover"]
    assert ps and not ps[0].get("running") and ps[0].get("exitCode", 0) == 0 and ps[0]["leftRunning"] == 1, ps
    assert ps[0].get("finishedAt", "").endswith("Z"), ps
    assert client.unary(SIGNAL, {"process": {"tag": "leftover"}, "signal": 15})[:2] == (200, {})
    assert wait_gone(marker)


def test_signal_all(client, server):
    markers = ["sleep 313", "sleep 314", "sleep 315"]
    for i, m in enumerate(markers[:2]):
        start_bg(client, {"cmd": "sh", "args": ["-c", m], "tag": f"all-{i}"})
    fg = Stream(client, SP, {"cmd": "sh", "args": ["-c", markers[2]]})
    assert fg.next()[0] == "start"
    assert all(running(m) for m in markers)
    assert client.unary(SIGNAL, {"process": {"all": True, "pid": 12345}, "signal": 9})[:2] == (200, {})
    assert all(wait_gone(m) for m in markers)
    assert fg.all()[-1][3] == "error"  # killed: its end event
    fg.close()
    # nothing running: still {}
    assert client.unary(SIGNAL, {"process": {"all": True}, "signal": 15})[:2] == (200, {})
    # signal 0 is still refused
    st, body, _ = client.unary(SIGNAL, {"process": {"all": True}, "signal": 0})
    assert (st, body["message"]) == (400, "signal must not be zero"), body


def test_commands_after_kill_all_live(client):
    """The next command's cgroup is made ahead; process.all's cgroup.kill on
    the base used to leave that spare marked, and the kernel killed the
    first command cloned into it (CLONE_INTO_CGROUP) before it ran."""
    start_bg(client, {"cmd": "sh", "args": ["-c", "sleep 318"], "tag": "kill-all-spare"})
    assert running("sleep 318")
    assert client.unary(SIGNAL, {"process": {"all": True}, "signal": 9})[:2] == (200, {})
    assert wait_gone("sleep 318")
    for i in range(3):
        msgs, end = stream(client, {"cmd": "sh", "args": ["-c", f"echo run{i}; cat /proc/self/cgroup"]})
        e = end_event(msgs)
        out = b"".join(base64.b64decode(m["data"]["stdout"]) for m in msgs if "data" in m).decode()
        assert e.get("status") == "exited" and "exitCode" not in e and "error" not in e, (i, e)
        assert out.startswith(f"run{i}\n") and "/p" in out.splitlines()[-1], out  # in its own cgroup


@pytest.mark.parametrize("path,body", [
    ("/pb.ProcessService/Connect", {"process": {"all": True}}),
    ("/pb.ProcessService/SendInput", {"process": {"all": True, "pid": 1}, "input": {"stdin": ""}}),
    ("/pb.ProcessService/CloseStdin", {"process": {"all": True}}),
])
def test_all_only_for_send_signal(client, path, body):
    if path.endswith("Connect"):
        st, msgs, end = client.stream(path, [body])
        assert end["error"] == {"code": "invalid_argument",
                                "message": "process selector all is only valid for SendSignal"}, end
    else:
        st, resp, _ = client.unary(path, body)
        assert (st, resp["message"]) == (400, "process selector all is only valid for SendSignal"), resp


def test_metrics_without_envelope(server):
    p = subprocess.run(["curl", "-s", "-H", f"conch-init-token: {server.token}", server.url + "/metrics"],
                       capture_output=True)
    m = json.loads(p.stdout)
    assert m["workloadMemoryMax"] == 0 and m["workloadPidsMax"] == 0 and m["oomKills"] >= 0, m


def test_log_says_why_no_envelope(server):
    log = open(server.log_path, "rb").read().decode(errors="replace")
    assert "no workload envelope: the cgroup v2 controllers" in log, log[-2000:]


# ---------------------------------------------------------------- no cgroups at all
def test_without_cgroups_usage_still_from_wait4(nocg_server):
    c = Client(nocg_server.url, nocg_server.token)
    msgs, end = stream(c, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (20 << 20)"]})
    e = end_event(msgs)
    assert int(e["usage"]["memoryPeakBytes"]) >= 20 * MiB and "oomKilled" not in e, e
    msgs, end = stream(c, {"cmd": "true", "limits": {"pidsMax": 4}})
    assert end["error"]["code"] == "failed_precondition", end
    assert end["error"]["message"].startswith("resource limits are not available: "), end
    marker = "sleep 316"
    start_bg(c, {"cmd": "sh", "args": ["-c", marker], "tag": "nocg"})
    assert running(marker)
    assert c.unary(SIGNAL, {"process": {"all": True}, "signal": 9})[:2] == (200, {})
    assert wait_gone(marker)


def test_foreground_found_by_pid_for_send_signal(client):
    s = Stream(client, SP, {"cmd": "sleep", "args": ["317"]})
    pid = s.next()[1]
    assert client.unary(SIGNAL, {"process": {"pid": pid}, "signal": 15})[:2] == (200, {})
    ev = s.all()
    s.close()
    assert ev[-1][:5] == ("end", -1, True, "error", "signal: terminated"), ev


def test_usage_of_2000_processes_read_off_the_loop(fresh_server):
    """List reads every process's usage (here /proc of each: 4000 file
    reads per List) in the pool; ten at once, and /metrics, keep /health
    under 1 s (timed by curl, a separate process)."""
    import threading
    c = Client(fresh_server.url, fresh_server.token)
    n = 2000
    conn = c.conn(timeout=60)
    for i in range(n):  # one keep-alive connection: read each stream to its start, then drop it
        s = Stream(c, SP, {"cmd": "sleep", "args": ["121.25"], "background": True, "tag": f"many{i}"})
        assert s.next()[0] == "start"
        s.close()
    conn.close()
    out = []

    def lst():
        cc = c.conn(timeout=120)
        cc.request("POST", LIST, body=b"{}", headers=c.headers())
        r = cc.getresponse()
        out.append((r.status, r.read()))
        cc.close()

    ths = [threading.Thread(target=lst) for _ in range(10)]
    for th in ths:
        th.start()
    worst = 0.0
    while any(th.is_alive() for th in ths):
        p = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}", "--max-time", "10",
                            fresh_server.url + "/health"], capture_output=True, text=True)
        worst = max(worst, float(p.stdout or 99))
        m = subprocess.run(["curl", "-s", "--max-time", "10", "-H", f"conch-init-token: {fresh_server.token}",
                            fresh_server.url + "/metrics"], capture_output=True)
        assert json.loads(m.stdout)["processes"] >= n
    for th in ths:
        th.join()
    print(f"10 Lists of {n} processes: worst /health {worst:.3f} s")
    assert worst < 1.0
    assert len(out) == 10
    for st, body in out:
        ps = json.loads(body)["processes"]
        assert st == 200 and len(ps) == n, st
        assert all(int(p["usage"]["memoryPeakBytes"]) > 0 for p in ps)
    assert c.unary(SIGNAL, {"process": {"all": True}, "signal": 9})[:2] == (200, {})
    assert wait_gone("sleep 121.25", 30)
