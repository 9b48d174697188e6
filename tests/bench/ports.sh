#!/usr/bin/env bash
# Ports: the forwarder's relay against a direct connection, and
# what discovery costs while it runs.  Root (a network namespace of its own).
#
#   1. 1 GiB from a loopback server to a client, ROUNDS times each way
#      interleaved: straight to 127.0.0.1:P, and through the agent's
#      forwarder at OUT:P (serve --forward-ports OUT); MiB/s and the ratio
#      (goal ≥ 0.8×).  Both directions: the server sends (a download) and
#      the client sends (an upload).  The connections are steered to the
#      listener by the kernel (sk_lookup) unless STEER=0, which relays them
#      (CONCH_FORWARD_STEER=0); the agent's log says which it did.
#   2. the agent's CPU (schedstat of its threads) per second over
#      SECS seconds while 50 ports listen and one WatchPorts stream is open,
#      and with neither (the idle baseline).
#
# The namespace has only its loopback device, with OUT added to it:
# nothing leaves it.  Usage: tests/bench/ports.sh
#   3. listen() → `opened` on that stream, SAMPLES listeners opened at
#      random moments against the scans (p50, p90, max).
# Environment: MIB (1024) ROUNDS (3) SECS (10) SAMPLES (30); STEER (1; 0 relays);
#   CONCH_INIT_BIN (default
#   build/dev/conch-init, rebuilt with `make`); CC: the namespace's default
#   congestion control (net.ipv4.tcp_congestion_control, for direct and
#   forwarded alike; default: inherited from the host).  A guest on Debian's
#   kernel runs cubic, which does not pace; a namespace may pick only an
#   algorithm the host allows (tcp_allowed_congestion_control: reno is
#   always there and, like cubic, does not pace).
set -euo pipefail
cd "$(dirname "$0")/../.."
MIB=${MIB:-1024}
ROUNDS=${ROUNDS:-3}
SECS=${SECS:-10}
SAMPLES=${SAMPLES:-30}
OUT=10.239.0.1
if [ -z "${CONCH_INIT_BIN:-}" ]; then
  make -s dev >/dev/null
  BIN=$PWD/build/dev/conch-init
else
  BIN=$CONCH_INIT_BIN
fi
NS=conch-ports-bench-$$
ip netns add "$NS"
cleanup() {
  if [ -n "${CIPID:-}" ]; then kill "$CIPID" 2>/dev/null || true; wait "$CIPID" 2>/dev/null || true; fi
  ip netns del "$NS" 2>/dev/null || true
  if [ -n "${AGENT_LOG:-}" ]; then rm -f "$AGENT_LOG"; fi
}
trap cleanup EXIT
ip netns exec "$NS" sh -c "ip link set lo up && ip addr add $OUT/32 dev lo"
if [ -n "${CC:-}" ]; then
  ip netns exec "$NS" sysctl -qw net.ipv4.tcp_congestion_control="$CC"
fi
echo "congestion control in the namespace: $(ip netns exec "$NS" cat /proc/sys/net/ipv4/tcp_congestion_control)"
AGENT_LOG=$(mktemp)
CONCH_FORWARD_STEER=${STEER:-1} ip netns exec "$NS" "$BIN" serve --listen 127.0.0.1:4064 --token bench \
  --forward-ports "$OUT" --log-level info 2>"$AGENT_LOG" &
CIPID=$!
sleep 0.5
ip netns exec "$NS" /usr/bin/python3 - "$MIB" "$ROUNDS" "$SECS" "$OUT" "$CIPID" "$SAMPLES" "$AGENT_LOG" <<'PY'
import json, os, socket, statistics, struct, subprocess, sys, threading, time
mib, rounds, secs, out, agent = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
samples = int(sys.argv[6])
log_path = sys.argv[7]
TOTAL = mib << 20
CHUNK = memoryview(bytearray(1 << 20))

def pump_out(c):
    left = TOTAL
    while left:
        left -= c.send(CHUNK[:min(left, len(CHUNK))])
    c.shutdown(socket.SHUT_WR)

def pump_in(c):
    buf, got = bytearray(1 << 20), 0
    while True:
        n = c.recv_into(buf)
        if not n:
            return got
        got += n

def server(mode):
    lis = socket.socket()
    lis.bind(("127.0.0.1", 0))
    lis.listen(8)
    def run():
        while True:
            try:
                c, _ = lis.accept()
            except OSError:
                return
            with c:
                if mode == "down":
                    pump_out(c)
                    c.recv(1)
                else:
                    pump_in(c)
                    c.sendall(b"k")
    threading.Thread(target=run, daemon=True).start()
    return lis

