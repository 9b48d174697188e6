"""The invariants, each a function of the recorded history (what the
clients saw) and the final observations of the server (taken after the
settle period).  Each returns an Outcome: how much it checked and its
violations, each violation naming the history record it is about (seq)
and the subject (tag, fg, vid, path, marker) whose records are printed
around it.

A check is called once per epoch with run.phase "history" (run.events:
that epoch's records, every operation in them finished; run.final empty)
and once at the end with run.phase "final" (run.events empty; run.final,
run.probes, run.server filled): each looks at what its phase gives it.
run.versions carries every upload seen so far across epochs.

To add an invariant: write check_<name>(run) -> Outcome and add it to
INVARIANTS (the order is the order failures are reported in).
"""
import collections

import model

# Connect codes a call may end with under chaos without anything being wrong
# (none, today: every valid call must succeed or fail as documented).
HEALTH_BOUND_S = 2.0
# With upgrades: the new program serves (/health answers, /metrics counts
# the upgrade) within this of the Upgrade answer; a /health probe that met
# an upgrade window may take this long (it waited in the backlog) or be cut.
UPGRADE_HEALTH_BOUND_S = 5.0
# An upgrade window is [the Upgrade call, the new program serving]; a
# connection met it when it was opened before the window's end and its
# break was noticed after the window's begin, each with this margin.
UPGRADE_MARGIN_S = 0.5
KEPT_BYTES = 256 * 1024  # what the agent keeps of a background channel for replay


class Outcome:
    def __init__(self):
        self.violations = []  # (seq or None, subject dict, text)
        self.checked = 0      # records (or bytes, see `unit`) checked
        self.unit = "records"
        self.notes = {}

    def bad(self, ev, text, **subject):
        self.violations.append((ev["seq"] if ev else None, subject, text))


def collect_upgrades(events, upgrades):
    """Add the upgrades of these records to upgrades (a list of the
    `upgrade` records, in order): their windows are what upgrade_window
    looks at."""
    upgrades.extend(e for e in events if e["kind"] == "upgrade")


def upgrade_window(run, t_open, t_noticed):
    """The upgrade whose window a connection opened at t_open and seen
    broken at t_noticed (History time) met, or None: a break is excused
    only by an upgrade under way while that connection was open."""
    if t_open is None:
        return None
    for u in run.upgrades:
        begin = u["t_call"]
        end = u["t_ready"] if u["t_ready"] is not None else u["t_end"]
        if begin - UPGRADE_MARGIN_S <= t_noticed and end + UPGRADE_MARGIN_S >= t_open:
            return u
    return None


def ended_by_upgrade(run, e):
    """A stream an upgrade's drain ended so that its client resumes
    (`unavailable` "agent is upgrading; resume"), during an upgrade."""
    return (e.get("code") == "unavailable" and e.get("message") == "agent is upgrading; resume"
            and upgrade_window(run, e["t"], e["t"]) is not None)


def _by(events, key):
    out = {}
    for ev in events:
        if key in ev:
            out.setdefault(ev[key], []).append(ev)
    return out


