"""Helpers for the FileService integration tests (test_files*.py).

Envelope framing and parsing come from conch.py; this adds the seed's
example tree, curl runners for the three HTTP modes, and FileService
stream helpers (upload / download over Connect streaming, JSON or proto).
"""
import base64
import json
import os
import shutil
import subprocess

from conch import envelope, parse_envelopes

# curl flags for the three ways a client may speak to :4064 (api.md §1).
HTTP_MODES = {
    "http1": [],
    "h2-prior": ["--http2-prior-knowledge"],
    "h2-upgrade": ["--http2"],
}

SEED_DIR = "/tmp/conch-doc-api"


def make_seed_tree(root=SEED_DIR):
    """The tree the seed's ListFiles/SearchFiles outputs assume:
    a.txt, remote.txt, target/main.py and linked -> target."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(os.path.join(root, "target"))
    for rel, data in (("a.txt", b"a"), ("remote.txt", b"hello\n"),
                      ("target/main.py", b"print('ok')\n")):
        p = os.path.join(root, rel)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, 0o644)
    os.symlink("target", os.path.join(root, "linked"))
    return root


def run_seed_curl(cmd, url, token, mode_flags, timeout=60):
    """Run a curl command copied from the seed (with ${AGENT_URL} and
    ${AGENT_TOKEN}) through bash, inserting the HTTP-mode flags."""
    assert cmd.startswith("curl ")
    full = "curl -sS " + " ".join(mode_flags) + " " + cmd[len("curl "):]
    env = dict(os.environ, AGENT_URL=url, AGENT_TOKEN=token)
    return subprocess.run(["bash", "-c", full], env=env, capture_output=True, timeout=timeout)


def curl_post(url, path, body, ctype, token, mode_flags, extra_headers=(), timeout=120,
              out_file=None):
    """POST body (bytes) with curl; returns (http_status, response_bytes)."""
    args = ["curl", "-sS", *mode_flags, "--request", "POST", "--url", url + path,
            "--header", "Content-Type: " + ctype,
            "--header", "conch-init-token: " + token,
            "--data-binary", "@-", "--write-out", "\n%{http_code}"]
    if ctype in ("application/json", "application/proto"):
        args += ["--header", "Connect-Protocol-Version: 1"]
    for h in extra_headers:
        args += ["--header", h]
    p = subprocess.run(args, input=body, capture_output=True, timeout=timeout)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    data, _, code = p.stdout.rpartition(b"\n")
    return int(code), data


def json_envelopes(msgs):
    return b"".join(envelope(json.dumps(m).encode()) for m in msgs)


def split_stream(data, json_codec=True):
    """Connect stream body → ([messages], end-json)."""
    msgs, end = [], None
    for flags, p in parse_envelopes(data):
        if flags & 2:
            assert end is None, "two end-of-stream envelopes"
            end = json.loads(p)
        else:
            assert end is None, "message after end-of-stream"
            msgs.append(json.loads(p) if json_codec else p)
    assert end is not None, "no end-of-stream envelope"
    return msgs, end


def upload_msgs(path, data, chunk=1 << 20, repeat_path=False):
    """FileChunk JSON messages for one file."""
    out = []
    for i in range(0, max(len(data), 1), chunk):
        m = {"content": base64.b64encode(data[i:i + chunk]).decode()}
        if i == 0 or repeat_path:
            m["filepath"] = path
        out.append(m)
    return out


def chunk_bytes(msgs):
    return b"".join(base64.b64decode(m.get("content", "")) for m in msgs)


def temp_leftovers(directory, pid=None):
    """The upload temp files in directory: named ones (.conch-upload-*), and
    with the server's pid also the unnamed O_TMPFILE ones it holds open
    there (their /proc/<pid>/fd link reads "<directory>/#<ino> (deleted)")."""
    try:
        out = [n for n in os.listdir(directory) if n.startswith(".conch-upload-")]
    except FileNotFoundError:
        out = []
    if pid is not None:
        fds = f"/proc/{pid}/fd"
        for n in os.listdir(fds):
            try:
                link = os.readlink(os.path.join(fds, n))
            except OSError:
                continue  # closed meanwhile
            if link.startswith(os.path.join(str(directory), "#")) and link.endswith(" (deleted)"):
                out.append(link)
    return out
