"""What the workloads are expected to produce, shared by the clients (which
build the commands and uploads from it) and the checkers (which rebuild the
expected bytes from the parameters recorded in the history).

A background writer prints numbered lines to stdout (and some to stderr)
with pauses; a foreground command prints `yes WORD | head -c N` and exits
with a chosen code, or echoes its stdin; an uploaded version is a header
line naming it and the SHA-256 of its body, then the body.
"""
import hashlib
import re


def digest(b):
    """The short digest a client records for a piece of output."""
    return hashlib.blake2b(b, digest_size=8).hexdigest()


# ------------------------------------------------------------------ background writers
def bg_script(p):
    """The sh script of a background writer with parameters p."""
    err = (f'if [ $((i % {p["err_every"]})) -eq 0 ]; then printf "{p["tag"]} e%06d\\n" $i >&2; fi; '
           if p["err_every"] else "")
    return (f'i=0; while [ $i -lt {p["lines"]} ]; do printf "{p["tag"]} %06d {p["pad"]}\\n" $i; {err}'
            f'i=$((i+1)); if [ $((i % {p["batch"]})) -eq 0 ]; then sleep {p["pause"]}; fi; done; '
            f'exit {p["code"]}')


def bg_expected(p):
    """{channel: bytes} a background writer with parameters p writes."""
    out = "".join(f'{p["tag"]} {i:06d} {p["pad"]}\n' for i in range(p["lines"])).encode()
    err = b""
    if p["err_every"]:
        err = "".join(f'{p["tag"]} e{i:06d}\n' for i in range(p["lines"]) if i % p["err_every"] == 0).encode()
    return {"stdout": out, "stderr": err}


def bg_params(rng, tag, max_bytes=180 * 1024):
    """Random writer parameters; its output stays below max_bytes per
    channel, so the 256 KiB the daemon keeps of a channel holds all of it
    and any offset the reader has is still replayable."""
    pad = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.choice([0, 4, 30, 90, 150])))
    linelen = len(tag) + 8 + len(pad) + 1
    lines = min(rng.randint(20, 2500), max_bytes // linelen)
    batch = rng.choice([5, 20, 50, 100])
    pause = rng.choice([0.01, 0.02, 0.05, 0.1])
    while lines / batch * pause > 6:  # a few seconds of output at most
        pause /= 2
    return {"tag": tag, "lines": lines, "pad": pad, "batch": batch, "pause": round(pause, 4),
            "err_every": rng.choice([0, 3, 7, 50]), "code": rng.randint(0, 3)}


# ------------------------------------------------------------------ foreground commands
def fg_params(rng, slow=False):
    """slow (runs with upgrades): sometimes a command that lasts a few
    seconds (a background writer's script run in the foreground), so that
    upgrades meet foreground commands still running."""
    if slow and rng.random() < 0.35:
        p = bg_params(rng, f"fg{rng.getrandbits(32):08x}")
        p["kind"] = "slow"
        return p
    kind = rng.choice(["yes", "yes", "cat"])
    if kind == "yes":
        word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(rng.randint(1, 40)))
        n = rng.choice([0, rng.randint(1, 100), rng.randint(100, 70000), rng.randint(70000, 600000)])
        return {"kind": "yes", "word": word, "n": n, "err": f"e{rng.randint(0, 99999)}", "code": rng.randint(0, 5)}
    n = rng.choice([0, rng.randint(1, 1000), rng.randint(1000, 200000)])
    return {"kind": "cat", "n": n, "seed": rng.getrandbits(64), "code": 0}


def fg_stdin(p):
    import random
    return random.Random(p["seed"]).randbytes(p["n"]) if p["kind"] == "cat" else b""


def fg_request(p):
    """(cmd, args, stdin bytes) of a foreground command."""
    if p["kind"] == "yes":
        return "sh", ["-c", f'yes {p["word"]} | head -c {p["n"]}; printf {p["err"]} >&2; exit {p["code"]}'], b""
    if p["kind"] == "slow":
        return "sh", ["-c", bg_script(p)], b""
    return "cat", [], fg_stdin(p)


def fg_expected(p):
    """({channel: bytes}, exit code)."""
    if p["kind"] == "yes":
        line = (p["word"] + "\n").encode()
        out = (line * (p["n"] // len(line) + 1))[:p["n"]]
        return {"stdout": out, "stderr": p["err"].encode()}, p["code"]
    if p["kind"] == "slow":
        return bg_expected(p), p["code"]
    return {"stdout": fg_stdin(p), "stderr": b""}, 0


# ------------------------------------------------------------------ uploaded versions
HEADER_RE = re.compile(rb"^SOAK ([0-9a-z.]+) (\d+) (\d+) ([0-9a-f]{64})\n")


def version_content(vid, path_index, body):
    h = f"SOAK {vid} {path_index} {len(body)} {hashlib.sha256(body).hexdigest()}\n".encode()
    return h + body


def parse_version(content_head):
    """(vid, path_index, body length, sha256 hex, header length) or None."""
    m = HEADER_RE.match(content_head)
    if not m:
        return None
    return m.group(1).decode(), int(m.group(2)), int(m.group(3)), m.group(4).decode(), m.end()