# ------------------------------------------------------------------ 1
def check_output_exactly_once(run):
    """Every byte of every background writer's output reaches its
    reconnecting reader exactly once, in order, at the offset it was
    written at; the end event carries the writer's exit code; a replay
    (a reconnect, a second reader, after an upgrade too) starts at the
    offset asked (the agent keeps all of a writer's output: ≤ 180 KiB)."""
    o = Outcome()
    o.unit = "bytes"
    for tag, evs in _by(run.events, "tag").items():
        begin = next((e for e in evs if e["kind"] == "bg_begin"), None)
        if begin is None:
            continue
        exp = model.bg_expected(begin["params"])
        code = begin["params"]["code"]
        pos = {"stdout": 0, "stderr": 0}       # this connection's position
        have = {"stdout": 0, "stderr": 0}      # contiguous bytes from 0
        peek = None
        ended = False
        first = {}  # the replay's offsets, per channel, until its first data event
        pfirst = {}  # the same for the second reader
        for i, e in enumerate(evs):
            k = e["kind"]
            if k == "bg_conn":
                r = e["replay"] or {}
                if r and r != have:
                    o.bad(e, f"the reader asked a replay from {r} but had {have} (harness)", tag=tag)
                pos = {"stdout": r.get("stdout", 0), "stderr": r.get("stderr", 0)}
                first = dict(r)
            elif k in ("bg_data", "bg_peek_data"):
                ch, off, n = e["ch"], e["off"], e["n"]
                f = pfirst if k == "bg_peek_data" else first
                if ch in f:
                    if off > f[ch] and not run.lossy:
                        # not a drop (2 MiB unsent are far): bytes the agent should have kept
                        o.bad(e, f"{ch}: a replay from offset {f[ch]} began at {off}: bytes [{f[ch]}, {off}) "
                                 f"were not kept", tag=tag)
                    del f[ch]
                want = exp[ch][off:off + n]
                if off + n > len(exp[ch]) or model.digest(want) != e["dig"]:
                    o.bad(e, f"{ch} bytes [{off}, {off + n}) are not what the writer wrote there "
                             f"(got {e['head']!r}…, expected {want[:24]!r}…)", tag=tag)
                o.checked += n
                p = peek if k == "bg_peek_data" else pos
                if off < p[ch]:
                    o.bad(e, f"{ch} offset {off} repeats bytes already sent on this stream (position {p[ch]})",
                          tag=tag)
                p[ch] = max(p[ch], off + n)
                if k == "bg_data" and off <= have[ch] < off + n:
                    have[ch] = off + n
            elif k == "bg_peek":
                peek = dict(e["replay"])
                pfirst = dict(e["replay"])
            elif k == "bg_end":
                ended = True
                if e["exit_code"] != code or not e["exited"]:
                    o.bad(e, f"end event exit code {e['exit_code']} exited={e['exited']} ({e['status']}), "
                             f"the writer exits {code}", tag=tag)
            elif k in ("bg_stream_end", "bg_peek_end") and e["code"] is not None:
                if ended_by_upgrade(run, e):  # the reader resumes with replay
                    _note(o, "resumed_after_upgrade")
                    continue
                if (e["code"] == "not_found" and i + 1 < len(evs) and evs[i + 1]["kind"] == "bg_unstarted"):
                    continue  # the reader's verdict: bg_unstarted, judged below
                o.bad(e, f"stream ended with {e['code']}: {e['message']}", tag=tag)
            elif k == "bg_giveup":
                o.bad(e, f"reader gave up after {e['conns']} connections with {e['have']}", tag=tag)
            elif k == "bg_unstarted":
                # its StartProcess cut by an upgrade before any answer, and no
                # record of that tag afterwards: the request was never read (or
                # its start was still under way when the drain ended)
                first = next((x for x in evs if x["kind"] == "bg_broken" and x["conn"] == 0), None)
                if any(x["kind"] in ("bg_start", "bg_data", "bg_end") for x in evs):
                    o.bad(e, "the writer started (its start event came) but Connect does not find it", tag=tag)
                elif first is None or not upgrade_window(run, first.get("t_open"), first["t"]):
                    o.bad(e, "the writer is not found, and no upgrade cut its StartProcess", tag=tag)
                else:
                    o.notes["unstarted_in_upgrade"] = o.notes.get("unstarted_in_upgrade", 0) + 1
        last = evs[-1]
        if last["kind"] not in ("bg_done", "bg_giveup", "bg_unstarted") and not run.cut_short:
            o.bad(last, "reader never finished", tag=tag)
        for ch in ("stdout", "stderr"):
            if have[ch] != len(exp[ch]) and last["kind"] == "bg_done":
                o.bad(last, f"{ch}: {have[ch]} of {len(exp[ch])} bytes delivered when the stream ended "
                            f"(end event, no jump in offset: the tail was lost unseen)", tag=tag)
        if not ended and last["kind"] == "bg_done":
            o.bad(last, "no end event", tag=tag)
        o.notes.setdefault("writers", 0)
        o.notes["writers"] += 1
        o.notes.setdefault("gaps", 0)
        o.notes["gaps"] += sum(1 for e in evs if e["kind"] == "bg_gap")
    return o


