"""The soak harness must fail on purpose: three deliberately broken agents,
each built from a copy of the tree with one patch of tests/soak/broken/
applied, each caught by the invariant it breaks — and only by that one.
A control run (the unpatched build, same seed and length) passes.

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
    # (patch, the invariant that must catch it)
    ("a-replay-offset.patch", "output_exactly_once"),
    ("b-early-rename.patch", "no_half_written_file"),
    ("c-fd-leak.patch", "resources_return"),
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


def soak(binary, name):
    outdir = os.path.join(OUT, name)
    os.makedirs(outdir, exist_ok=True)
    report = os.path.join(outdir, "report.json")
    if os.path.exists(report):
        os.remove(report)
    p = subprocess.run([sys.executable, SOAK, "--seed", str(SEED), "--seconds", SECONDS, "--bin", binary,
                        "--outdir", outdir, "--report", report, "--settle-seconds", "25"],
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


@pytest.mark.parametrize("patch,invariant", CASES, ids=[c[0].split(".")[0] for c in CASES])
def test_broken_variant_is_caught(dev_binary, patch, invariant, tmp_path):
    binary = build_variant(patch, str(tmp_path / "tree"))
    rc, rep, out = soak(binary, patch.split(".")[0])
    failed = [i["name"] for i in rep["invariants"] if not i["ok"]]
    assert rc == 1, f"{patch}: the soak passed (exit {rc}):\n{out[-6000:]}"
    assert failed == [invariant], f"{patch}: caught by {failed}, expected [{invariant}]:\n{out[-6000:]}"
    # what a failure prints: the seed and the first broken invariant, with history
    assert f"FAILED, seed {SEED}: invariant" in out and invariant in out, out[-4000:]