def ports():
    import urllib.request
    r = urllib.request.Request("http://127.0.0.1:4064/pb.NetworkService/ListPorts", b"{}",
                               {"conch-init-token": "bench", "Content-Type": "application/json", "Connect-Protocol-Version": "1"})
    return json.load(urllib.request.urlopen(r)).get("ports", [])

def cpu():
    """Seconds on a CPU of all the agent's threads (schedstat: ns, not ticks)."""
    t = 0
    for tid in os.listdir(f"/proc/{agent}/task"):
        try:
            with open(f"/proc/{agent}/task/{tid}/schedstat") as fh:
                t += int(fh.read().split()[0])
        except OSError:
            pass
    return t / 1e9

def machine():
    """(busy, total) jiffies of all CPUs: how saturated the host is."""
    with open("/proc/stat") as fh:
        v = [int(x) for x in fh.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)

def transfer(addr, port, mode):
    m0, u0 = machine(), os.times()
    c = socket.socket()
    if addr == out:
        c.bind((out, 0))
    c.connect((addr, port))
    t0 = time.monotonic()
    if mode == "down":
        got = pump_in(c)
    else:
        pump_out(c)
        got = TOTAL
        c.recv(1)
    dt = time.monotonic() - t0
    c.close()
    assert got == TOTAL, got
    m1, u1 = machine(), os.times()
    load[addr].append(((m1[0] - m0[0]) / max(1, m1[1] - m0[1]),
                       (u1.user + u1.system - u0.user - u0.system) / (mib / 1024)))
    return mib / dt

for mode in ("down", "up"):
    load = {"127.0.0.1": [], out: []}
    lis = server(mode)
    port = lis.getsockname()[1]
    while not any(p["port"] == port and p.get("forwardedTo") for p in ports()):
        time.sleep(0.1)
    d, f, cs = [], [], []
    for _ in range(rounds):
        d.append(transfer("127.0.0.1", port, mode))
        c0 = cpu()
        f.append(transfer(out, port, mode))
        cs.append((cpu() - c0) / (mib / 1024))
    rs = [b / a for a, b in zip(d, f)]
    with open(log_path, errors="replace") as fh:
        log = fh.read()
    how = "steered" if f"port {port}: connections to {out}:{port} handed to the listener" in log else "relayed"
    print(f"{how} {mode:4s} {mib} MiB: direct {' '.join(f'{x:.0f}' for x in d)} MiB/s, "
          f"forwarded {' '.join(f'{x:.0f}' for x in f)} MiB/s, ratio {' '.join(f'{x:.2f}' for x in rs)} "
          f"(median {statistics.median(rs):.2f}; goal ≥ 0.8); agent CPU {' '.join(f'{x:.2f}' for x in cs)} s/GiB")
    for a, name in (("127.0.0.1", "direct"), (out, "forwarded")):
        print(f"  {name}: host CPUs busy {' '.join(f'{b * 100:.0f}%' for b, _ in load[a])}, "
              f"client+server CPU {' '.join(f'{x:.2f}' for _, x in load[a])} s/GiB")
    lis.close()

time.sleep(1.5)  # the forwarders above are gone
c0 = cpu(); time.sleep(secs); idle = (cpu() - c0) / secs
held = []
for _ in range(50):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); held.append(s)
w = socket.create_connection(("127.0.0.1", 4064))
body = struct.pack(">BI", 0, 2) + b"{}"
w.sendall((f"POST /pb.NetworkService/WatchPorts HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
           f"conch-init-token: bench\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
time.sleep(1.5)  # start, 50 opened, 50 forwarders
c0 = cpu(); time.sleep(secs); busy = (cpu() - c0) / secs
print(f"agent CPU: {busy * 1000:.3f} ms/s with 50 listening ports (50 forwarded) and one WatchPorts stream; "
      f"{idle * 1000:.3f} ms/s idle (no stream, forwarding on, nothing listening)")
# listen() → `opened` on the stream, at random moments against the scans
import random
w.setblocking(True)
buf = b""
def wait_opened(port):
    global buf
    while True:
        i = buf.find(f'"port":{port},'.encode())
        if i >= 0 and buf.rfind(b'"opened"', 0, i) >= 0:
            buf = buf[i:]
            return time.monotonic()
        buf += w.recv(65536)
lat = []
for _ in range(samples):
    time.sleep(random.uniform(0, 1))
    s = socket.socket(); s.bind(("127.0.0.1", 0))
    t0 = time.monotonic(); s.listen()
    lat.append((wait_opened(s.getsockname()[1]) - t0) * 1000)
    held.append(s)
lat.sort()
print(f"listen() → opened: p50 {statistics.median(lat):.0f} ms, p90 {lat[int(len(lat) * 0.9)]:.0f} ms, "
      f"max {lat[-1]:.0f} ms ({samples} listeners at random moments)")
w.close()
PY