# ------------------------------------------------------------------ 2
def collect_versions(events, versions):
    """Add the uploads of these records to versions (vid → path, whether it
    was sent whole, whether its upload failed)."""
    for e in events:
        if e["kind"] == "up_begin":
            versions[e["vid"]] = {"path": e["path"], "size": e["size"], "whole": False, "failed": None}
        elif e["kind"] == "up_sent":
            versions[e["vid"]]["whole"] = True
        elif e["kind"] == "up_done" and e["code"] is not None:
            versions[e["vid"]]["failed"] = e["code"]


def check_no_half_written_file(run):
    """A download is not_found or exactly a version some client sent whole
    to that path (header, length and SHA-256 of the body agree); the files
    left at the end are such versions too."""
    o = Outcome()
    o.unit = "bytes"
    versions = run.versions

    def judge(ev, path, size, head, body_sha, hlen, where):
        v = model.parse_version(head)
        if v is None:
            o.bad(ev, f"{where} {path}: {size} bytes without a whole version's header "
                      f"({bytes(head[:60])!r})", path=path)
            return
        vid, _pi, blen, sha, hl = v
        known = versions.get(vid)
        if known is None:
            o.bad(ev, f"{where} {path}: version {vid} that no client uploaded", path=path, vid=vid)
        elif not known["whole"]:
            o.bad(ev, f"{where} {path}: version {vid}, whose upload was cut, is visible", path=path, vid=vid)
        elif known["path"] != path:
            o.bad(ev, f"{where} {path}: version {vid} was uploaded to {known['path']}", path=path, vid=vid)
        elif known["failed"]:
            o.bad(ev, f"{where} {path}: version {vid}, whose upload failed ({known['failed']}), is visible",
                  path=path, vid=vid)
        if size != hl + blen or body_sha != sha:
            o.bad(ev, f"{where} {path}: version {vid} half-written: {size} bytes, the whole is {hl + blen}"
                      f"{'' if body_sha == sha else ', body hash differs'}", path=path, vid=vid)

    for e in run.events:
        if e["kind"] == "down_done":
            o.checked += e["size"]
            judge(e, e["path"], e["size"], e["head"], e["body_sha"], e["hlen"], "download of")
        elif e["kind"] == "down_error" and e["code"] != "not_found" and not ended_by_upgrade(run, e):
            o.bad(e, f"download of {e['path']} failed {e['code']}: {e['message']}", path=e["path"])
    for f in run.final.get("files", []):
        if f["exists"]:
            judge(None, f["path"], f["size"], f["head"], f["body_sha"], f["hlen"], "at the end,")
    return o


# ------------------------------------------------------------------ 3
def check_no_upload_temp_left(run):
    """No upload temp file remains once the server settled: no
    .conch-upload-* name under the upload tree, no unnamed O_TMPFILE the
    server still holds there (fs/atomic.c)."""
    o = Outcome()
    o.checked = run.final.get("dirs_scanned", 0)
    o.unit = "directories"
    for t in run.final.get("temp_files", []):
        o.bad(None, f"upload temp file left: {t}", path=t)
    return o


# ------------------------------------------------------------------ 4
def _note(o, key, n=1):
    o.notes[key] = o.notes.get(key, 0) + n


