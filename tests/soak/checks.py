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


class Outcome:
    def __init__(self):
        self.violations = []  # (seq or None, subject dict, text)
        self.checked = 0      # records (or bytes, see `unit`) checked
        self.unit = "records"
        self.notes = {}

    def bad(self, ev, text, **subject):
        self.violations.append((ev["seq"] if ev else None, subject, text))


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
    written at; the end event carries the writer's exit code."""
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
        for e in evs:
            k = e["kind"]
            if k == "bg_conn":
                r = e["replay"] or {}
                if r and r != have:
                    o.bad(e, f"the reader asked a replay from {r} but had {have} (harness)", tag=tag)
                pos = {"stdout": r.get("stdout", 0), "stderr": r.get("stderr", 0)}
            elif k in ("bg_data", "bg_peek_data"):
                ch, off, n = e["ch"], e["off"], e["n"]
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
            elif k == "bg_end":
                ended = True
                if e["exit_code"] != code or not e["exited"]:
                    o.bad(e, f"end event exit code {e['exit_code']} exited={e['exited']} ({e['status']}), "
                             f"the writer exits {code}", tag=tag)
            elif k in ("bg_stream_end", "bg_peek_end") and e["code"] is not None:
                o.bad(e, f"stream ended with {e['code']}: {e['message']}", tag=tag)
            elif k == "bg_giveup":
                o.bad(e, f"reader gave up after {e['conns']} connections with {e['have']}", tag=tag)
        last = evs[-1]
        if last["kind"] not in ("bg_done", "bg_giveup") and not run.cut_short:
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
        elif e["kind"] == "down_error" and e["code"] != "not_found":
            o.bad(e, f"download of {e['path']} failed {e['code']}: {e['message']}", path=e["path"])
    for f in run.final.get("files", []):
        if f["exists"]:
            judge(None, f["path"], f["size"], f["head"], f["body_sha"], f["hlen"], "at the end,")
    return o


# ------------------------------------------------------------------ 3
def check_no_upload_temp_left(run):
    """No upload temp file remains once the server settled: no
    .conch-upload-* name under the upload tree, no unnamed O_TMPFILE the
    server still holds there (fs/upload.c)."""
    o = Outcome()
    o.checked = run.final.get("dirs_scanned", 0)
    o.unit = "directories"
    for t in run.final.get("temp_files", []):
        o.bad(None, f"upload temp file left: {t}", path=t)
    return o


# ------------------------------------------------------------------ 4
def check_command_output_exact(run):
    """A completed foreground command returns exactly its stdout and
    stderr, contiguous from offset 0, and its exit code."""
    o = Outcome()
    o.unit = "bytes"
    for fid, evs in _by(run.events, "fg").items():
        begin = evs[0]
        exp, code = model.fg_expected(begin["params"])
        pos = {"stdout": 0, "stderr": 0}
        end = None
        for e in evs:
            if e["kind"] == "fg_data":
                ch, off, n = e["ch"], e["off"], e["n"]
                want = exp[ch][off:off + n]
                if off != pos[ch]:
                    o.bad(e, f"{ch} offset {off}, {pos[ch]} bytes sent before it", fg=fid)
                if off + n > len(exp[ch]) or model.digest(want) != e["dig"]:
                    o.bad(e, f"{ch} bytes [{off}, {off + n}) differ from the command's output "
                             f"(got {e['head']!r}…, expected {want[:24]!r}…)", fg=fid)
                pos[ch] = off + n
                o.checked += n
            elif e["kind"] == "fg_end":
                end = e
                if e["exit_code"] != code or not e["exited"]:
                    o.bad(e, f"exit code {e['exit_code']} exited={e['exited']} ({e['status']} {e['error']}), "
                             f"expected {code}", fg=fid)
            elif e["kind"] == "fg_stream_end" and e["code"] is not None:
                o.bad(e, f"stream ended with {e['code']}: {e['message']}", fg=fid)
            elif e["kind"] == "fg_broken":
                o.bad(e, f"stream broke: {e['error']}", fg=fid)
        last = evs[-1]
        if last["kind"] == "fg_stream_end" and last["code"] is None:
            if end is None:
                o.bad(last, "no end event", fg=fid)
            for ch in pos:
                if pos[ch] != len(exp[ch]):
                    o.bad(last, f"{ch}: {pos[ch]} of {len(exp[ch])} bytes", fg=fid)
    return o


# ------------------------------------------------------------------ 5
def check_health_answered(run):
    """GET /health answers 200 within HEALTH_BOUND_S all along (a probe of
    its own, one new connection every 100 ms)."""
    o = Outcome()
    o.unit = "probes"
    if run.phase != "final":
        return o
    for p in run.probes:
        o.checked += 1
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
    server settled."""
    o = Outcome()
    o.unit = "commands"
    o.checked = sum(1 for e in run.events if e["kind"] == "cut_begin")
    for e in run.events:
        if e["kind"] == "timeout_end" and e["code"] != "deadline_exceeded":
            o.bad(e, f"a command past its deadline ended {e['code']}: {e['message']}", marker=e["marker"])
        elif e["kind"] == "timeout_end_event":
            o.bad(e, f"a foreground command past its deadline got an end event ({e['error']})",
                  marker=e["marker"])
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
    parse), and after the settle it still serves a download and a command."""
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
                   "unary_broken", "down_idle_broken"):
            o.bad(e, f"{k}: {e['error']}", **{x: e[x] for x in ("tag", "vid", "path", "marker") if x in e})
        elif k == "up_done" and (e["code"] is not None or e["count"] != 1):
            o.bad(e, f"upload {e['vid']} to {e['path']} answered {e['code']}: {e['message']} "
                     f"(uploadedCount {e['count']})", vid=e["vid"], path=e["path"])
        elif k == "unary" and e["code"] not in EXPECTED_UNARY[e["what"]]:
            o.bad(e, f"{e['what']} answered {e['code']}: {e['message']}")
        elif k == "cut_stream_end":
            o.bad(e, f"a command meant to run until cut ended: {e['code']} {e['message']}", marker=e["marker"])
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
]
