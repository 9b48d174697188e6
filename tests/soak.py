#!/usr/bin/python3
"""Soak: 20 valid and 5 hostile clients against one conch-init on 127.0.0.1.

Not part of `make check`.  Runs SOAK_SECONDS (default 600) and stops by
itself; every 15 s it prints the server's RSS, open descriptors, live
children and each client kind's counts, and at the end a verdict (exit
status 1 when the server died, /health stopped answering, descriptors or
processes were left behind, or a valid client saw an unexpected answer).

    make asan && tests/soak.py                 # 10 minutes, ASan binary
    SOAK_SECONDS=60 CONCH_INIT_BIN=build/dev/conch-init tests/soak.py

Valid (20 threads): StartProcess echo over HTTP/1.1 (JSON) and HTTP/2
(proto-less JSON streams via h2conn), ListFiles, List, a background
process with SendSignal — each iteration checks the exact answer.
Hostile (5 threads), each loop bounded and paced:
  1. slowloris: a request head trickled a byte at a time (the 10 s header
     timer must end it), plus garbage bytes;
  2. a 100 000-entry env StartProcess (the loop must keep answering);
  3. repeated conch-init-token headers (must be unauthenticated);
  4. a tree with setsid escapees under Connect-Timeout-Ms 1000 (every
     process must be gone after the deadline);
  5. a foreground `yes` whose client reads a little and vanishes, and one
     that never reads (the process group must be killed / flow-controlled).
"""
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import http.client

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "integration"))
ROOT = os.path.dirname(HERE)
BIN = os.environ.get("CONCH_INIT_BIN", os.path.join(ROOT, "build", "asan", "conch-init"))
SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
TOKEN = secrets.token_hex(16)
SP = "/pb.ProcessService/StartProcess"

stop = threading.Event()
lock = threading.Lock()
counts = {}
problems = []


def count(kind, what):
    with lock:
        counts.setdefault(kind, {}).setdefault(what, 0)
        counts[kind][what] += 1


def problem(kind, text):
    with lock:
        if len(problems) < 50:
            problems.append(f"{time.strftime('%H:%M:%S')} {kind}: {text}")
    count(kind, "problem")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


PORT = free_port()


def env(payload, flags=0):
    return struct.pack(">BI", flags, len(payload)) + payload


def unframe(data):
    out, off = [], 0
    while off + 5 <= len(data):
        f, n = struct.unpack(">BI", data[off:off + 5])
        out.append((f, json.loads(data[off + 5:off + 5 + n] or b"{}")))
        off += 5 + n
    return out


def h1_stream(req, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    h = {"Content-Type": "application/connect+json", "conch-init-token": TOKEN}
    h.update(headers or {})
    c.request("POST", SP, body=env(json.dumps(req).encode()), headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, unframe(data)


def h1_unary(path, body, headers=None, timeout=30):
    c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=timeout)
    h = {"Content-Type": "application/json", "Connect-Protocol-Version": "1", "conch-init-token": TOKEN}
    h.update(headers or {})
    c.request("POST", path, body=json.dumps(body).encode(), headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data or b"null")


def ok_echo(events, word):
    import base64
    out = b"".join(base64.b64decode(e["data"]["stdout"]) for f, e in events if f == 0 and "stdout" in e.get("data", {}))
    return out == word.encode() + b"\n" and events[-1] == (2, {}) and \
        {"end": {"exited": True, "status": "exited"}} in [e for _, e in events]


# ------------------------------------------------------------------ valid clients
def valid_client(i):
    kind = "valid"
    n = 0
    h2c = None
    while not stop.is_set():
        n += 1
        word = f"w{i}x{n}"
        try:
            mode = (i + n) % 5
            if mode == 0:
                st, evs = h1_stream({"cmd": "echo", "args": [word]})
                if st != 200 or not ok_echo(evs, word):
                    problem(kind, f"echo h1 {st} {evs[-2:]}")
                else:
                    count(kind, "echo-h1")
            elif mode == 1:
                from h2conn import H2Client
                if h2c is None:
                    h2c = H2Client("127.0.0.1", PORT)
                sid = h2c.connect_stream(SP, [json.dumps({"cmd": "echo", "args": [word]}).encode()], TOKEN,
                                         ctype="application/connect+json")
                h2c.wait(sid, timeout=30)
                s = h2c.streams.pop(sid)
                if not ok_echo(unframe(bytes(s.body)), word):
                    problem(kind, f"echo h2 {bytes(s.body)[-120:]}")
                else:
                    count(kind, "echo-h2")
            elif mode == 2:
                st, body = h1_unary("/pb.FileService/ListFiles", {"path": "/etc", "depth": 1})
                if st != 200 or not body.get("entries"):
                    problem(kind, f"ListFiles {st} {str(body)[:100]}")
                else:
                    count(kind, "listfiles")
            elif mode == 3:
                st, body = h1_unary("/pb.ProcessService/List", {})
                if st != 200:
                    problem(kind, f"List {st} {body}")
                else:
                    count(kind, "list")
            else:
                tag = f"soak-{i}-{n}"
                # background start: read the start event only, then signal it
                c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=30)
                c.request("POST", SP, body=env(json.dumps({"cmd": "sleep", "args": ["30"], "background": True,
                                                           "tag": tag}).encode()),
                          headers={"Content-Type": "application/connect+json", "conch-init-token": TOKEN})
                r = c.getresponse()
                r.read(5 + 10)
                c.close()
                st, body = h1_unary("/pb.ProcessService/SendSignal", {"process": {"tag": tag}, "signal": 15})
                if (st, body) != (200, {}):
                    problem(kind, f"SendSignal {st} {body}")
                else:
                    count(kind, "bg+signal")
        except Exception as e:  # noqa: BLE001 - any failure of a valid call is a finding
            problem(kind, f"{type(e).__name__}: {e}")
            if h2c is not None:
                try:
                    h2c.close()
                except Exception:  # noqa: BLE001
                    pass
                h2c = None
            time.sleep(0.5)
        stop.wait(0.05)
    if h2c is not None:
        h2c.close()