def check_command_output_exact(run):
    """A completed foreground command returns exactly its stdout and
    stderr, contiguous from offset 0, and its exit code; one whose stream
    an upgrade cut was adopted: found by pid, its output from then on
    exact and complete, its exit code."""
    o = Outcome()
    o.unit = "bytes"
    for fid, evs in _by(run.events, "fg").items():
        begin = evs[0]
        exp, code = model.fg_expected(begin["params"])
        pos = {"stdout": 0, "stderr": 0}
        end = None
        cut = None     # the fg_broken an upgrade excuses
        pid = None
        apos = {}      # the adopted streams' positions, per channel
        aconn = -1
        aend = None
        adone = None   # how following the adopted command ended
        for e in evs:
            k = e["kind"]
            if k == "fg_data":
                ch, off, n = e["ch"], e["off"], e["n"]
                want = exp[ch][off:off + n]
                if off != pos[ch]:
                    o.bad(e, f"{ch} offset {off}, {pos[ch]} bytes sent before it", fg=fid)
                if off + n > len(exp[ch]) or model.digest(want) != e["dig"]:
                    o.bad(e, f"{ch} bytes [{off}, {off + n}) differ from the command's output "
                             f"(got {e['head']!r}…, expected {want[:24]!r}…)", fg=fid)
                pos[ch] = off + n
                o.checked += n
            elif k == "fg_start":
                pid = e["pid"]
            elif k == "fg_end":
                end = e
                if e["exit_code"] != code or not e["exited"]:
                    o.bad(e, f"exit code {e['exit_code']} exited={e['exited']} ({e['status']} {e['error']}), "
                             f"expected {code}", fg=fid)
            elif k == "fg_stream_end" and e["code"] is not None:
                o.bad(e, f"stream ended with {e['code']}: {e['message']}", fg=fid)
            elif k == "fg_broken":
                if upgrade_window(run, e.get("t_open"), e["t"]):
                    cut = e
                    _note(o, "cut_by_upgrade")
                else:
                    o.bad(e, f"stream broke: {e['error']}", fg=fid)
            # ---- the adopted command (followed after an upgrade's cut)
            elif k == "fg_adopt_none":
                # cut before its start event and no record names it: its
                # request was never read, or its start was under way when the
                # drain ended (not carried: docs/guide/upgrade.md, Limits)
                adone = "none"
                _note(o, "adopted_not_found")
            elif k == "fg_adopt_conn":
                aconn += 1
                if pid is not None and e["pid"] != pid:
                    o.bad(e, f"followed pid {e['pid']}, the command's is {pid}", fg=fid)
            elif k == "fg_adopt_start":
                if pid is not None and e["pid"] != pid:
                    o.bad(e, f"Connect by pid {pid} answered the start of pid {e['pid']}", fg=fid)
            elif k == "fg_adopt_data":
                ch, off, n = e["ch"], e["off"], e["n"]
                want = exp[ch][off:off + n]
                if off + n > len(exp[ch]) or model.digest(want) != e["dig"]:
                    o.bad(e, f"adopted: {ch} bytes [{off}, {off + n}) differ from the command's output "
                             f"(got {e['head']!r}…, expected {want[:24]!r}…)", fg=fid)
                o.checked += n
                if ch in apos and off != apos[ch][0]:
                    # a jump only where the kept 256 KiB no longer reach back:
                    # at a reconnect, for a channel longer than that
                    first_of_conn = apos[ch][1] != aconn
                    if not (first_of_conn and off > apos[ch][0] and len(exp[ch]) > KEPT_BYTES):
                        o.bad(e, f"adopted: {ch} offset {off} after {apos[ch][0]} (a byte lost or repeated "
                                 f"after the upgrade)", fg=fid)
                apos[ch] = (off + n, aconn)
            elif k == "fg_adopt_end":
                aend = e
                if e["exit_code"] != code or not e["exited"]:
                    o.bad(e, f"adopted: exit code {e['exit_code']} exited={e['exited']} "
                             f"({e['status']} {e['error']}), expected {code}", fg=fid)
            elif k == "fg_adopt_stream_end":
                adone = e
                if e["code"] == "not_found":
                    # its record was gone: the command ended (and was reaped)
                    # before the upgrade, its end queued on the cut connection
                    if e.get("alive"):
                        o.bad(e, f"adopted: pid {e['pid']} runs, but Connect does not find it", fg=fid)
                    _note(o, "ended_before_upgrade")
                elif e["code"] is not None and not ended_by_upgrade(run, e):
                    o.bad(e, f"adopted: Connect by pid ended {e['code']}: {e['message']}", fg=fid)
            elif k == "fg_adopt_broken":
                if not upgrade_window(run, e.get("t_open"), e["t"]):
                    o.bad(e, f"adopted: stream broke: {e['error']}", fg=fid)
        last = evs[-1]
        if last["kind"] == "fg_stream_end" and last["code"] is None or (cut and end):
            # completed (or cut after its end event: every byte came before it)
            if end is None:
                o.bad(last, "no end event", fg=fid)
            for ch in pos:
                if pos[ch] != len(exp[ch]):
                    o.bad(last, f"{ch}: {pos[ch]} of {len(exp[ch])} bytes", fg=fid)
        elif cut:
            _note(o, "adopted")
            if adone is None:
                o.bad(last, "cut by an upgrade, the adopted command was not followed to its end (harness)", fg=fid)
            elif isinstance(adone, dict) and adone["code"] is None:
                if aend is None:
                    o.bad(adone, "adopted: no end event", fg=fid)
                for ch, (p, _c) in apos.items():
                    if p != len(exp[ch]):
                        o.bad(adone, f"adopted: {ch}: the output after the upgrade stops at {p} of "
                                     f"{len(exp[ch])} bytes", fg=fid)
    return o


