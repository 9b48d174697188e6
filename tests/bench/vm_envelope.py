"""The body of tests/bench/vm-envelope.sh: StartProcess round trips in the
microVM with the workload envelope (controllers enabled, every command's
cgroup a memory/pids/cpu cgroup) against the same guest booted with
CONCH_ENVELOPE=0 (commands still get their core-only cgroups).  One
HTTP/1.1 keep-alive connection, `/bin/true` N times after a warm-up."""
import os
import secrets
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "vm"))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import vm as vmmod  # noqa: E402
from conch import Client, envelope  # noqa: E402

N = int(os.environ.get("VM_ENVELOPE_N", "300"))
ROUNDS = int(os.environ.get("VM_ENVELOPE_ROUNDS", "2"))
BODY = envelope(b'{"cmd":"/bin/true"}')


def round_trips(v):
    c = Client(v.url, v.token)
    conn = c.conn(timeout=60)
    h = c.headers(ctype="application/connect+json")
    out = []
    for i in range(N + 20):
        t = time.perf_counter()
        conn.request("POST", "/pb.ProcessService/StartProcess", body=BODY, headers=h)
        r = conn.getresponse()
        data = r.read()
        assert r.status == 200 and b'"end"' in data, data
        if i >= 20:
            out.append(time.perf_counter() - t)
    conn.close()
    return out


def measure(env):
    with tempfile.TemporaryDirectory() as d:
        v = vmmod.VM("pmem", workdir=d, name="bench", init_env=env)
        try:
            v.start()
            v.wait_log("waiting for the init message", timeout=300)
            v.token = secrets.token_hex(16)
            v.ready(v.token)
            want = "workload envelope /" if not env else "turned off (CONCH_ENVELOPE=0)"
            assert want in v.log(), v.log()[-3000:]
            return round_trips(v)
        finally:
            v.close()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


res = {"envelope": [], "none": []}
for r in range(ROUNDS):  # alternating, each its own boot
    res["envelope"] += measure(None)
    res["none"] += measure({"CONCH_ENVELOPE": "0"})
print(f"StartProcess /bin/true in the microVM ({vmmod.accel()}), {ROUNDS} boots × {N} each")
for k, xs in res.items():
    print(f"  {k:9s} p50 {statistics.median(xs) * 1e3:7.2f} ms   p99 {pct(xs, 0.99) * 1e3:7.2f} ms")
p50 = statistics.median(res["envelope"]) / statistics.median(res["none"])
p99 = pct(res["envelope"], 0.99) / pct(res["none"], 0.99)
print(f"ratio envelope/none: p50 {p50:.3f}  p99 {p99:.3f}  (target p50 ≤ 1.05)")