# ------------------------------------------------------------------ hostile clients
def hostile_slowloris():
    kind = "hostile-slowloris"
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", PORT), timeout=20)
            head = b"POST /pb.ProcessService/List HTTP/1.1\r\nHost: x\r\nX-Slow: "
            t0 = time.monotonic()
            closed = False
            for b in head + b"a" * 200:
                if stop.is_set():
                    break
                try:
                    s.sendall(bytes([b]))
                except OSError:
                    closed = True
                    break
                time.sleep(0.1)
                if time.monotonic() - t0 > 15:
                    break
            if not closed:
                s.settimeout(5)
                try:
                    closed = s.recv(1024) == b"" or True
                except OSError:
                    closed = True
            s.close()
            count(kind, "trickled")
            g = socket.create_connection(("127.0.0.1", PORT), timeout=10)
            g.sendall(os.urandom(4096))
            g.settimeout(10)
            try:
                g.recv(4096)
            except OSError:
                pass
            g.close()
            count(kind, "garbage")
        except OSError as e:
            problem(kind, f"{e}")
            stop.wait(1)


def hostile_big_env():
    kind = "hostile-big-env"
    big = {f"K{i:06d}": "v" for i in range(100000)}
    while not stop.is_set():
        try:
            st, evs = h1_stream({"cmd": "true", "env": big}, timeout=60)
            if st != 200 or evs[-1] != (2, {}):
                problem(kind, f"{st} {evs[-1:]}")
            else:
                count(kind, "started")
        except Exception as e:  # noqa: BLE001
            problem(kind, f"{type(e).__name__}: {e}")
        stop.wait(3)


def hostile_dup_token():
    kind = "hostile-dup-token"
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
            s.sendall(b"POST /pb.ProcessService/List HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                      b"Content-Type: application/json\r\nConnect-Protocol-Version: 1\r\n"
                      b"conch-init-token: " + TOKEN.encode() + b"\r\nconch-init-token: x\r\n"
                      b"Content-Length: 2\r\n\r\n{}")
            data = b""
            while True:
                b = s.recv(65536)
                if not b:
                    break
                data += b
            s.close()
            if not data.startswith(b"HTTP/1.1 401"):
                problem(kind, f"answer {data[:60]!r}")
            else:
                count(kind, "refused")
        except OSError as e:
            problem(kind, f"{e}")
        stop.wait(0.2)


def hostile_tree():
    kind = "hostile-tree"
    n = 0
    while not stop.is_set():
        n += 1
        mark = f"33.{secrets.randbelow(10**6):06d}"
        try:
            st, evs = h1_stream({"cmd": "sh", "args": ["-c", f"for i in $(seq 40); do setsid sleep {mark} & done; sleep 0.2"]},
                                headers={"Connect-Timeout-Ms": "1000"})
            time.sleep(1.5)
            left = pids_with_arg(mark)
            if left:
                problem(kind, f"{len(left)} escapees alive after the deadline")
                for p in left:
                    try:
                        os.kill(p, 9)
                    except OSError:
                        pass
            else:
                count(kind, "tree gone")
        except Exception as e:  # noqa: BLE001
            problem(kind, f"{type(e).__name__}: {e}")
        stop.wait(1)