# ------------------------------------------------------------------ 5
def check_health_answered(run):
    """GET /health answers 200 within HEALTH_BOUND_S all along (probes of
    its own every 100 ms: one on a new connection, one on a keep-alive
    connection); none is ever reset or refused, upgrades included; one
    that met an upgrade window may wait up to UPGRADE_HEALTH_BOUND_S."""
    o = Outcome()
    o.unit = "probes"
    if run.phase != "final":
        return o
    for p in run.probes:
        o.checked += 1
        if p["ok"] and p["latency"] > HEALTH_BOUND_S and "m" in p \
                and upgrade_window(run, p["m"], p["m"] + p["latency"]):
            # it met an upgrade: waited in the backlog (never reset or
            # refused: an upgrade cuts no request, new connection or kept)
            _note(o, "in_upgrade")
            if p["latency"] > UPGRADE_HEALTH_BOUND_S:
                o.bad(None, f"/health took {p['latency'] * 1000:.0f} ms at t={p['t']:.1f} s, during an upgrade "
                            f"(bound {UPGRADE_HEALTH_BOUND_S:g} s)", probe=p["t"])
            continue
        if not p["ok"]:
            o.bad(None, f"/health failed at t={p['t']:.1f} s: {p.get('error', '')}", probe=p["t"])
        elif p["latency"] > HEALTH_BOUND_S:
            o.bad(None, f"/health took {p['latency'] * 1000:.0f} ms at t={p['t']:.1f} s", probe=p["t"])
    if not run.probes:
        o.bad(None, "no /health probe ran")
    return o


# ------------------------------------------------------------------ 6
def check_resources_return(run):
    """Descriptors, threads and RSS of the server come back to what they
    were after the warm-up (within run.tolerance) once it settled."""
    o = Outcome()
    o.unit = "measures"
    if run.phase != "final":
        return o
    base, end, tol = run.base, run.final.get("res"), run.tolerance
    if not base or not end:
        o.bad(None, "no measurement (server gone?)")
        return o
    o.checked = 3
    if end["fds"] > base["fds"] + tol["fds"]:
        extra = sorted((collections.Counter(end["fd_links"]) - collections.Counter(base["fd_links"])).elements())
        o.bad(None, f"descriptors {base['fds']} -> {end['fds']} (tolerance {tol['fds']}); new: "
                    f"{extra[:12]}{' …' if len(extra) > 12 else ''}"
                    + "".join(f"\n    held cgroup {c['path']}: procs {c['procs']} events {c['cgroup.events']}"
                              for c in run.final.get("cgroups", [])))
    if end["threads"] > base["threads"] + tol["threads"]:
        o.bad(None, f"threads {base['threads']} -> {end['threads']} (tolerance {tol['threads']})")
    if end["rss_kib"] > base["rss_kib"] + tol["rss_kib"]:
        o.bad(None, f"RSS {base['rss_kib']} -> {end['rss_kib']} KiB (tolerance {tol['rss_kib']} KiB)")
    return o


# ------------------------------------------------------------------ 7
def check_no_zombie(run):
    """No child of the server is a zombie once it settled."""
    o = Outcome()
    o.unit = "children"
    kids = run.final.get("children", [])
    o.checked = len(kids)
    for k in kids:
        if k["state"] == "Z":
            o.bad(None, f"zombie child pid {k['pid']} ({k['comm']})")
    return o


