"""The soak clients: each a thread with its own random.Random, seeded from
the master seed and its index, that picks operations and faults from it
and records what it saw in the shared History.  The checkers (checks.py)
judge that history; a client judges nothing beyond what it needs to go on
(where to resume a stream from).

Every operation records `op` (kind) once; every injected fault records
`fault` (what) once.  Records carry the subject a checker groups them by:
`tag` (background writer), `fg` (foreground command), `marker` (a cut
command), `vid`/`path` (uploads, downloads).

With upgrades (`--upgrade-every`), an Upgrader thread replaces the agent in
place every N seconds; the clients see their connections cut (a cut
connection like any other) and go on: a reader resumes with replay, a
foreground command cut by an upgrade is followed by pid (it was adopted),
a command meant to be killed that an upgrade adopted instead is killed by
its client; the records say when each connection was opened (`t_open`)
and when its break was noticed, so that the checkers accept a break only
inside an upgrade window (Upgrades).
"""
import hashlib
import http.client
import json
import os
import socket
import threading
import time
import traceback

import agent_pb2 as pb
import model
import wire
from wire import WireError


class History:
    """Every record of the run, in the order the clients made them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.events = []
        self.seq = 0
        self.t0 = time.monotonic()

    def rec(self, client, kind, **fields):
        with self.lock:
            ev = {"seq": self.seq, "t": round(time.monotonic() - self.t0, 4), "client": client, "kind": kind}
            self.seq += 1
            ev.update(fields)
            self.events.append(ev)
            return ev

    def take(self):
        """The records so far (an epoch's), and a fresh list for the next."""
        with self.lock:
            out, self.events = self.events, []
            return out


class Holder:
    """Connections a fault holds for a while (a download never read, an idle
    half-request), cut on time by a thread of their own: not by the client
    that made them, which may meanwhile wait on the server for something
    those very connections hold (the daemon-wide budget)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []  # (release time, object with reset/cancel/close, how)
        self.wake = threading.Event()
        self.done = False
        self.thread = threading.Thread(target=self._run, daemon=True, name="soak-holder")
        self.thread.start()

    def add(self, when, obj, how):
        with self.lock:
            self.items.append((when, obj, how))
        self.wake.set()

    def release(self, force=False):
        now = time.monotonic()
        with self.lock:
            due = [x for x in self.items if force or x[0] <= now]
            self.items = [x for x in self.items if not (force or x[0] <= now)]
        for _when, obj, how in due:
            try:
                {"rst": obj.reset, "cancel": obj.cancel}.get(how, obj.close)()
            except OSError:
                pass

    def _run(self):
        while not self.done:
            self.wake.wait(0.1)
            self.wake.clear()
            self.release()

    def stop(self):
        self.release(force=True)
        self.done = True


class Upgrades:
    """The upgrade windows so far (History time): [begin, end], end None
    while one is under way.  The clients ask it how to go on after a
    break (follow an adopted command, retry); the checkers judge from the
    upgrader's records in the history, not from this."""

    MARGIN = 0.5

    def __init__(self):
        self.cond = threading.Condition()
        self.windows = []

    def begin(self, t):
        with self.cond:
            self.windows.append([t, None])

    def end(self, t):
        with self.cond:
            self.windows[-1][1] = t
            self.cond.notify_all()

    def touched(self, t_from, t_to):
        """Whether an upgrade window met [t_from, t_to] (with the margin)."""
        with self.cond:
            return any(b - self.MARGIN <= t_to and (e is None or e + self.MARGIN >= t_from)
                       for b, e in self.windows)

    def wait_quiet(self, timeout=60.0):
        """Until no upgrade is under way."""
        end = time.monotonic() + timeout
        with self.cond:
            while self.windows and self.windows[-1][1] is None and time.monotonic() < end:
                self.cond.wait(0.2)


class Ctx:
    """What every client shares: the server, the history, the file paths."""

    def __init__(self, port, token, history, root, paths, static_path, stop, marker_base, protocols,
                 upgrades=None, server_pid=None):
        self.holder = Holder()
        self.port, self.token, self.h = port, token, history
        self.root, self.paths, self.static_path = root, paths, static_path
        self.stop = stop
        self.marker_base = marker_base
        self.protocols = protocols  # "all", or "h1" (HTTP/1.1 Connect only)
        self.upgrades = upgrades    # Upgrades, or None: no upgrade in this run
        self.server_pid = server_pid

    def now(self):
        return round(time.monotonic() - self.h.t0, 4)

    def upgraded(self, t_from):
        """An upgrade met the time since t_from (History time)."""
        return self.upgrades is not None and self.upgrades.touched(t_from, self.now())


# operation kind → weight
OPS = {
    "bg_follow": 14,
    "fg_command": 14,
    "cmd_cut": 7,
    "cmd_timeout": 2,
    "upload": 16,
    "upload_cut": 9,
    "download": 16,
    "download_cut": 5,
    "download_idle": 4,
    "half_request": 4,
    "unary": 5,
}


class Client:
    """One client: loop() runs operations until ctx.stop (an epoch's end),
    finishing the one under way; a thread per client and epoch runs it."""

    def __init__(self, ctx, cid, rng, ops=None):
        self.ctx, self.cid, self.rng = ctx, cid, rng
        self.n = 0
        self.ops = ops or OPS
        self.kinds = list(self.ops)
        self.weights = [self.ops[k] for k in self.kinds]

    # ------------------------------------------------------------ helpers
    def rec(self, kind, **f):
        return self.ctx.h.rec(self.cid, kind, **f)

    def fault(self, what, **f):
        return self.rec("fault", what=what, **f)

    def call(self, method, **kw):
        if self.ctx.protocols == "h1":
            t, fl, co = "h1", "connect", self.rng.choice(["json", "proto"])
        else:
            t, fl, co = wire.pick_transport(self.rng)
        for attempt in range(4):
            t_open = self.ctx.now()
            try:
                c = wire.Call(self.ctx.port, self.ctx.token, method, t, fl, co, **kw)
                c.t_open = t_open
                return c
            except OSError as e:
                # the connection went at once (an HTTP/2 preface into a
                # connection the exec closed): a cut; retried after an upgrade
                self.rec("call_broken", method=method, t_open=t_open, error=f"{type(e).__name__}: {e}")
                if attempt == 3 or not self.ctx.upgraded(t_open):
                    raise
                self.ctx.upgrades.wait_quiet()

    def after_upgrade(self, t_open):
        """True when an upgrade met this connection (opened at t_open):
        then wait until the new program serves."""
        if not self.ctx.upgraded(t_open):
            return False
        self.ctx.upgrades.wait_quiet()
        return True

    def next_id(self):
        self.n += 1
        return self.n

    def cut(self, c, how):
        """End a call the way a fault says: rst (TCP RST), fin (close),
        cancel (HTTP/2 RST_STREAM, or RST on HTTP/1.1)."""
        if how == "rst":
            c.reset()
        elif how == "cancel":
            c.cancel()
        else:
            c.close()

    def stall(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.ctx.stop.is_set():
            time.sleep(min(0.1, end - time.monotonic()))

    # ------------------------------------------------------------ the loop
    def loop(self):
        while not self.ctx.stop.is_set():
            kind = self.rng.choices(self.kinds, self.weights)[0]
            self.one(kind)

    def one(self, kind):
        self.rec("op", op=kind)
        try:
            getattr(self, "op_" + kind)()
        except Exception as e:  # noqa: BLE001 - recorded: the checkers decide
            self.rec("op_exception", op=kind, error=f"{type(e).__name__}: {e}",
                     trace=traceback.format_exc()[-1500:])

    # ------------------------------------------------------------ background writers (invariant 1)
    def op_bg_follow(self):
        rng = self.rng
        tag = f"soak-{self.cid}-{self.next_id()}"
        p = model.bg_params(rng, tag)
        exp = model.bg_expected(p)
        self.rec("bg_begin", tag=tag, params=p, total={k: len(v) for k, v in exp.items()})
        have = {"stdout": 0, "stderr": 0}
        conn = 0
        c = self.call("StartProcess")
        self.rec("bg_conn", tag=tag, conn=conn, how="start", via=c.label, replay=None)
        started = False  # a start event seen (the record exists)
        cut_at_start = False  # the StartProcess stream broke in an upgrade before its start event
        try:
            c.request([pb.StartProcessRequest(cmd="sh", args=["-c", model.bg_script(p)], background=True, tag=tag)])
        except (WireError, OSError) as e:
            self.rec("bg_broken", tag=tag, conn=conn, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
            cut_at_start = self.after_upgrade(c.t_open)
        got_end = False
        deadline = time.monotonic() + p["lines"] / p["batch"] * p["pause"] + 90
        while True:
            # the fault for this connection: after how many events, and what
            plan = None
            if rng.random() < 0.7:
                plan = (rng.randint(1, 40), rng.choice(["rst", "rst", "fin", "cancel", "stall", "stall"]),
                        round(rng.uniform(0.2, 3.0), 2))
            events = 0
            stream_done = False
            try:
                while True:
                    k, m = c.next()
                    if k == "end":
                        self.rec("bg_stream_end", tag=tag, conn=conn, code=m.code, message=m.message)
                        stream_done = True
                        if m.code == "not_found" and cut_at_start and not started:
                            # its StartProcess was cut by an upgrade before any
                            # answer: the request may never have been read (or its
                            # start was under way when the drain ended: not carried)
                            self.rec("bg_unstarted", tag=tag, conns=conn + 1)
                            c.close()
                            return
                        if m.code in ("not_found", "out_of_range", "invalid_argument", "unauthenticated"):
                            self.rec("bg_giveup", tag=tag, have=dict(have), conns=conn + 1)
                            c.close()
                            return
                        break
                    which = m.WhichOneof("event")
                    if which == "data":
                        ch = m.data.WhichOneof("output")
                        d = getattr(m.data, ch)
                        off = m.data.offset
                        self.rec("bg_data", tag=tag, conn=conn, ch=ch, off=off, n=len(d), dig=model.digest(d),
                                 head=d[:16])
                        if off > have[ch]:
                            self.rec("bg_gap", tag=tag, conn=conn, ch=ch, have=have[ch], off=off)
                            c.close()
                            break
                        have[ch] = max(have[ch], off + len(d))
                    elif which == "start":
                        started = True
                        self.rec("bg_start", tag=tag, conn=conn, pid=m.start.pid)
                    elif which == "end":
                        got_end = True
                        self.rec("bg_end", tag=tag, conn=conn, exit_code=m.end.exit_code, status=m.end.status,
                                 exited=m.end.exited, error=m.end.error)
                    events += 1
                    if plan and events == plan[0]:
                        what = plan[1]
                        if what == "stall":
                            self.fault("reader_stall", tag=tag, conn=conn, seconds=plan[2])
                            self.stall(plan[2])
                            plan = None
                            continue
                        self.fault("stream_" + what, tag=tag, conn=conn, after_events=events, op="bg_follow")
                        self.cut(c, what)
                        break
            except (WireError, OSError) as e:
                self.rec("bg_broken", tag=tag, conn=conn, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
                c.close()
                if self.after_upgrade(c.t_open) and conn == 0 and not started:
                    cut_at_start = True
            if got_end and stream_done:
                self.rec("bg_done", tag=tag, have=dict(have), conns=conn + 1)
                return
            if time.monotonic() > deadline or conn >= 400:
                self.rec("bg_giveup", tag=tag, have=dict(have), conns=conn + 1)
                return
            if stream_done and not got_end:
                time.sleep(0.1)  # ended with an error: Connect again, a little later
            if got_end and not stream_done:
                # the end event came but not the end of the stream: the
                # stream was cut after it; what we have is all there is
                self.rec("bg_done", tag=tag, have=dict(have), conns=conn + 1)
                return
            if rng.random() < 0.25:
                self.peek(tag, have)
            conn += 1
            c = self.call("Connect")
            replay = pb.ReplayFrom(stdout=have["stdout"], stderr=have["stderr"])
            self.rec("bg_conn", tag=tag, conn=conn, how="replay", via=c.label, replay=dict(have))
            try:
                c.request([pb.ConnectProcessRequest(process=pb.ProcessSelector(tag=tag), replay=replay)])
            except (WireError, OSError) as e:
                self.rec("bg_broken", tag=tag, conn=conn, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
                c.close()
                time.sleep(0.05)

    def peek(self, tag, have):
        """A second reader, from an offset inside what was seen (any byte,
        not an event boundary): its bytes must match too."""
        rng = self.rng
        frm = {ch: rng.randint(0, n) for ch, n in have.items()}
        c = self.call("Connect")
        self.rec("bg_peek", tag=tag, via=c.label, replay=frm)
        pos = dict(frm)
        try:
            c.request([pb.ConnectProcessRequest(process=pb.ProcessSelector(tag=tag),
                                                replay=pb.ReplayFrom(**frm))])
            for _ in range(rng.randint(1, 12)):
                k, m = c.next()
                if k == "end":
                    self.rec("bg_peek_end", tag=tag, code=m.code, message=m.message)
                    break
                if m.WhichOneof("event") == "data":
                    ch = m.data.WhichOneof("output")
                    d = getattr(m.data, ch)
                    self.rec("bg_peek_data", tag=tag, ch=ch, off=m.data.offset, n=len(d), dig=model.digest(d),
                             pos=pos[ch], head=d[:16])
                    pos[ch] = max(pos[ch], m.data.offset + len(d))
        except (WireError, OSError) as e:
            self.rec("bg_peek_broken", tag=tag, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
        self.cut(c, rng.choice(["rst", "fin", "cancel"]))

    # ------------------------------------------------------------ foreground commands (invariant 4)
    def op_fg_command(self):
        rng = self.rng
        fid = f"{self.cid}.{self.next_id()}"
        p = model.fg_params(rng, slow=self.ctx.upgrades is not None)
        cmd, args, stdin = model.fg_request(p)
        c = self.call("StartProcess", rcvbuf=rng.choice([None, None, 8192]))
        self.rec("fg_begin", fg=fid, params=p, via=c.label)
        stall_at = rng.randint(1, 30) if rng.random() < 0.3 else None
        stall_s = round(rng.uniform(0.2, 2.5), 2)
        events = 0
        pid = None
        ended = False
        try:
            # SOAK_FG names the command in List (a cut before its start event)
            c.request([pb.StartProcessRequest(cmd=cmd, args=args, stdin=stdin, env={"SOAK_FG": fid})],
                      chunked=rng.random() < 0.3)
            while True:
                k, m = c.next()
                if k == "end":
                    self.rec("fg_stream_end", fg=fid, code=m.code, message=m.message)
                    break
                which = m.WhichOneof("event")
                if which == "data":
                    ch = m.data.WhichOneof("output")
                    d = getattr(m.data, ch)
                    self.rec("fg_data", fg=fid, ch=ch, off=m.data.offset, n=len(d), dig=model.digest(d), head=d[:16])
                elif which == "end":
                    ended = True
                    self.rec("fg_end", fg=fid, exit_code=m.end.exit_code, exited=m.end.exited,
                             status=m.end.status, error=m.end.error)
                elif which == "start":
                    pid = m.start.pid
                    self.rec("fg_start", fg=fid, pid=pid)
                events += 1
                if stall_at == events:
                    self.fault("reader_stall", fg=fid, seconds=stall_s)
                    self.stall(stall_s)
        except (WireError, OSError) as e:
            self.rec("fg_broken", fg=fid, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
            c.close()
            if not ended and self.after_upgrade(c.t_open):
                self.follow_adopted(fid, pid)
        finally:
            c.close()

    def follow_adopted(self, fid, pid):
        """The stream of foreground command fid was cut by an upgrade: the
        new program adopted it (a background record without a tag, found
        by pid, its output retained from the upgrade on).  Connect to it
        with replay from 0 and read to its end, resuming after a further
        cut; records fg_adopt_* (checks.py judges them)."""
        if pid is None:  # cut before its start event: List names it by its SOAK_FG
            try:
                st, body = wire.unary(self.ctx.port, self.ctx.token, "/pb.ProcessService/List", {})
                found = [x.get("pid") for x in (body or {}).get("processes", [])
                         if x.get("config", {}).get("env", {}).get("SOAK_FG") == fid]
            except (OSError, http.client.HTTPException, AttributeError) as e:
                st, found = f"{type(e).__name__}: {e}", []
            if len(found) != 1:
                self.rec("fg_adopt_none", fg=fid, list_status=st, found=found)
                return
            pid = found[0]
        have = {"stdout": 0, "stderr": 0}
        for conn in range(10):
            c = self.call("Connect")
            self.rec("fg_adopt_conn", fg=fid, pid=pid, conn=conn, via=c.label, replay=dict(have))
            try:
                c.request([pb.ConnectProcessRequest(process=pb.ProcessSelector(pid=pid),
                                                    replay=pb.ReplayFrom(**have))])
                while True:
                    k, m = c.next()
                    if k == "end":
                        alive = None
                        if m.code == "not_found":
                            alive = _child_alive(pid, self.ctx.server_pid)
                        self.rec("fg_adopt_stream_end", fg=fid, pid=pid, code=m.code, message=m.message,
                                 alive=alive)
                        return
                    which = m.WhichOneof("event")
                    if which == "data":
                        ch = m.data.WhichOneof("output")
                        d = getattr(m.data, ch)
                        self.rec("fg_adopt_data", fg=fid, ch=ch, off=m.data.offset, n=len(d),
                                 dig=model.digest(d), head=d[:16])
                        have[ch] = max(have[ch], m.data.offset + len(d))
                    elif which == "end":
                        self.rec("fg_adopt_end", fg=fid, exit_code=m.end.exit_code, exited=m.end.exited,
                                 status=m.end.status, error=m.end.error)
                    elif which == "start":
                        self.rec("fg_adopt_start", fg=fid, pid=m.start.pid)
            except (WireError, OSError) as e:
                self.rec("fg_adopt_broken", fg=fid, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
                if not self.after_upgrade(c.t_open):
                    return
            finally:
                c.close()

    # ------------------------------------------------------------ commands cut after their start (invariant 8)
    def op_cmd_cut(self):
        rng = self.rng
        marker = f"{self.ctx.marker_base}-{self.cid}-{self.next_id()}"
        if rng.random() < 0.5:
            cmd, args = "yes", [marker]
        else:
            cmd, args = "sh", ["-c", "while :; do echo tick; sleep 0.05; done", marker]
        c = self.call("StartProcess", rcvbuf=rng.choice([None, 4096]))
        after = rng.randint(1, 6)
        how = rng.choice(["rst", "fin", "cancel"])
        self.rec("cut_begin", marker=marker, cmd=cmd, via=c.label)
        events = 0
        try:
            c.request([pb.StartProcessRequest(cmd=cmd, args=args)])
            while events < after:
                k, m = c.next()
                if k == "end":
                    self.rec("cut_stream_end", marker=marker, code=m.code, message=m.message)
                    c.close()
                    return
                if m.WhichOneof("event") == "start":
                    self.rec("cut_start", marker=marker, pid=m.start.pid)
                events += 1
        except (WireError, OSError) as e:
            self.rec("cut_broken", marker=marker, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
        if rng.random() < 0.3:
            self.stall(rng.uniform(0.1, 1.5))  # a reader gone quiet before it goes away
        self.fault("command_cut_" + how, marker=marker, after_events=events)
        self.cut(c, how)
        if self.after_upgrade(c.t_open):
            self.kill_adopted(marker)

    def kill_adopted(self, marker):
        """An upgrade met a command meant to be killed when its client goes
        away: a stream the exec closed is no client going away, the new
        program adopted the command (and so did it when the cut came just
        before the drain).  Its client kills it (cut_adopted); checks.py
        accepts that only when an upgrade window met the command's stream."""
        try:
            st, body = wire.unary(self.ctx.port, self.ctx.token, "/pb.ProcessService/List", {})
            procs = (body or {}).get("processes", []) if st == 200 else []
        except (OSError, http.client.HTTPException, AttributeError) as e:
            self.rec("cut_adopted_list", marker=marker, error=f"{type(e).__name__}: {e}")
            return
        for x in procs:
            if marker in x.get("config", {}).get("args", []) and x.get("running"):
                try:
                    st, body = wire.unary(self.ctx.port, self.ctx.token, "/pb.ProcessService/SendSignal",
                                          {"process": {"pid": x["pid"]}, "signal": 9})
                except (OSError, http.client.HTTPException) as e:
                    st, body = None, f"{type(e).__name__}: {e}"
                self.rec("cut_adopted", marker=marker, pid=x["pid"], tag=x.get("tag", ""), kill_status=st,
                         kill_answer=body if st != 200 else None)

    def op_cmd_timeout(self):
        """A tree with setsid escapees under Connect-Timeout-Ms: the stream
        ends deadline_exceeded and every process of the tree is killed."""
        rng = self.rng
        marker = f"{self.ctx.marker_base}-{self.cid}-{self.next_id()}"
        ms = rng.randint(300, 2000)
        n = rng.randint(1, 6)
        script = (f'for i in $(seq {n}); do setsid sh -c "sleep 300; :" {marker} & done; '
                  'echo started; sleep 300; :')
        t = "h1" if self.ctx.protocols == "h1" else self.rng.choice(["h1", "h2"])
        t_open = self.ctx.now()
        c = wire.Call(self.ctx.port, self.ctx.token, "StartProcess", t, "connect", rng.choice(["json", "proto"]),
                      headers={"Connect-Timeout-Ms": str(ms)})
        c.t_open = t_open
        self.rec("cut_begin", marker=marker, cmd="sh", via=c.label, timeout_ms=ms, escapees=n)
        self.fault("deadline_tree", marker=marker, timeout_ms=ms, escapees=n)
        try:
            c.request([pb.StartProcessRequest(cmd="sh", args=["-c", script, marker])])
            while True:
                k, m = c.next()
                if k == "end":
                    self.rec("timeout_end", marker=marker, code=m.code, message=m.message)
                    break
                if m.WhichOneof("event") == "end":
                    self.rec("timeout_end_event", marker=marker, exit_code=m.end.exit_code, error=m.end.error)
        except (WireError, OSError) as e:
            self.rec("cut_broken", marker=marker, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
        finally:
            c.close()

    # ------------------------------------------------------------ uploads (invariants 2, 3)
    def _upload_messages(self, path, content):
        rng = self.rng
        msgs, i = [], 0
        while i < len(content) or not msgs:
            n = rng.choice([rng.randint(1, 512), rng.randint(512, 16384), rng.randint(16384, 131072),
                            rng.randint(131072, 1 << 20)])
            m = pb.FileChunk(content=content[i:i + n])
            if not msgs or rng.random() < 0.1:
                m.filepath = path
            msgs.append(m)
            i += n
        return msgs

    def op_upload(self, cut=False):
        rng = self.rng
        pi = rng.randrange(len(self.ctx.paths))
        path = self.ctx.paths[pi]
        vid = f"{self.cid}.{self.next_id()}"
        size = rng.choice([0, rng.randint(1, 2000), rng.randint(2000, 100000), rng.randint(100000, 600000),
                           rng.randint(600000, 2500000)])
        body = rng.randbytes(size)
        content = model.version_content(vid, pi, body)
        c = self.call("PostFileStream")
        msgs = self._upload_messages(path, content)
        data = c.body_of(msgs)
        chunked = c.t.name == "h1" and rng.random() < 0.4
        self.rec("up_begin", vid=vid, path=path, size=len(content), sha=hashlib.sha256(content).hexdigest(),
                 chunks=len(msgs), body=len(data), via=c.label, chunked=chunked, cut=cut)
        at = rng.randrange(0, len(data)) if cut else len(data)
        how = rng.choice(["rst", "rst", "fin", "cancel"])
        stall_at = rng.randrange(0, at + 1) if rng.random() < 0.15 else None
        try:
            c.start(None if chunked else len(data))
            pos = 0
            while pos < at:
                n = min(at - pos, rng.choice([1000, 16384, 65536, 262144]))
                if stall_at is not None and pos <= stall_at < pos + n:
                    s = round(rng.uniform(0.2, 2.0), 2)
                    self.fault("upload_stall", vid=vid, at=pos, seconds=s)
                    self.stall(s)
                    stall_at = None
                c.send_raw(data[pos:pos + n])
                pos += n
            if cut:
                self.fault("upload_cut_" + how, vid=vid, path=path, at=at, of=len(data))
                self.cut(c, how)
                return
            c.finish()
            self.rec("up_sent", vid=vid, path=path)
            answer = None
            while True:
                k, m = c.next()
                if k == "end":
                    self.rec("up_done", vid=vid, path=path, code=m.code, message=m.message,
                             count=answer.uploaded_count if answer else None)
                    break
                answer = m
        except (WireError, OSError) as e:
            self.rec("up_broken", vid=vid, path=path, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
        finally:
            c.close()

    def op_upload_cut(self):
        self.op_upload(cut=True)

    # ------------------------------------------------------------ downloads (invariant 2)
    def _download_path(self):
        if self.rng.random() < 0.15:
            return self.ctx.static_path
        return self.rng.choice(self.ctx.paths)

    def op_download(self, cut=False):
        rng = self.rng
        path = self._download_path()
        c = self.call("GetFileStream", rcvbuf=rng.choice([None, None, 4096]))
        self.rec("down_begin", path=path, via=c.label, cut=cut)
        head = bytearray()
        sha = hashlib.sha256()
        total = chunks = 0
        stall_at = rng.randint(1, 4) if rng.random() < 0.2 else None
        cut_at = rng.randint(0, 3) if cut else None
        hlen = None
        try:
            c.request([pb.GetFileRequest(filepath=path)])
            while True:
                if cut_at is not None and chunks >= cut_at:
                    how = rng.choice(["rst", "fin", "cancel"])
                    self.fault("download_cut_" + how, path=path, after_chunks=chunks, after_bytes=total)
                    self.cut(c, how)
                    return
                k, m = c.next()
                if k == "end":
                    if m.code is None:
                        self.rec("down_done", path=path, size=total, chunks=chunks, head=bytes(head[:200]),
                                 body_sha=sha.hexdigest() if hlen is not None else None, hlen=hlen)
                    else:
                        self.rec("down_error", path=path, code=m.code, message=m.message, size=total)
                    break
                d = m.content
                chunks += 1
                total += len(d)
                if hlen is None:
                    head += d
                    parsed = model.parse_version(bytes(head[:300]))
                    if parsed:
                        hlen = parsed[4]
                        sha.update(bytes(head[hlen:]))
                    elif len(head) > 300 or b"\n" in head[:300]:
                        hlen = -1  # no header: the checker says so
                else:
                    sha.update(d)
                if stall_at == chunks:
                    s = round(rng.uniform(0.2, 2.5), 2)
                    self.fault("reader_stall", path=path, seconds=s, op="download")
                    self.stall(s)
        except (WireError, OSError) as e:
            self.rec("down_broken", path=path, t_open=c.t_open, error=f"{type(e).__name__}: {e}")
        finally:
            c.close()

    def op_download_cut(self):
        self.op_download(cut=True)

    def op_download_idle(self):
        """A download never read: the request, then nothing, then a cut."""
        rng = self.rng
        c = self.call("GetFileStream", rcvbuf=2048, window=rng.choice([None, 1024]))
        path = self.ctx.static_path
        hold = round(rng.uniform(0.5, 8.0), 2)
        how = rng.choice(["rst", "fin", "cancel"])
        try:
            c.request([pb.GetFileRequest(filepath=path)])
        except (WireError, OSError) as e:
            self.rec("down_idle_broken", t_open=c.t_open, error=f"{type(e).__name__}: {e}")
            c.close()
            return
        self.fault("download_never_read", path=path, hold=hold, then=how)
        self.ctx.holder.add(time.monotonic() + hold, c, how)

    # ------------------------------------------------------------ idle half-requests
    def op_half_request(self):
        rng = self.rng
        tok = self.ctx.token
        kind = rng.choice(["h1_head", "h1_body", "h2_headers", "h1_trickle", "garbage"])
        hold = round(rng.uniform(0.5, 14.0), 2)
        how = rng.choice(["rst", "fin"])
        s = socket.create_connection((wire.HOST, self.ctx.port), timeout=10)
        try:
            if kind == "garbage":
                s.sendall(rng.randbytes(rng.randint(1, 4096)))
            elif kind == "h1_trickle":  # a head a byte at a time (the slowloris of tests/soak.py)
                head = b"POST /pb.ProcessService/List HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200
                end = time.monotonic() + hold
                for b in head:
                    if time.monotonic() >= end or self.ctx.stop.is_set():
                        break
                    s.sendall(bytes([b]))
                    time.sleep(0.1)
                hold = 0
            elif kind.startswith("h1"):
                body = wire.envelope(b'{"cmd":"true"}')
                full = wire.H1.head_bytes("/pb.ProcessService/StartProcess",
                                          {"Content-Type": "application/connect+json", "conch-init-token": tok},
                                          len(body)) + body
                head_len = len(full) - len(body)
                at = rng.randrange(1, head_len) if kind == "h1_head" else rng.randrange(head_len, len(full))
                s.sendall(full[:at])
            else:
                import h2.config
                import h2.connection
                h = h2.connection.H2Connection(config=h2.config.H2Configuration(client_side=True))
                h.initiate_connection()
                h.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", wire.HOST),
                                   (":path", "/pb.FileService/PostFileStream"),
                                   ("content-type", "application/connect+proto"), ("conch-init-token", tok)])
                h.send_data(1, wire.envelope(b"\x0a\x05/tmp/"))  # a partial upload never ended
                s.sendall(h.data_to_send())
        except OSError as e:
            self.rec("half_broken", error=f"{type(e).__name__}: {e}")
        self.fault("half_request_" + kind, hold=hold, then=how)
        self.ctx.holder.add(time.monotonic() + hold, _Sock(s), how)

    # ------------------------------------------------------------ unary calls
    def op_unary(self):
        rng = self.rng
        what = rng.choice(["List", "Stat", "Remove", "ListFiles"])
        port, tok = self.ctx.port, self.ctx.token
        path = rng.choice(self.ctx.paths) if what in ("Stat", "Remove") else None
        for attempt in range(3):
            t_open = self.ctx.now()
            try:
                if what == "List":
                    st, body = wire.unary(port, tok, "/pb.ProcessService/List", {})
                elif what == "Stat":
                    st, body = wire.unary(port, tok, "/pb.FileService/Stat", {"path": path})
                elif what == "Remove":
                    self.rec("rm_begin", path=path)
                    st, body = wire.unary(port, tok, "/pb.FileService/Remove", {"path": path})
                else:
                    st, body = wire.unary(port, tok, "/pb.FileService/ListFiles", {"path": self.ctx.root, "depth": 3})
                code = None if st == 200 else (body.get("code") if isinstance(body, dict) else f"http {st}")
                self.rec("unary", what=what, status=st, code=code,
                         message=body.get("message") if isinstance(body, dict) and code else None)
                return
            except (OSError, http.client.HTTPException) as e:
                # a call cut by an upgrade is retried once the new program serves
                self.rec("unary_broken", what=what, t_open=t_open, error=f"{type(e).__name__}: {e}")
                if not self.after_upgrade(t_open):
                    return


# ------------------------------------------------------------------ the upgrader
def proc_start_time(pid):
    """The start time of pid (clock ticks since boot; /proc/<pid>/stat field
    22): the same process, not one made anew under the same pid."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        return int(st[st.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def http_get(port, token, path, timeout=10.0):
    """(status, parsed JSON or raw bytes) of a GET on a new connection."""
    c = http.client.HTTPConnection(wire.HOST, port, timeout=timeout)
    try:
        c.request("GET", path, headers={"conch-init-token": token})
        r = c.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw or b"null")
        except ValueError:
            return r.status, raw
    finally:
        c.close()


class Upgrader:
    """Upgrades the agent in place every `every` seconds to `binary` (the
    binary under test, by path and SHA-256), and records each upgrade in
    the history (client "u"): upgrade_begin, then `upgrade` with the times
    of the call, of its answer and of the moment the new program serves
    (/health answers 200 and /metrics counts this upgrade), the answer,
    /metrics, and the server's pid, start time and executable then.  The
    window [call, serving] goes to ctx.upgrades.  `lock` is held through
    an upgrade: an epoch's history is taken between two."""

    READY_WAIT_S = 30.0  # how long it waits for the new program (the bound is checks.py's)

    def __init__(self, ctx, binary, every):
        self.ctx, self.bin, self.every = ctx, binary, every
        with open(binary, "rb") as f:
            self.sha = hashlib.sha256(f.read()).hexdigest()
        self.lock = threading.Lock()
        self.n = 0
        self.answered = 0  # successful answers: what /metrics "upgrades" must say
        self.stop = threading.Event()
        self.thread = None
        self.start_time = proc_start_time(ctx.server_pid)

    def one(self):
        ctx, h = self.ctx, self.ctx.h
        with self.lock:
            n = self.n
            self.n += 1
            t_call = ctx.now()
            ctx.upgrades.begin(t_call)
            h.rec("u", "upgrade_begin", n=n)
            try:
                st, body = wire.unary(ctx.port, ctx.token, "/pb.AgentService/Upgrade",
                                      {"path": self.bin, "sha256": self.sha}, timeout=60)
            except (OSError, http.client.HTTPException) as e:
                st, body = None, f"{type(e).__name__}: {e}"
            t_answer = ctx.now()
            if st == 200:
                self.answered += 1
            t_ready = metrics = None
            tries = 0
            deadline = time.monotonic() + self.READY_WAIT_S
            while time.monotonic() < deadline:
                tries += 1
                try:
                    hs, _ = http_get(ctx.port, ctx.token, "/health")
                    if hs == 200:
                        ms, m = http_get(ctx.port, ctx.token, "/metrics")
                        if ms == 200 and isinstance(m, dict):
                            metrics = {"upgrades": m.get("upgrades"), "version": m.get("version")}
                            if st != 200 or m.get("upgrades") == self.answered:
                                t_ready = ctx.now()
                                break
                except (OSError, http.client.HTTPException):
                    pass
                time.sleep(0.02)
            t_end = ctx.now()
            ctx.upgrades.end(t_ready if t_ready is not None else t_end)
            pid = ctx.server_pid
            try:
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError as e:
                exe = f"{type(e).__name__}: {e}"
            h.rec("u", "upgrade", n=n, t_call=t_call, t_answer=t_answer, t_ready=t_ready, t_end=t_end,
                  status=st, answer=body, metrics=metrics, expect_upgrades=self.answered, polls=tries,
                  pid=pid, start_time=proc_start_time(pid), start_time_before=self.start_time, exe=exe)

    def _run(self, t_start, t_end):
        k = 1
        while True:
            at = t_start + k * self.every
            if at > t_end - 1:
                return
            if self.stop.wait(max(0.0, at - time.monotonic())):
                return
            self.one()
            k += 1

    def start(self, t_start, t_end):
        """Upgrade at t_start + k·every (time.monotonic()) until t_end."""
        self.thread = threading.Thread(target=self._run, args=(t_start, t_end), daemon=True, name="soak-upgrader")
        self.thread.start()

    def join(self):
        self.stop.set()
        if self.thread:
            self.thread.join(timeout=120)


def _child_alive(pid, parent):
    """Whether pid is a live (not zombie) child of parent (the server): a
    command running without a record of it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        rest = st[st.rindex(")") + 2:].split()
        return rest[0] != "Z" and int(rest[1]) == parent
    except (OSError, ValueError, IndexError):
        return False


class _Sock:
    """A bare socket with the cut methods of a Call."""

    def __init__(self, s):
        self.s = s

    def reset(self):
        wire.rst(self.s)

    def cancel(self):
        wire.rst(self.s)

    def close(self):
        try:
            self.s.close()
        except OSError:
            pass