def hostile_vanish():
    kind = "hostile-vanish"
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
            body = env(json.dumps({"cmd": "yes"}).encode())
            s.sendall((f"POST {SP} HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
                       f"conch-init-token: {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body)
            s.recv(65536)
            s.close()  # vanish: the server must kill `yes`
            count(kind, "vanished")
            # a reader that never reads, bounded by a timeout
            s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.sendall((f"POST {SP} HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
                       f"conch-init-token: {TOKEN}\r\nConnect-Timeout-Ms: 2000\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
            stop.wait(3)
            s.close()
            count(kind, "never read")
        except OSError as e:
            problem(kind, f"{e}")
            stop.wait(1)


def pids_with_arg(arg):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if arg.encode() in f.read().split(b"\0"):
                        out.append(int(d))
            except OSError:
                pass
    return out


# ------------------------------------------------------------------ the server
def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return len(f.read().split())
    except OSError:
        return -1


PROBE = r"""
import http.client, sys, time
port, until = int(sys.argv[1]), float(sys.argv[2])
while time.time() < until:
    t = time.monotonic()
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/health")
        ok = c.getresponse().status == 200
        c.close()
    except OSError:
        ok = False
    print(f"{int(ok)} {time.monotonic() - t:.4f}", flush=True)
    time.sleep(0.1)
"""


def health():
    try:
        t = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", PORT, timeout=5)
        c.request("GET", "/health")
        ok = c.getresponse().status == 200
        c.close()
        return ok, time.monotonic() - t
    except OSError:
        return False, 5.0


def main():
    log = open(os.path.join(ROOT, "build", f"soak-{PORT}.log"), "wb")
    e = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    srv = subprocess.Popen([BIN, "serve", "--listen", f"127.0.0.1:{PORT}", "--token", TOKEN],
                           stdout=log, stderr=subprocess.STDOUT, env=e)
    for _ in range(200):
        if health()[0]:
            break
        time.sleep(0.05)
    pid = srv.pid
    fds0 = len(os.listdir(f"/proc/{pid}/fd"))
    rss0 = status_kib(pid, "VmRSS")
    print(f"soak: {BIN} pid {pid} port {PORT}, {SECONDS:.0f} s, start RSS {rss0} KiB, fds {fds0}", flush=True)
    threads = [threading.Thread(target=valid_client, args=(i,), daemon=True) for i in range(20)]
    threads += [threading.Thread(target=f, daemon=True) for f in
                (hostile_slowloris, hostile_big_env, hostile_dup_token, hostile_tree, hostile_vanish)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    # /health is timed by a process of its own: the client threads here share
    # one interpreter lock, and their waits are not the server's
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(PORT), str(time.time() + SECONDS)],
                             stdout=subprocess.PIPE, text=True)
    probe_worst = [0.0, 0.0, 0]  # this interval, whole run, failures
    probe_n = [0]

    def read_probe():
        for line in probe.stdout:
            ok, took = line.split()
            with lock:
                probe_n[0] += 1
                probe_worst[0] = max(probe_worst[0], float(took))
                probe_worst[1] = max(probe_worst[1], float(took))
                if ok != "1":
                    probe_worst[2] += 1
    threading.Thread(target=read_probe, daemon=True).start()
    worst_health = 0.0
    next_report = t0
    alive = True
    while time.monotonic() - t0 < SECONDS:
        ok, took = health()
        worst_health = max(worst_health, took)
        if not ok:
            problem("server", f"/health failed after {time.monotonic() - t0:.0f} s")
        if srv.poll() is not None:
            problem("server", f"exited with {srv.returncode}")
            alive = False
            break
        if time.monotonic() >= next_report:
            next_report += 15
            with lock:
                c = {k: dict(v) for k, v in counts.items()}
                pw, probe_worst[0] = probe_worst[0], 0.0
            print(f"[{time.monotonic() - t0:5.0f} s] RSS {status_kib(pid, 'VmRSS')} KiB "
                  f"(peak {status_kib(pid, 'VmHWM')}) fds {len(os.listdir(f'/proc/{pid}/fd'))} "
                  f"children {children(pid)} /health worst {pw * 1000:.0f} ms  {json.dumps(c)}", flush=True)
        time.sleep(1)
    stop.set()
    for t in threads:
        t.join(timeout=30)
    time.sleep(3)  # retained records, exits, lingering cgroups
    fds1 = len(os.listdir(f"/proc/{pid}/fd")) if alive else -1
    kids = children(pid) if alive else -1
    rss1 = status_kib(pid, "VmRSS") if alive else -1
    if alive:
        srv.send_signal(signal.SIGTERM)
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
    log.close()
    probe.wait(timeout=30)
    print(f"end: RSS {rss0} -> {rss1} KiB, fds {fds0} -> {fds1}, children left {kids}, "
          f"/health probes {probe_n[0]}, worst {probe_worst[1] * 1000:.0f} ms, failed {probe_worst[2]}")
    if probe_worst[2]:
        problem("server", f"{probe_worst[2]} /health probes failed")
    print(json.dumps(counts, indent=1, sort_keys=True))
    if alive and fds1 > fds0 + 4:
        problem("server", f"descriptors grew {fds0} -> {fds1}")
    if alive and kids > 0:
        problem("server", f"{kids} children left")
    text = open(log.name, errors="replace").read()
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        if marker in text:
            problem("server", f"sanitizer report ({marker}) in {log.name}")
    for p in problems:
        print("PROBLEM", p)
    valid_problems = counts.get("valid", {}).get("problem", 0)
    bad = not alive or valid_problems or any(p.split(" ", 2)[1].startswith(("server", "hostile-tree", "hostile-dup"))
                                            for p in problems)
    print("soak: FAILED" if bad else "soak: OK")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