# ------------------------------------------------------------------ 8
def check_cut_commands_killed(run):
    """A foreground command whose client went away is killed, one whose
    Connect-Timeout-Ms passed ends deadline_exceeded with its whole tree
    (setsid escapees too) killed, and no command is left running once the
    server settled; one an upgrade adopted instead (its stream cut by the
    exec, or its cut just before the drain) only when an upgrade window
    met its stream."""
    o = Outcome()
    o.unit = "commands"
    o.checked = sum(1 for e in run.events if e["kind"] == "cut_begin")
    for e in run.events:
        if e["kind"] == "timeout_end" and e["code"] != "deadline_exceeded":
            o.bad(e, f"a command past its deadline ended {e['code']}: {e['message']}", marker=e["marker"])
        elif e["kind"] == "timeout_end_event":
            o.bad(e, f"a foreground command past its deadline got an end event ({e['error']})",
                  marker=e["marker"])
    begins = {e["marker"]: e for e in run.events if e["kind"] == "cut_begin"}
    cuts = {}
    for e in run.events:
        if e["kind"] == "cut_broken" or (e["kind"] == "fault" and e["what"].startswith("command_cut_")):
            cuts.setdefault(e["marker"], e)
    for e in run.events:
        if e["kind"] == "cut_adopted":
            # still running after its client went away: excused only when an
            # upgrade met its stream before the cut (the exec closed it, or the
            # cut came as the drain began): then its client killed it
            b, c = begins.get(e["marker"]), cuts.get(e["marker"])
            if b is None or c is None or not upgrade_window(run, b["t"], c["t"]):
                o.bad(e, f"a cut command (pid {e['pid']}) still ran after its client went away, no upgrade "
                         f"around it", marker=e["marker"])
            elif e["kill_status"] != 200:
                o.bad(e, f"the adopted cut command pid {e['pid']} could not be killed: {e['kill_answer']}",
                      marker=e["marker"])
            else:
                _note(o, "adopted_then_killed")
        elif e["kind"] == "cut_adopted_list":
            o.bad(e, f"List failed after an upgrade: {e['error']}", marker=e["marker"])
    for pid, cmd in run.final.get("marked", []):
        o.bad(None, f"cut command still running: pid {pid} {cmd}", marker=cmd)
    for k in run.final.get("children", []):
        if k["state"] != "Z":
            o.bad(None, f"child still running at the end: pid {k['pid']} {k['cmdline']}")
    return o


# ------------------------------------------------------------------ 9
EXPECTED_UNARY = {"Stat": {None, "not_found"}, "Remove": {None, "not_found"}, "List": {None},
                  "ListFiles": {None}}


def check_server_sound(run):
    """The server stays up, exits cleanly on SIGTERM, its log has no
    sanitizer report, every call that no fault touched is answered (no
    broken stream, no unexpected error, nothing the client could not
    parse; a stream or call is cut only when an upgrade window met its
    connection), and after the settle it still serves a download and a
    command."""
    o = Outcome()
    for text in run.final.get("serving", []):
        o.bad(None, text)
    s = run.server
    if s.get("died"):
        o.bad(None, f"the server died during the run: {s['died']}")
    if s.get("exit") not in (0, None):
        o.bad(None, f"the server exited {s['exit']} on SIGTERM")
    if s.get("sanitizer"):
        o.bad(None, "sanitizer report in the server log:\n" + s["sanitizer"])
    for e in run.events:
        k = e["kind"]
        o.checked += 1
        if k == "op_exception":
            o.bad(e, f"{e['op']}: {e['error']}\n{e['trace']}")
        elif k in ("up_broken", "down_broken", "bg_broken", "bg_peek_broken", "cut_broken",
                   "unary_broken", "down_idle_broken", "call_broken"):
            if k != "up_broken" and upgrade_window(run, e.get("t_open"), e["t"]):  # (an upload is never cut)
                _note(o, "cut_by_upgrade")
                _note(o, "cut_by_upgrade_" + k)
            else:
                o.bad(e, f"{k}: {e['error']}", **{x: e[x] for x in ("tag", "vid", "path", "marker") if x in e})
        elif k == "up_done" and (e["code"] is not None or e["count"] != 1):
            o.bad(e, f"upload {e['vid']} to {e['path']} answered {e['code']}: {e['message']} "
                     f"(uploadedCount {e['count']})", vid=e["vid"], path=e["path"])
        elif k == "unary" and e["code"] not in EXPECTED_UNARY[e["what"]]:
            o.bad(e, f"{e['what']} answered {e['code']}: {e['message']}")
        elif k == "cut_stream_end":
            o.bad(e, f"a command meant to run until cut ended: {e['code']} {e['message']}", marker=e["marker"])
    return o


