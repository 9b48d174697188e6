#!/usr/bin/python3
"""Nothing lost under chaos: a randomized soak of conch-init.

Starts the binary on 127.0.0.1 (a free port, a random token), warms it up,
measures it, runs N clients at once for SECONDS — background writers
followed by readers that drop and resume with `replay`, foreground
commands, commands cut after their start, uploads (whole and cut at a
random byte), downloads (whole, cut, never read), idle half-requests,
unary calls; every client's choices come from a random.Random seeded with
the master seed and its index — optionally upgrading the agent in place
every N seconds meanwhile (--upgrade-every) — then lets the server settle,
takes its final state and checks the invariants of checks.py against the
history.

    tests/soak/soak.py --seed 7 --seconds 60            # or SOAK_SEED, SOAK_SECONDS
    tests/soak/soak.py --seconds 50 --upgrade-every 10  # or SOAK_UPGRADE_EVERY
    make soak SOAK_SECONDS=3600 SOAK_SEED=7             # docs/guide/tests.md

Exit status 0 when every invariant holds, 1 when one broke (the seed, the
first broken invariant and the history around it are printed), 2 on a
harness error.  The report (JSON) goes to --report
(build/soak/report-<seed>.json); on failure the whole history goes beside
it (history-<seed>.jsonl).
"""
import argparse
import collections
import hashlib
import json
import os
import random
import re
import secrets
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _protobuf_classes():
    gen = os.path.join(ROOT, "build", "py")
    sys.path.insert(0, gen)
    try:
        import agent_pb2  # noqa: F401
    except ImportError:
        os.makedirs(gen, exist_ok=True)
        subprocess.run(["protoc", f"--python_out={gen}", "-Iproto", "proto/agent.proto"], cwd=ROOT, check=True)
        import importlib
        importlib.invalidate_caches()  # the directory was looked at before the file was made


_protobuf_classes()

import actors  # noqa: E402
import checks  # noqa: E402
import model  # noqa: E402

RETAIN_MS = 10000  # CONCH_PROC_RETAIN_MS: ended background records go after 10 s, not 60

# Every 100 ms two probes: one on a new connection, one on a keep-alive
# connection kept between them (opened again only when the agent said
# `Connection: close`).  Neither may ever be reset or refused, upgrades
# included (checks.check_health_answered).
PROBE = r"""
import http.client, json, sys, time
port, t0, until, m0 = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
keep = None
while time.time() < until:
    for kind in ("new", "keep"):
        t = time.monotonic()
        rec = {"t": round(time.time() - t0, 3), "m": round(t - m0, 4), "kind": kind}  # m: History time
        try:
            c = keep if kind == "keep" and keep else http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            r.read()
            rec["ok"] = r.status == 200
            if kind == "new" or (r.getheader("Connection") or "").lower() == "close":
                c.close()
                keep = None
            else:
                keep = c
        except (OSError, http.client.HTTPException) as e:
            rec["ok"], rec["error"] = False, f"{type(e).__name__}: {e}"
            keep = None
        rec["latency"] = round(time.monotonic() - t, 4)
        print(json.dumps(rec), flush=True)
    time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))
"""


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ------------------------------------------------------------------ /proc
def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def measure(pid):
    links = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{n}"))
        except OSError:
            pass
    return {"fds": len(links), "threads": len(os.listdir(f"/proc/{pid}/task")),
            "rss_kib": status_kib(pid, "VmRSS"), "hwm_kib": status_kib(pid, "VmHWM"),
            # sockets by kind, the spare command cgroup (proc/cgroup_spare.c makes the
            # next command's ahead) by its directory
            "fd_links": sorted(re.sub(r"/p\d+$", "/p*", re.sub(r"\[\d+\]", "[]", x)) for x in links)}


