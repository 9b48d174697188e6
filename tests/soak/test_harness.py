"""The soak harness must fail on purpose: four deliberately broken agents,
each built from a copy of the tree with one patch of tests/soak/broken/
applied, each caught by the invariant it breaks — and only by that one
(the fourth breaks the upgrade in place: its run upgrades every 5 s).
A control run (the unpatched build, same seed and length) passes.  And the
upgrade windows excuse a cut only when an upgrade met its connection.

    make dev && /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/soak/test_harness.py

The copy takes build/dev along (timestamps kept), so `make dev` in it
recompiles only the patched file.  SOAK_HARNESS_SECONDS sets each run's
length (default 25); the seed is fixed.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SOAK = os.path.join(HERE, "soak.py")
DEV = os.path.join(ROOT, "build", "dev", "conch-init")
OUT = os.path.join(ROOT, "build", "soak", "harness")
SEED = 41
SECONDS = os.environ.get("SOAK_HARNESS_SECONDS", "25")
def _src_dirs():
    """The Makefile's SRC_DIRS: every source directory the build needs."""
    for line in open(os.path.join(ROOT, "Makefile")):
        if line.startswith("SRC_DIRS"):
            return line.split(":=", 1)[1].split()
    raise AssertionError("no SRC_DIRS in the Makefile")


SOURCES = ["Makefile"] + _src_dirs()

CASES = [
    # (patch, the invariant that must catch it, more soak arguments)
    ("a-replay-offset.patch", "output_exactly_once", []),
    ("b-early-rename.patch", "no_half_written_file", []),
    ("c-fd-leak.patch", "resources_return", []),
    # the new program gets no kept output: a reader resuming after an upgrade misses bytes
    ("d-upgrade-drops-kept-output.patch", "output_exactly_once", ["--upgrade-every", "5"]),
]