# ------------------------------------------------------------------ 10
def check_upgrade_in_place(run):
    """Each Upgrade is answered {fromVersion, toVersion} with the version
    under test, the agent stays the same process (pid, start time), the
    new program serves (/health 200, /metrics counting the upgrade and
    naming the version) within UPGRADE_HEALTH_BOUND_S of the answer; at
    the end /metrics "upgrades" and the log's "upgraded in place" equal the
    successful answers, with no rollback or abandoned upgrade."""
    o = Outcome()
    o.unit = "upgrades"
    up = run.upgrade
    if not up.get("every") and not run.upgrades:
        return o
    ver = up.get("version")
    if run.phase == "history":
        for e in run.events:
            if e["kind"] != "upgrade":
                continue
            o.checked += 1
            a = e["answer"]
            if e["status"] != 200 or not isinstance(a, dict):
                o.bad(e, f"upgrade {e['n']} answered {e['status']}: {a}")
                continue
            if a.get("fromVersion") != ver or a.get("toVersion") != ver:
                o.bad(e, f"upgrade {e['n']} answered {a}, the binary is {ver}")
            if e["start_time"] is None or e["start_time"] != e["start_time_before"]:
                o.bad(e, f"upgrade {e['n']}: the agent (pid {e['pid']}) is not the same process "
                         f"(start time {e['start_time_before']} -> {e['start_time']})")
            if e["t_ready"] is None:
                o.bad(e, f"upgrade {e['n']}: the new program did not serve within {e['t_end'] - e['t_answer']:.1f} s "
                         f"(last /metrics {e['metrics']}, want upgrades {e['expect_upgrades']})")
            else:
                took = e["t_ready"] - e["t_answer"]
                o.notes["worst_ready_ms"] = max(o.notes.get("worst_ready_ms", 0), round(took * 1000))
                if took > UPGRADE_HEALTH_BOUND_S:
                    o.bad(e, f"upgrade {e['n']}: /health answered {took:.2f} s after the answer "
                             f"(bound {UPGRADE_HEALTH_BOUND_S:g} s)")
                m = e["metrics"] or {}
                if m.get("upgrades") != e["expect_upgrades"] or m.get("version") != ver:
                    o.bad(e, f"upgrade {e['n']}: /metrics says {m}, want upgrades {e['expect_upgrades']} "
                             f"version {ver}")
        return o
    answered = sum(1 for u in run.upgrades if u["status"] == 200)
    o.notes["answered"] = answered
    m = run.final.get("metrics")
    if run.final:
        if not isinstance(m, dict) or m.get("upgrades") != answered or m.get("version") != ver:
            o.bad(None, f"at the end /metrics says {m}; {answered} upgrades were answered, version {ver}")
        log = run.final.get("upgrade_log", {})
        if log.get("upgraded in place") != answered:
            o.bad(None, f"the log says \"upgraded in place\" {log.get('upgraded in place')} times, "
                        f"{answered} upgrades were answered")
        for what in ("upgrade rolled back", "upgrade abandoned"):
            if log.get(what):
                o.bad(None, f"the log says \"{what}\" {log[what]} times")
    if up.get("every") and answered < 2:
        o.bad(None, f"{answered} upgrades done (the warm-up's and the run's): the run was too short for "
                    f"--upgrade-every {up['every']:g}")
    return o


INVARIANTS = [
    ("1", "output_exactly_once", check_output_exactly_once),
    ("2", "no_half_written_file", check_no_half_written_file),
    ("3", "no_upload_temp_left", check_no_upload_temp_left),
    ("4", "command_output_exact", check_command_output_exact),
    ("5", "health_answered", check_health_answered),
    ("6", "resources_return", check_resources_return),
    ("7", "no_zombie", check_no_zombie),
    ("8", "cut_commands_killed", check_cut_commands_killed),
    ("9", "server_sound", check_server_sound),
    ("10", "upgrade_in_place", check_upgrade_in_place),
]