def children(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                st = f.read()
            rest = st[st.rindex(")") + 2:].split()
            if int(rest[1]) != pid:
                continue
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            out.append({"pid": int(d), "state": rest[0], "comm": st[st.index("(") + 1:st.rindex(")")],
                        "cmdline": cmd[:200]})
        except (OSError, ValueError, IndexError):
            pass
    return out


def marked(marker_base):
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    cmd = f.read()
            except OSError:
                continue
            if marker_base.encode() in cmd and b"soak.py" not in cmd:
                out.append((int(d), cmd.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return out


def temp_files(root, pid):
    """fs/atomic.c's temp files: ".conch-upload-<hex>" names, and unnamed
    O_TMPFILE ones the server holds (a /proc/<pid>/fd link "<dir>/#<ino> (deleted)")."""
    out, dirs = [], 0
    for d, _subdirs, files in os.walk(root):
        dirs += 1
        out += [os.path.join(d, f) for f in files if f.startswith(".conch-upload-")]
    if pid:
        try:
            for n in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{n}")
                except OSError:
                    continue
                if link.startswith(root + "/") and "/#" in link and link.endswith(" (deleted)"):
                    out.append(f"held by the server: fd {n} -> {link}")
        except OSError:
            pass
    return out, dirs


def held_cgroups(pid):
    """The command cgroups the server holds open, with what is in them."""
    out = []
    for n in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        if not re.search(r"/conch-\d+-[0-9a-f]+/p\d+$", link):
            continue
        info = {"fd": int(n), "path": link}
        for f in ("cgroup.procs", "cgroup.events"):
            try:
                with open(os.path.join(link, f)) as fh:
                    info[f] = fh.read().split()
            except OSError as e:
                info[f] = str(e)
        procs = []
        for p in info.get("cgroup.procs", []) if isinstance(info.get("cgroup.procs"), list) else []:
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:120]
                procs.append(f"{p}: {cmd}")
            except OSError:
                procs.append(f"{p}: gone")
        info["procs"] = procs
        out.append(info)
    return out


def file_state(path):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return {"path": path, "exists": False}
    v = model.parse_version(data[:300])
    hlen = v[4] if v else None
    return {"path": path, "exists": True, "size": len(data), "head": data[:200], "hlen": hlen,
            "body_sha": hashlib.sha256(data[hlen:]).hexdigest() if v else None}


def still_serving(port, token, static_path, timeout=20.0):
    """After the settle: a download of the static file and a foreground
    command each complete within timeout (nothing held on behalf of clients
    that are gone keeps the server from serving).  Problems, as text."""
    import agent_pb2 as pb
    import wire
    out = []
    for what, method, req in (
            ("download of the static file", "GetFileStream", pb.GetFileRequest(filepath=static_path)),
            ("foreground `yes | head -c 300000`", "StartProcess",
             pb.StartProcessRequest(cmd="sh", args=["-c", "yes | head -c 300000"]))):
        t = time.monotonic()
        c = wire.Call(port, token, method, "h1", "connect", "proto", timeout=timeout)
        try:
            c.request([req])
            while True:
                k, m = c.next()
                if k == "end":
                    if m.code is not None:
                        out.append(f"{what} after the settle failed {m.code}: {m.message}")
                    break
                if time.monotonic() - t > timeout:
                    raise TimeoutError(f"not done after {timeout:.0f} s")
        except (OSError, wire.WireError) as e:
            out.append(f"{what} after the settle: {type(e).__name__}: {e}")
        finally:
            c.close()
    return out


def sanitizer_report(text):
    for marker in ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:"):
        i = text.find(marker)
        if i >= 0:
            return text[max(0, i - 200):][:6000]
    return None


# ------------------------------------------------------------------ the run
class Run:
    """Everything the checkers read (checks.py says what, in which phase)."""

    def __init__(self):
        self.phase = "history"
        self.events = []
        self.versions = {}
        self.probes = []
        self.base = None
        self.final = {}
        self.server = {}
        self.tolerance = {}
        self.cut_short = False
        self.upgrades = []   # every `upgrade` record so far (checks.collect_upgrades)
        self.upgrade = {}    # {"every": seconds or 0, "version": the binary's}
        # CONCH_MEM_BUDGET set: the daemon-wide budget may drop any stream's
        # events, a replay's first ones too (invariant 1 then allows a jump there)
        self.lossy = bool(os.environ.get("CONCH_MEM_BUDGET"))


def jsonable(v):
    if isinstance(v, (bytes, bytearray)):
        return repr(bytes(v))
    if isinstance(v, dict):
        return {k: jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


SUBJECTS = ("tag", "fg", "vid", "path", "marker")


def excerpt(events, seq, subject):
    """The history around a violation: the records of its subject (or of
    every client, without one) before it and a few after, as lines."""
    keys = {k: v for k, v in subject.items() if k in SUBJECTS}
    if keys:
        around = [e for e in events if any(e.get(k) == v for k, v in keys.items())]
    elif seq is not None:
        around = [e for e in events if abs(e["seq"] - seq) <= 12]
    else:
        return []
    if seq is not None:
        chosen = [e for e in around if e["seq"] <= seq][-25:] + [e for e in around if e["seq"] > seq][:8]
    else:
        chosen = around[-20:]
    lines = [f"history around it ({', '.join(f'{k}={v}' for k, v in keys.items()) or 'all clients'}"
             f"{f'; record {seq}' if seq is not None else ''}):"]
    for e in chosen:
        mark = ">>" if e["seq"] == seq else "  "
        fields = {k: v for k, v in e.items() if k not in ("seq", "t", "client", "kind", "trace")}
        lines.append(f"{mark} #{e['seq']} t={e['t']:.3f} c{e['client']} {e['kind']} "
                     f"{json.dumps(jsonable(fields))[:400]}")
    return lines


class Tally:
    """One invariant's outcomes summed over the epochs and the final phase."""

    def __init__(self, iid, name, fn):
        self.iid, self.name, self.fn = iid, name, fn
        self.checked = 0
        self.unit = None
        self.violations = []  # (seq, subject, text, excerpt lines)
        self.count = 0
        self.notes = collections.Counter()

    def add(self, o, events):
        self.checked += o.checked
        if self.unit is None or o.checked:
            self.unit = o.unit
        self.notes.update(o.notes)
        self.count += len(o.violations)
        for seq, subject, text in sorted(o.violations, key=lambda v: (v[0] is None, v[0] or 0)):
            if len(self.violations) < 50:
                self.violations.append((seq, subject, text, excerpt(events, seq, subject)))


def settle(pid, run, deadline, want):
    """Poll the server's resources until want(m) or the deadline."""
    m = measure(pid)
    while not want(m) and time.monotonic() < deadline:
        time.sleep(0.5)
        m = measure(pid)
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=int(os.environ["SOAK_SEED"]) if os.environ.get("SOAK_SEED")
                    else random.SystemRandom().randrange(1, 1 << 31),
                    help="the master seed (default $SOAK_SEED, else random; printed)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", "60")),
                    help="how long the clients run (default $SOAK_SECONDS, else 60)")
    ap.add_argument("--clients", type=int, default=int(os.environ.get("SOAK_CLIENTS", "8")),
                    help="client threads (default $SOAK_CLIENTS, else 8)")
    ap.add_argument("--bin", default=os.environ.get("CONCH_INIT_BIN", os.path.join(ROOT, "build", "asan", "conch-init")),
                    help="the binary (default $CONCH_INIT_BIN, else build/asan/conch-init)")
    ap.add_argument("--outdir", default=os.path.join(ROOT, "build", "soak"),
                    help="where the report, the server log and (on failure) the history go")
    ap.add_argument("--report", default=None, help="the report's path (default OUTDIR/report-SEED.json)")
    ap.add_argument("--history", default=None, help="write the whole history here (JSON lines); "
                    "default: beside the report, on failure only")
    ap.add_argument("--protocols", choices=["all", "h1"], default="all",
                    help="h1: HTTP/1.1 Connect only (default: every transport, flavour and codec)")
    ap.add_argument("--fd-tolerance", type=int, default=int(os.environ.get("SOAK_FD_TOLERANCE", "0")))
    ap.add_argument("--thread-tolerance", type=int, default=int(os.environ.get("SOAK_THREAD_TOLERANCE", "0")))
    ap.add_argument("--rss-tolerance-mib", type=float, default=None,
                    help="RSS growth allowed over the warm-up's (default 64 MiB with ASan, 16 MiB without)")
    ap.add_argument("--settle-seconds", type=float, default=float(os.environ.get("SOAK_SETTLE_SECONDS", "45")))
    ap.add_argument("--epoch-seconds", type=float, default=float(os.environ.get("SOAK_EPOCH_SECONDS", "120")),
                    help="check and drop the history this often (bounds the harness's memory in long runs)")
    ap.add_argument("--upgrade-every", type=float, default=float(os.environ.get("SOAK_UPGRADE_EVERY") or 0),
                    help="upgrade the agent in place to the binary under test every this many seconds "
                         "(default $SOAK_UPGRADE_EVERY, else 0: never)")
    ap.add_argument("--quiet", action="store_true", help="print only a failure")
    a = ap.parse_args(argv)
    a.bin = os.path.abspath(a.bin)

    outdir = a.outdir
    os.makedirs(outdir, exist_ok=True)
    report_path = a.report or os.path.join(outdir, f"report-{a.seed}.json")
    say = (lambda *x: None) if a.quiet else (lambda *x: print(*x, flush=True))
    asan = "asan" in os.path.basename(os.path.dirname(a.bin)) or b"__asan_init" in open(a.bin, "rb").read()
    rss_tol = a.rss_tolerance_mib if a.rss_tolerance_mib is not None else (64 if asan else 16)

    run = Run()
    run.tolerance = {"fds": a.fd_tolerance, "threads": a.thread_tolerance, "rss_kib": int(rss_tol * 1024)}
    version = subprocess.run([a.bin, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    run.upgrade = {"every": a.upgrade_every, "version": version.split(" ")[-1] if version.startswith("conch-init ")
                   else None}
    master = random.Random(a.seed)
    token = secrets.token_hex(16)
    port = free_port()
    root = tempfile.mkdtemp(prefix=f"conch-soak-{a.seed}-")
    marker_base = f"soakcut{port}x{a.seed}"
    paths = [os.path.join(root, f"d{i}", f"f{j}") for i in range(3) for j in range(4)]
    paths += [os.path.join(root, "d0", "sub", "deep", "g0"), os.path.join(root, "new", "h0")]
    static_path = os.path.join(root, "static.bin")
    static_body = master.randbytes(3 * 1024 * 1024 + 12345)
    with open(static_path, "wb") as f:
        f.write(model.version_content("static", 99, static_body))
    run.versions["static"] = {"path": static_path, "whole": True, "failed": None}

    log_path = os.path.join(outdir, f"server-{a.seed}.log")
    log = open(log_path, "wb")
    env = dict(os.environ)
    # ASan: a small quarantine, freed pages given back each second, so that
    # RSS can come back (invariant 6); whatever ASAN_OPTIONS says wins
    asan_opts = "detect_leaks=1:abort_on_error=0:quarantine_size_mb=16:allocator_release_to_os_interval_ms=1000"
    env["ASAN_OPTIONS"] = asan_opts + (":" + env["ASAN_OPTIONS"] if env.get("ASAN_OPTIONS") else "")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    env["CONCH_PROC_RETAIN_MS"] = str(RETAIN_MS)
    say(f"soak: seed {a.seed}, {a.seconds:.0f} s, {a.clients} clients, {a.bin} on 127.0.0.1:{port}, files in {root}"
        + (f", an upgrade every {a.upgrade_every:g} s" if a.upgrade_every else ""))
    srv = subprocess.Popen([a.bin, "serve", "--listen", f"127.0.0.1:{port}", "--token", token],
                           stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}/health"
    t_up = time.monotonic() + 30
    while True:
        if srv.poll() is not None:
            print(f"soak: the server exited at start ({srv.returncode}); log {log_path}", file=sys.stderr)
            return 2
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > t_up:
            print("soak: the server did not come up", file=sys.stderr)
            srv.kill()
            return 2
        time.sleep(0.05)
    pid = srv.pid

    hist = actors.History()
    stop = threading.Event()
    ctx = actors.Ctx(port, token, hist, root, paths, static_path, stop, marker_base, a.protocols,
                     upgrades=actors.Upgrades() if a.upgrade_every else None, server_pid=pid)
    upgrader = actors.Upgrader(ctx, a.bin, a.upgrade_every) if a.upgrade_every else None
    died = []

    def server_died():
        if srv.poll() is not None and not died:
            died.append(f"exit status {srv.returncode} at t={time.monotonic() - hist.t0:.1f} s")
        return bool(died)

    # ---- warm-up: every operation once, then the baseline
    say("soak: warm-up")
    if upgrader:
        # first an upgrade: the baseline is a program started by a handover
        # (libuv's own descriptors, made anew in each program)
        upgrader.one()
    w = actors.Client(ctx, "w", random.Random(f"{a.seed}/warmup"))
    for kind in ["unary", "upload", "download", "fg_command", "bg_follow", "cmd_cut", "upload_cut",
                 "download_cut", "download_idle", "half_request"]:
        w.one(kind)
    ctx.holder.release(force=True)
    # a command that leaves a process behind: its cgroup lingers, watched
    # through libuv's inotify descriptor, which libuv keeps from then on
    import wire
    import agent_pb2 as pb
    c = wire.Call(port, token, "StartProcess")
    c.request([pb.StartProcessRequest(cmd="sh", args=["-c", "sleep 0.3 & echo left"])])
    while c.next()[0] != "end":
        pass
    c.close()
    settle(pid, run, time.monotonic() + 20, lambda m: not children(pid))
    time.sleep(2)
    run.base = measure(pid)
    say(f"soak: baseline fds {run.base['fds']} threads {run.base['threads']} RSS {run.base['rss_kib']} KiB")

    # ---- the run, in epochs: at each epoch's end the clients finish what
    # they are doing, the checkers judge that epoch's history, and it goes
    tallies = [Tally(i, n, f) for i, n, f in checks.INVARIANTS]
    ops, faults = collections.Counter(), collections.Counter()
    t0_wall = time.time()
    probe = subprocess.Popen([sys.executable, "-c", PROBE, str(port), str(t0_wall), str(time.time() + a.seconds),
                              str(hist.t0)], stdout=subprocess.PIPE, text=True)
    probe_lines = []
    pt = threading.Thread(target=lambda: probe_lines.extend(probe.stdout), daemon=True)
    pt.start()
    clients = [actors.Client(ctx, i, random.Random(f"{a.seed}/{i}")) for i in range(a.clients)]
    samples = []
    t_start = time.monotonic()
    t_end = t_start + a.seconds
    next_print = t_start + 15
    last_events = []
    warm = hist.take()  # the warm-up's records: judged too, not counted
    checks.collect_versions(warm, run.versions)
    checks.collect_upgrades(warm, run.upgrades)
    run.phase, run.events, run.final = "history", warm, {}
    for t in tallies:
        t.add(t.fn(run), warm)
    if a.history and os.path.exists(a.history):
        os.remove(a.history)
    epochs = 0
    if upgrader:
        upgrader.start(t_start, t_end)
    while True:
        ctx.stop = threading.Event()
        threads = [threading.Thread(target=c.loop, daemon=True, name=f"soak-client-{c.cid}") for c in clients]
        for t in threads:
            t.start()
        t_epoch = min(t_end, time.monotonic() + a.epoch_seconds)
        while time.monotonic() < t_epoch and not server_died():
            time.sleep(1)
            try:
                m = measure(pid)
            except OSError:
                continue
            samples.append({"t": round(time.monotonic() - t_start, 1), "fds": m["fds"], "threads": m["threads"],
                            "rss_kib": m["rss_kib"]})
            if time.monotonic() >= next_print:
                next_print += 15
                n = sum(ops.values()) + sum(1 for e in list(hist.events) if e["kind"] == "op")
                say(f"[{time.monotonic() - t_start:5.0f} s] RSS {m['rss_kib']} KiB fds {m['fds']} threads "
                    f"{m['threads']} children {len(children(pid))} operations {n}")
        ctx.stop.set()
        for t in threads:
            t.join(timeout=max(5.0, 150 - (time.monotonic() - t_epoch)))
        ctx.holder.release(force=True)
        if any(t.is_alive() for t in threads):
            run.cut_short = True
            say("soak: some clients did not finish their operation")
        if upgrader:
            with upgrader.lock:  # not in the middle of an upgrade: its window whole in one epoch
                events = hist.take()
        else:
            events = hist.take()
        epochs += 1
        ops.update(e["op"] for e in events if e["kind"] == "op")
        faults.update(e["what"] for e in events if e["kind"] == "fault")
        faults.update("upgrade" for e in events if e["kind"] == "upgrade")
        checks.collect_versions(events, run.versions)
        checks.collect_upgrades(events, run.upgrades)
        run.phase, run.events, run.final = "history", events, {}
        for t in tallies:
            t.add(t.fn(run), events)
        if a.history:
            with open(a.history, "a") as f:
                for e in events:
                    f.write(json.dumps(jsonable(e)) + "\n")
        last_events = events
        if (server_died() or run.cut_short or time.monotonic() >= t_end - 1
                or any(t.violations for t in tallies)):
            break
        say(f"soak: epoch {epochs} checked ({len(events)} records), going on")

    ctx.holder.stop()
    if upgrader:
        upgrader.join()
        late = hist.take()  # an upgrade that ended after the last epoch's records were taken
        if late:
            faults.update("upgrade" for e in late if e["kind"] == "upgrade")
            checks.collect_upgrades(late, run.upgrades)
            run.phase, run.events, run.final = "history", late, {}
            for t in tallies:
                t.add(t.fn(run), late)
            last_events = last_events + late

    # ---- settle, then the final state
    say("soak: settling")
    t_settle = time.monotonic()
    final = {}
    if not server_died():
        settle(pid, run, time.monotonic() + a.settle_seconds, lambda m: not [k for k in children(pid)
                                                                          if k["state"] != "Z"])
        time.sleep(RETAIN_MS / 1000 + 1)  # ended background records (and their kept output) go
        base, tol = run.base, run.tolerance
        m = settle(pid, run, t_settle + a.settle_seconds,
                   lambda m: m["fds"] <= base["fds"] + tol["fds"] and m["threads"] <= base["threads"] + tol["threads"]
                   and m["rss_kib"] <= base["rss_kib"] + tol["rss_kib"] and not children(pid))
        final["res"] = m
        final["children"] = children(pid)
        final["marked"] = marked(marker_base)
        final["temp_files"], final["dirs_scanned"] = temp_files(root, pid)
        final["files"] = [file_state(p) for p in paths]
        final["cgroups"] = held_cgroups(pid)
        final["settle_s"] = round(time.monotonic() - t_settle, 1)
        final["serving"] = still_serving(port, token, static_path)
        try:
            final["metrics"] = actors.http_get(port, token, "/metrics")[1]
        except OSError as e:
            final["metrics"] = f"{type(e).__name__}: {e}"

    # ---- stop the server
    exit_code = None
    if not server_died():
        srv.send_signal(signal.SIGTERM)
        try:
            exit_code = srv.wait(timeout=60)
        except subprocess.TimeoutExpired:
            srv.kill()
            exit_code = "killed after 60 s"
    log.close()
    probe.terminate()
    probe.wait(timeout=10)
    pt.join(timeout=5)
    with open(log_path, errors="replace") as f:
        text = f.read()
    run.server = {"died": died[0] if died else None, "exit": exit_code, "sanitizer": sanitizer_report(text),
                  "log": log_path}
    if final:
        final["upgrade_log"] = {w: text.count(w) for w in ("upgraded in place", "upgrade rolled back",
                                                           "upgrade abandoned")}
    run.probes = [json.loads(x) for x in probe_lines if x.strip()]

    # ---- the final checks
    run.phase, run.events, run.final = "final", [], final
    for t in tallies:
        t.add(t.fn(run), last_events)
    ok = not any(t.violations for t in tallies)
    report = build_report(a, run, tallies, ops, faults, samples, port, ok, epochs)
    with open(report_path, "w") as f:
        json.dump(jsonable(report), f, indent=1)
    hist_path = a.history
    if not ok and not hist_path:
        hist_path = os.path.join(outdir, f"history-{a.seed}.jsonl")
        with open(hist_path, "w") as f:
            for e in last_events:
                f.write(json.dumps(jsonable(e)) + "\n")
    print_summary(a, report, say)
    if not ok:
        print_failure(a, run, tallies, hist_path, report_path)
    else:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


def build_report(a, run, tallies, ops, faults, samples, port, ok, epochs):
    by = {t.name: t for t in tallies}
    probes = run.probes
    worst = max(probes, key=lambda p: p["latency"]) if probes else None
    return {
        "seed": a.seed, "seconds": a.seconds, "clients": a.clients, "binary": a.bin, "port": port,
        "protocols": a.protocols, "epochs": epochs, "ok": ok,
        "counts": {
            "ops": dict(sorted(ops.items())), "faults": dict(sorted(faults.items())),
            "bytes_checked": {"background_output": by["output_exactly_once"].checked,
                              "downloads": by["no_half_written_file"].checked,
                              "command_output": by["command_output_exact"].checked},
            "background_writers": by["output_exactly_once"].notes.get("writers", 0),
            "background_gaps": by["output_exactly_once"].notes.get("gaps", 0),
        },
        "health": {"probes": len(probes), "worst_ms": round(worst["latency"] * 1000, 1) if worst else None,
                   "worst_at_s": worst["t"] if worst else None,
                   "failed": sum(1 for p in probes if not p["ok"]), "bound_ms": checks.HEALTH_BOUND_S * 1000},
        "resources": {"base": {k: run.base[k] for k in ("fds", "threads", "rss_kib")} if run.base else None,
                      "end": {k: run.final["res"][k] for k in ("fds", "threads", "rss_kib")}
                      if run.final.get("res") else None,
                      "peak_rss_kib": max([s["rss_kib"] for s in samples] or [0]),
                      "peak_fds": max([s["fds"] for s in samples] or [0]),
                      "tolerance": run.tolerance, "settle_s": run.final.get("settle_s"),
                      "samples": samples[::max(1, len(samples) // 60)]},
        "server": {k: v for k, v in run.server.items() if k != "sanitizer"},
        "invariants": [{"id": t.iid, "name": t.name, "ok": not t.violations, "checked": t.checked,
                        "unit": t.unit or "", "violations": t.count,
                        "first": t.violations[0][2] if t.violations else None,
                        "what": (t.fn.__doc__ or "").replace("\n    ", " ").strip()}
                       for t in tallies],
        "cut_short": run.cut_short,
        "upgrades": upgrade_summary(run, by),
    }


def upgrade_summary(run, by):
    """What the upgrades did, and what the checkers excused because of them."""
    ups = run.upgrades
    ready = [u["t_ready"] - u["t_answer"] for u in ups if u["t_ready"] is not None and u["status"] == 200]
    return {"every": run.upgrade.get("every"), "version": run.upgrade.get("version"),
            "answered": sum(1 for u in ups if u["status"] == 200), "calls": len(ups),
            "metrics_at_end": run.final.get("metrics", {}).get("upgrades")
            if isinstance(run.final.get("metrics"), dict) else None,
            "worst_ready_ms": round(max(ready) * 1000, 1) if ready else None,
            "windows": [[u["t_call"], u["t_ready"]] for u in ups][:200],
            "excused": {"streams_and_calls_cut": by["server_sound"].notes.get("cut_by_upgrade", 0),
                        "foreground_cut": by["command_output_exact"].notes.get("cut_by_upgrade", 0),
                        "foreground_adopted": by["command_output_exact"].notes.get("adopted", 0),
                        "adopted_ended_before": by["command_output_exact"].notes.get("ended_before_upgrade", 0),
                        "adopted_not_found": by["command_output_exact"].notes.get("adopted_not_found", 0),
                        "cut_commands_adopted_killed": by["cut_commands_killed"].notes.get("adopted_then_killed", 0),
                        "writers_unstarted": by["output_exactly_once"].notes.get("unstarted_in_upgrade", 0),
                        "health_probes": by["health_answered"].notes.get("in_upgrade", 0)}}


def print_summary(a, r, say):
    c = r["counts"]
    say(f"soak: seed {r['seed']}: {sum(c['ops'].values())} operations {json.dumps(c['ops'])}")
    say(f"  faults {json.dumps(c['faults'])}")
    say(f"  bytes checked {json.dumps(c['bytes_checked'])}, {c['background_writers']} background writers "
        f"({c['background_gaps']} gaps resumed)")
    u = r["upgrades"]
    if u["every"] or u["calls"]:
        say(f"  upgrades: {u['answered']} answered of {u['calls']} (every {u['every']:g} s, version {u['version']}), "
            f"/metrics at the end {u['metrics_at_end']}, worst answer-to-serving {u['worst_ready_ms']} ms; "
            f"excused by them {json.dumps(u['excused'])}")
    h = r["health"]
    say(f"  /health: {h['probes']} probes, worst {h['worst_ms']} ms at t={h['worst_at_s']} s, {h['failed']} failed")
    res = r["resources"]
    say(f"  resources: base {res['base']} end {res['end']} peak RSS {res['peak_rss_kib']} KiB, "
        f"peak fds {res['peak_fds']}, settled in {res['settle_s']} s")
    for inv in r["invariants"]:
        say(f"  {'ok  ' if inv['ok'] else 'FAIL'} {inv['id']} {inv['name']}: {inv['checked']} {inv['unit']} checked"
            + (f", {inv['violations']} violations; first: {inv['first'][:300]}" if not inv["ok"] else ""))
    say(f"soak: {'OK' if r['ok'] else 'FAILED'} (seed {r['seed']})")


def print_failure(a, run, tallies, hist_path, report_path):
    t = next(x for x in tallies if x.violations)
    seq, subject, text, lines = t.violations[0]
    out = sys.stdout
    print(f"\nsoak: FAILED, seed {a.seed}: invariant {t.iid} {t.name} broken", file=out)
    print(f"  ({(t.fn.__doc__ or '').strip().splitlines()[0]} …)", file=out)
    print("  " + text.replace("\n", "\n  "), file=out)
    for line in lines:
        print("  " + line, file=out)
    if t.count > 1:
        print(f"  ({t.count - 1} more violations of this invariant)", file=out)
    print(f"  report {report_path}" + (f", history {hist_path}" if hist_path else "")
          + f", server log {run.server.get('log')}", file=out)
    print(f"  replay: tests/soak/soak.py --seed {a.seed} --seconds {a.seconds:g} --clients {a.clients}"
          + (f" --upgrade-every {a.upgrade_every:g}" if a.upgrade_every else ""), file=out)


if __name__ == "__main__":
    sys.exit(main())
