"""pb.AgentService/Upgrade (api.md "Upgrading the agent in place"): every
refusal leaves the agent as it was (same pid, same /metrics version, no
upgrade counted, a background command still running, no trial process
left); the trial run's surroundings (root, outside the commands' cgroup,
PATH alone, no agent descriptor, its own process group); one upgrade at a
time; a call that ends early kills its trial; `--no-upgrade` and the init
key allowUpgrade; `conch-init --handover-check N`; and the answer of an
upgrade that passes (what follows it is the handover's, tested with it)."""
import concurrent.futures
import hashlib
import json
import os
import platform
import struct
import subprocess
import sys
import time

import pytest

from conch import Client, envelope
from conftest import BIN, Server, serve

UP = "/pb.AgentService/Upgrade"
SP = "/pb.ProcessService/StartProcess"
VERSION = subprocess.run([BIN, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]

# Little C programs that play a new agent: MODE picks what they do wrong.
FAKE_AGENT = r"""
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
extern char **environ;
int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--version") == 0) {
#if MODE == 1
    sleep(60);                 /* never answers */
#elif MODE == 2
    raise(SIGSEGV);            /* crashes */
#elif MODE == 3
    puts("conch-init 9.9");    /* but fails */
    return 3;
#elif MODE == 6
    sleep(1);                  /* slow */
#elif MODE == 5
    FILE *f = fopen(REPORT, "w");  /* where it runs */
    for (char **e = environ; *e; e++) fprintf(f, "env %s\n", *e);
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    while ((de = readdir(d)))
      if (de->d_name[0] != '.' && atoi(de->d_name) != dirfd(d)) {
        char p[64], t[256] = "";
        snprintf(p, sizeof p, "/proc/self/fd/%s", de->d_name);
        readlink(p, t, sizeof t - 1);
        fprintf(f, "fd %s %s\n", de->d_name, t);
      }
    closedir(d);
    fprintf(f, "uid %d\npgrp %d\npid %d\n", (int)getuid(), (int)getpgrp(), (int)getpid());
    char cwd[256];
    fprintf(f, "cwd %s\n", getcwd(cwd, sizeof cwd));
    FILE *cg = fopen("/proc/self/cgroup", "r");
    char line[512];
    while (cg && fgets(line, sizeof line, cg)) fprintf(f, "cgroup %s", line);
    fclose(f);
#endif
    puts("conch-init 9.9");
    return 0;
  }
#if MODE == 6
  if (argc == 3 && strcmp(argv[1], "--handover-check") == 0) {
    sleep(2);                  /* slow, then it says yes: it would be exec'd (and serve nothing) */
    return 0;
  }
#endif
  if (argc == 3 && strcmp(argv[1], "--handover-check") == 0) return 1; /* cannot read state format 2 */
  return 2;
}
"""


def compile_fake(tmp, mode, report=""):
    src = tmp / f"fake{mode}.c"
    src.write_text("#include <stdlib.h>\n" + FAKE_AGENT)
    out = tmp / f"fake-agent-{mode}"
    subprocess.run(["cc", "-O1", f"-DMODE={mode}", f'-DREPORT="{report}"', "-o", str(out), str(src)], check=True)
    os.chmod(out, 0o644)  # the trial runs a sealed copy: the file needs no exec bit
    return str(out)


def upgrade(c, path, sha256=None, headers=None):
    body = {"path": path}
    if sha256 is not None:
        body["sha256"] = sha256
    st, b, _ = c.unary(UP, body, headers=headers)
    return st, b



def start_background(c, tag):
    """StartProcess background `sleep 1000`: read its start event, hang up."""
    conn = c.conn()
    conn.request("POST", SP, body=envelope(json.dumps({"cmd": "sleep", "args": ["1000"], "background": True,
                                                        "tag": tag}).encode()),
                 headers=c.headers(ctype="application/connect+json"))
    r = conn.getresponse()
    flags, n = struct.unpack(">BI", r.read(5))
    ev = json.loads(r.read(n))
    conn.close()
    return ev["start"]["pid"]


def trial_children(agent_pid):
    """Live children of the agent running a sealed upgrade copy."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            exe = os.readlink(f"/proc/{d}/exe")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == agent_pid and fields[0] not in "ZX" and "conch-init-upgrade" in exe:
            out.append(int(d))
    return out


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """A server of this module's, a background command in it, the fake agents."""
    tmp = tmp_path_factory.mktemp("upgrade")
    for s in serve("upgrade"):
        c = Client(s.url, s.token)
        keeper = start_background(c, "keeper")
        yield s, c, keeper, tmp


def unchanged(s, c, keeper):
    assert s.alive()
    m = c.metrics()
    assert m["version"] == VERSION and m["upgrades"] == 0, m
    st, b, _ = c.unary("/pb.ProcessService/List", {})
    assert st == 200
    [k] = [p for p in b["processes"] if p.get("tag") == "keeper"]
    assert k["pid"] == keeper and k["running"] is True
    assert os.path.exists(f"/proc/{keeper}")
    deadline = time.time() + 5
    while trial_children(s.proc.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert trial_children(s.proc.pid) == []


# ---------------------------------------------------------------- refusals: nothing changes

def foreign_elf(tmp):
    """A 64-bit little-endian ELF executable header for the other architecture."""
    ours_x86 = platform.machine() in ("x86_64", "amd64")
    machine = 183 if ours_x86 else 62  # EM_AARCH64, EM_X86_64
    h = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9) + struct.pack("<HHI", 2, machine, 1) + bytes(40)
    p = tmp / "foreign-elf"
    p.write_bytes(h + bytes(4096))
    want = f"not an {'x86-64' if ours_x86 else 'arm64'} executable (ELF machine {machine})"
    return str(p), want


def test_refusals_change_nothing(agent):
    s, c, keeper, tmp = agent
    text = tmp / "script.sh"
    text.write_text("#!/bin/sh\necho conch-init 9.9\n")
    big = tmp / "big"
    with open(big, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse
    exact = tmp / "exact"
    with open(exact, "wb") as f:
        f.truncate(64 << 20)  # at the bound: read, then not an ELF file
    foreign, foreign_why = foreign_elf(tmp)
    true_sha = hashlib.sha256(open("/bin/true", "rb").read()).hexdigest()
    cases = [
        ({"path": str(text)}, 400, "failed_precondition", "upgrade refused: not an ELF executable"),
        ({"path": foreign}, 400, "failed_precondition", "upgrade refused: " + foreign_why),
        ({"path": "/bin/true"}, 400, "failed_precondition",
         "upgrade refused: --version printed no conch-init version"),
        ({"path": "/bin/true", "sha256": "0" * 64}, 400, "invalid_argument", "sha256 mismatch: /bin/true"),
        ({"path": "/bin/true", "sha256": true_sha[:-1]}, 400, "invalid_argument", "sha256 must be 64 hex digits"),
        ({"path": "/bin/true", "sha256": "g" * 64}, 400, "invalid_argument", "sha256 must be 64 hex digits"),
        ({"path": str(big)}, 400, "invalid_argument", f"file too large: {big}"),
        ({"path": str(exact)}, 400, "failed_precondition", "upgrade refused: not an ELF executable"),
        ({"path": str(tmp)}, 400, "invalid_argument", f"not a regular file: {tmp}"),
        ({"path": "/dev/null"}, 400, "invalid_argument", "not a regular file: /dev/null"),
        ({"path": "/no/such/agent"}, 404, "not_found", "file not found: /no/such/agent"),
        ({"path": "bin/true"}, 400, "invalid_argument",
         "filepath must be a normalized absolute guest path for upgrade"),
        ({"path": "/bin/../bin/true"}, 400, "invalid_argument",
         "filepath must be a normalized absolute guest path for upgrade"),
        ({"path": ""}, 400, "invalid_argument", "filepath is required for upgrade"),
        ({}, 400, "invalid_argument", "filepath is required for upgrade"),
        ({"path": "/bin/true\u0000x"}, 400, "invalid_argument", "filepath contains a NUL byte for upgrade"),
    ]
    for body, status, code, msg in cases:
        st, b, _ = c.unary(UP, body)
        assert (st, b) == (status, {"code": code, "message": msg}), body
    unchanged(s, c, keeper)


def test_sha256_either_case_then_the_trial(agent):
    """A right sha256, in either case, passes on to the trial (where /bin/true fails)."""
    s, c, keeper, tmp = agent
    sha = hashlib.sha256(open("/bin/true", "rb").read()).hexdigest()
    for h in (sha, sha.upper()):
        st, b = upgrade(c, "/bin/true", h)
        assert (st, b["message"]) == (400, "upgrade refused: --version printed no conch-init version")
    unchanged(s, c, keeper)


@pytest.mark.parametrize("mode,why", [
    (0, "upgrade refused: it cannot read state format 2"),
    (2, "upgrade refused: --version was killed by signal 11"),
    (3, "upgrade refused: --version exited with status 3"),
])
def test_trial_refusals(agent, mode, why):
    s, c, keeper, tmp = agent
    st, b = upgrade(c, compile_fake(tmp, mode))
    assert (st, b) == (400, {"code": "failed_precondition", "message": why})
    unchanged(s, c, keeper)


def test_trial_timeout_and_one_at_a_time(agent):
    """--version that never answers: killed after 5 s; meanwhile a second
    Upgrade is refused as under way; afterwards one is accepted again."""
    s, c, keeper, tmp = agent
    sleeper = compile_fake(tmp, 1)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        t0 = time.time()
        first = ex.submit(upgrade, c, sleeper)
        deadline = time.time() + 5
        while not trial_children(s.proc.pid) and time.time() < deadline:
            time.sleep(0.05)
        assert trial_children(s.proc.pid), "the trial run is not there"
        st, b = upgrade(c, "/bin/true")
        assert (st, b) == (400, {"code": "failed_precondition",
                                 "message": "upgrade refused: an upgrade is under way"})
        st, b = first.result(timeout=30)
        took = time.time() - t0
    assert (st, b) == (400, {"code": "failed_precondition",
                             "message": "upgrade refused: --version timed out after 5 s"})
    assert 4.5 < took < 10, took
    unchanged(s, c, keeper)
    st, b = upgrade(c, "/bin/true")  # no longer under way
    assert b["message"] == "upgrade refused: --version printed no conch-init version"


def test_call_that_ends_kills_its_trial(agent):
    """The client's deadline ends the call during the trial: the trial run is
    killed at once, nothing changes, the next Upgrade is not refused as under way."""
    s, c, keeper, tmp = agent
    sleeper = compile_fake(tmp, 1)
    st, b = upgrade(c, sleeper, headers={"Connect-Timeout-Ms": "1000"})
    assert (st, b["code"]) == (504, "deadline_exceeded")
    deadline = time.time() + 2
    while trial_children(s.proc.pid) and time.time() < deadline:
        time.sleep(0.05)
    assert trial_children(s.proc.pid) == []
    unchanged(s, c, keeper)
    deadline = time.time() + 5
    while True:
        st, b = upgrade(c, "/bin/true")
        if "under way" not in b["message"] or time.time() > deadline:
            break
        time.sleep(0.1)
    assert b["message"] == "upgrade refused: --version printed no conch-init version"


def test_trial_surroundings(agent):
    """The trial run: as the agent (root), outside the commands' cgroup, an
    environment of PATH alone, stdin/stderr /dev/null, stdout a pipe, no
    other descriptor, its own process group, cwd /."""
    s, c, keeper, tmp = agent
    report = tmp / "report.txt"
    fake = compile_fake(tmp, 5, str(report))
    st, b = upgrade(c, fake)
    assert b["message"] == "upgrade refused: it cannot read state format 2"
    lines = report.read_text().splitlines()
    env = [x[4:] for x in lines if x.startswith("env ")]
    assert env == ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], env
    fds = {x.split()[1]: x.split(" ", 2)[2] for x in lines if x.startswith("fd ")}
    assert sorted(fds) == ["0", "1", "2", "3"] or sorted(fds) == ["0", "1", "2"], fds
    assert fds["0"] == "/dev/null" and fds["2"] == "/dev/null" and fds["1"].startswith("pipe:"), fds
    if "3" in fds:  # the report file itself
        assert fds["3"] == str(report), fds
    kv = dict(x.split(" ", 1) for x in lines if x.split(" ", 1)[0] in ("uid", "pgrp", "pid", "cwd"))
    assert kv["uid"] == str(os.getuid()) and kv["pgrp"] == kv["pid"] and kv["cwd"] == "/", kv
    cg = [x[7:] for x in lines if x.startswith("cgroup ")]
    assert cg == open(f"/proc/{s.proc.pid}/cgroup").read().splitlines()  # the agent's, not a command's
    assert cg != open(f"/proc/{keeper}/cgroup").read().splitlines()  # the command's own cgroup
    unchanged(s, c, keeper)


# ---------------------------------------------------------------- disabled

def test_no_upgrade_option(tmp_path):
    for s in serve("upgrade-off", extra_args=["--no-upgrade"]):
        c = Client(s.url, s.token)
        for path in (BIN, "", "relative"):
            st, b = upgrade(c, path)
            assert (st, b) == (403, {"code": "permission_denied", "message": "upgrade is disabled"})
        assert c.metrics()["upgrades"] == 0


def init_request(token, **extra):
    return dict({"version": 1, "sandboxID": "upgrade-sb", "agentToken": token, "env": {},
                 "network": {"guestIP": "10.0.0.2", "prefixLength": 24, "gateway": "10.0.0.1"}}, **extra)


def test_init_key_allow_upgrade(tmp_path):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import initpeer
    sock = "unix:" + str(tmp_path / "init.sock")
    srv = Server(name="upgrade-init", token="", extra_args=["--init-listen", sock])
    try:
        ready = '{"version":1,"status":"ready","retryable":false}'
        assert initpeer.exchange(sock, init_request("t1", allowUpgrade=False)) == ready
        off = (403, {"code": "permission_denied", "message": "upgrade is disabled"})
        assert upgrade(Client(srv.url, "t1"), "/bin/true") == off
        assert initpeer.exchange(sock, init_request("t2")) == ready  # sticky
        assert upgrade(Client(srv.url, "t2"), "/bin/true") == off
        assert initpeer.exchange(sock, init_request("t3", allowUpgrade=True)) == ready
        st, b = upgrade(Client(srv.url, "t3"), "/bin/true")
        assert b["message"] == "upgrade refused: --version printed no conch-init version"
    finally:
        assert "ERROR: AddressSanitizer" not in srv.stop()


@pytest.mark.parametrize("contest", ["allowUpgrade", "token"])
def test_a_contested_upgrade_changes_nothing(tmp_path, contest):
    """An init message arrives while the trial runs (slow to answer, then it
    would pass): `"allowUpgrade": false` ends the call permission_denied
    `upgrade is disabled`, a new token ends it unauthenticated; either way
    nothing changes (same program, no upgrade, the trial gone).  A second
    Upgrade meanwhile is refused."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import initpeer
    fake = compile_fake(tmp_path, 6)
    sock = "unix:" + str(tmp_path / "init.sock")
    srv = Server(name="upgrade-contest", token="", extra_args=["--init-listen", sock])
    try:
        ready = '{"version":1,"status":"ready","retryable":false}'
        assert initpeer.exchange(sock, init_request("t1")) == ready
        c = Client(srv.url, "t1")
        pool = concurrent.futures.ThreadPoolExecutor(1)
        call = pool.submit(upgrade, c, fake)
        deadline = time.time() + 10
        while not trial_children(srv.proc.pid) and time.time() < deadline:
            time.sleep(0.02)
        assert trial_children(srv.proc.pid), "no trial ran"
        assert upgrade(c, BIN)[1] == {"code": "failed_precondition", "message": "upgrade refused: an upgrade is under way"}
        if contest == "allowUpgrade":
            assert initpeer.exchange(sock, init_request("t1", allowUpgrade=False)) == ready
            want = (403, {"code": "permission_denied", "message": "upgrade is disabled"})
        else:
            assert initpeer.exchange(sock, init_request("t2")) == ready
            c = Client(srv.url, "t2")
            want = (401, {"code": "unauthenticated", "message": "agent token was replaced"})
        assert call.result(timeout=30) == want
        time.sleep(1)  # (an exec would have happened by now)
        assert srv.alive()
        m = c.metrics()
        assert m["version"] == VERSION and m["upgrades"] == 0, m
        assert os.readlink(f"/proc/{srv.proc.pid}/exe") == os.path.realpath(BIN)
        assert trial_children(srv.proc.pid) == []
    finally:
        assert "ERROR: AddressSanitizer" not in srv.stop()


@pytest.mark.parametrize("bad", ["no", 0, [], {}])
def test_init_key_wrong_type_is_terminal(tmp_path, bad):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
    import initpeer
    sock = "unix:" + str(tmp_path / "init.sock")
    srv = Server(name="upgrade-init-bad", token="", extra_args=["--init-listen", sock])
    try:
        want = '{"version":1,"status":"not_ready","retryable":false,"message":"invalid allowUpgrade"}'
        assert initpeer.exchange(sock, init_request("t1", allowUpgrade=bad)) == want
        assert initpeer.exchange(sock, init_request("t1")) == want
    finally:
        assert "ERROR: AddressSanitizer" not in srv.stop()


def test_no_upgrade_in_usage():
    p = subprocess.run([BIN, "--help"], capture_output=True, text=True)
    assert "--no-upgrade" in p.stdout and "--handover-check N" in p.stdout


# ---------------------------------------------------------------- --handover-check

def test_handover_check_option():
    assert subprocess.run([BIN, "--handover-check", "1"], capture_output=True).returncode == 0
    assert subprocess.run([BIN, "--handover-check", "2"], capture_output=True).returncode == 0
    p = subprocess.run([BIN, "--handover-check", "3"], capture_output=True, text=True)
    assert p.returncode == 1 and "cannot read handover state format 3 (it reads 1 to 2)" in p.stderr
    assert subprocess.run([BIN, "--handover-check", "0"], capture_output=True).returncode == 1
    for bad in (["--handover-check"], ["--handover-check", "x"], ["--handover-check", "-1"],
                ["--handover-check", "1", "2"]):
        assert subprocess.run([BIN, *bad], capture_output=True).returncode == 2, bad


# ---------------------------------------------------------------- the answer

def test_upgrade_answers(fresh_server):
    """Upgrade to the binary under test itself passes every check and answers
    {fromVersion, toVersion}.  Only the answer is asserted here: after it the
    agent hands over to the new program (core/handover.h), whose own tests
    say what the agent is then."""
    c = Client(fresh_server.url, fresh_server.token)
    sha = hashlib.sha256(open(BIN, "rb").read()).hexdigest().upper()
    st, b = upgrade(c, BIN, sha)
    assert (st, b) == (200, {"fromVersion": VERSION, "toVersion": VERSION})