def build_variant(patch, where):
    """build/dev/conch-init of a copy of the tree with `patch` applied."""
    if os.path.exists(where):
        shutil.rmtree(where)
    os.makedirs(os.path.join(where, "build"))
    for s in SOURCES:
        subprocess.run(["cp", "-a", os.path.join(ROOT, s), where], check=True)
    for b in ("dev", ".deps-ok"):
        if os.path.exists(os.path.join(ROOT, "build", b)):
            subprocess.run(["cp", "-a", os.path.join(ROOT, "build", b), os.path.join(where, "build")], check=True)
    subprocess.run(["patch", "-p1", "-s", "-i", os.path.join(HERE, "broken", patch)], cwd=where, check=True)
    env = dict(os.environ, CONCH_NO_APT="1")
    p = subprocess.run(["nice", "-n", "10", "make", "-j2", "dev"], cwd=where, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, f"make dev with {patch}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return os.path.join(where, "build", "dev", "conch-init")


def soak(binary, name, extra=("--upgrade-every", "0")):
    outdir = os.path.join(OUT, name)
    os.makedirs(outdir, exist_ok=True)
    report = os.path.join(outdir, "report.json")
    if os.path.exists(report):
        os.remove(report)
    p = subprocess.run([sys.executable, SOAK, "--seed", str(SEED), "--seconds", SECONDS, "--bin", binary,
                        "--outdir", outdir, "--report", report, "--settle-seconds", "25", *extra],
                       capture_output=True, text=True, timeout=900)
    assert os.path.exists(report), f"no report (exit {p.returncode}):\n{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
    with open(report) as f:
        return p.returncode, json.load(f), p.stdout + p.stderr


@pytest.fixture(scope="module")
def dev_binary():
    if not os.access(DEV, os.X_OK):
        pytest.fail("build/dev/conch-init is missing: make dev first")
    return DEV


def test_control_passes(dev_binary):
    rc, rep, out = soak(dev_binary, "control")
    failed = [i["name"] for i in rep["invariants"] if not i["ok"]]
    assert rc == 0 and not failed, f"the unpatched build failed {failed}:\n{out[-6000:]}"
    # the run did what the invariants need to mean something
    c = rep["counts"]
    assert c["faults"].get("upload_cut_rst", 0) + c["faults"].get("upload_cut_fin", 0) > 0
    assert c["background_writers"] > 0 and c["bytes_checked"]["background_output"] > 0
    assert sum(v for k, v in c["faults"].items() if k.startswith("download_cut")) > 0


@pytest.mark.parametrize("patch,invariant,extra", CASES, ids=[c[0].split("-")[0] for c in CASES])
def test_broken_variant_is_caught(dev_binary, patch, invariant, extra, tmp_path):
    binary = build_variant(patch, str(tmp_path / "tree"))
    rc, rep, out = soak(binary, patch.split(".")[0], extra or ("--upgrade-every", "0"))
    failed = [i["name"] for i in rep["invariants"] if not i["ok"]]
    assert rc == 1, f"{patch}: the soak passed (exit {rc}):\n{out[-6000:]}"
    assert failed == [invariant], f"{patch}: caught by {failed}, expected [{invariant}]:\n{out[-6000:]}"
    # what a failure prints: the seed and the first broken invariant, with history
    assert f"FAILED, seed {SEED}: invariant" in out and invariant in out, out[-4000:]


def test_upgrade_windows_excuse_only_their_cuts():
    """checks.py: a break is excused when an upgrade window (the Upgrade
    call to the new program serving, ± UPGRADE_MARGIN_S) met the broken
    connection — opened before the window's end, seen broken after its
    begin — and only then; an adopted cut command likewise."""
    sys.path.insert(0, HERE)
    import checks

    class R:
        phase, final, cut_short, server, lossy = "history", {}, False, {}, False
        upgrades = [{"kind": "upgrade", "t_call": 10.0, "t_answer": 10.3, "t_ready": 10.6, "t_end": 10.6}]

    def broken(seq, t_open, t, kind="down_broken"):
        return {"seq": seq, "t": t, "client": 0, "kind": kind, "t_open": t_open, "path": "/x", "error": "cut"}

    run = R()
    run.events = [broken(0, 9.0, 10.4),     # open across the window: excused
                  broken(1, 9.0, 12.5),     # a stalled reader noticing late: excused
                  broken(2, 1.0, 5.0),      # long before: a failure
                  broken(3, 11.5, 12.0),    # opened after the new program served: a failure
                  broken(4, 9.0, 9.2)]      # broke before the Upgrade call (beyond the margin): a failure
    o = checks.check_server_sound(run)
    assert sorted(v[0] for v in o.violations) == [2, 3, 4], o.violations
    assert o.notes["cut_by_upgrade"] == 2
    # no upgrade at all: every break is a failure
    run.upgrades = []
    assert len(checks.check_server_sound(run).violations) == 5
    # a cut command found running after its cut: excused only inside a window
    run.upgrades = R.upgrades
    ev = [{"seq": 0, "t": 9.5, "client": 0, "kind": "cut_begin", "marker": "m1"},
          {"seq": 1, "t": 10.1, "client": 0, "kind": "fault", "what": "command_cut_rst", "marker": "m1"},
          {"seq": 2, "t": 11.0, "client": 0, "kind": "cut_adopted", "marker": "m1", "pid": 7, "kill_status": 200},
          {"seq": 3, "t": 3.0, "client": 1, "kind": "cut_begin", "marker": "m2"},
          {"seq": 4, "t": 4.0, "client": 1, "kind": "fault", "what": "command_cut_fin", "marker": "m2"},
          {"seq": 5, "t": 11.0, "client": 1, "kind": "cut_adopted", "marker": "m2", "pid": 8, "kill_status": 200}]
    run.events = ev
    o = checks.check_cut_commands_killed(run)
    assert [v[0] for v in o.violations] == [5], o.violations


def test_writer_cut_before_its_start_is_judged_by_the_upgrade():
    """checks.py, invariant 1: a writer whose StartProcess an upgrade cut
    before its start event, and which a replay then does not find, is
    excused (the request was never read) — its not_found end is not a
    failure on its own. The same not_found with no upgrade, or after a
    start event, is a failure."""
    sys.path.insert(0, HERE)
    import checks
    import model

    class R:
        phase, final, cut_short, server, lossy = "history", {}, False, {}, False
        upgrades = [{"kind": "upgrade", "t_call": 10.0, "t_answer": 10.3, "t_ready": 10.6, "t_end": 10.6}]

    params = {"tag": "w", "lines": 10, "pad": "", "batch": 5, "pause": 0.025, "err_every": 50, "code": 3}
    exp = model.bg_expected(params)

    def history(started):
        ev = [{"kind": "bg_begin", "t": 9.9, "params": params, "total": {k: len(v) for k, v in exp.items()}},
              {"kind": "bg_conn", "t": 9.9, "conn": 0, "how": "start", "replay": None},
              {"kind": "bg_broken", "t": 10.4, "conn": 0, "t_open": 9.9, "error": "reset"}]
        if started:
            ev.append({"kind": "bg_start", "t": 10.0, "conn": 0, "pid": 5})
        ev += [{"kind": "bg_conn", "t": 10.7, "conn": 1, "how": "replay", "replay": {"stdout": 0, "stderr": 0}},
               {"kind": "bg_stream_end", "t": 10.7, "conn": 1, "code": "not_found", "message": "not found"},
               {"kind": "bg_unstarted", "t": 10.7, "conns": 2}]
        for i, e in enumerate(ev):
            e.update(seq=i, client=0, tag="w")
        return ev

    run = R()
    run.events = history(started=False)
    o = checks.check_output_exactly_once(run)
    assert o.violations == [] and o.notes["unstarted_in_upgrade"] == 1, o.violations
    run.events = history(started=True)
    o = checks.check_output_exactly_once(run)
    assert [v[2] for v in o.violations] == ["the writer started (its start event came) but Connect does not find it"], \
        o.violations
    run.upgrades = []
    run.events = history(started=False)
    o = checks.check_output_exactly_once(run)
    assert [v[2] for v in o.violations] == ["the writer is not found, and no upgrade cut its StartProcess"], \
        o.violations
