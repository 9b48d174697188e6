#!/usr/bin/python3
"""initpeer — the host side of the conch-init init protocol (boot.md §3).

Sends init frames the way conchd does: one connection per attempt, a 4-byte
big-endian length and the JSON request, then reads one response frame; while
the answer is `not_ready` and retryable it retries every ~10 ms until a
deadline.  Usable by hand and imported by the namespace tests.

  initpeer.py unix:/run/conch-init.sock --sandbox-id sb-1 --token T \\
      --guest-ip 192.168.100.21 --prefix 24 --gateway 192.168.100.2 \\
      --nameserver 10.0.0.53 --search example.test --env FOO=bar --wait 10
  initpeer.py vsock:3:4065 ...              (guest CID 3, port 4065)
  initpeer.py unix:/x.sock --raw '{"version":2}'   (exact bytes, one attempt)
  initpeer.py unix:/x.sock --raw-frame HEX          (raw bytes incl. the header)

Prints the response JSON (or "no response") and the elapsed time on stderr.
Exit status: 0 ready, 1 not_ready (terminal, or retryable past the deadline),
2 no response / cannot connect.
"""
import argparse
import json
import socket
import struct
import sys
import time

MAX_FRAME = 16384


def connect(target, timeout=2.0):
    kind, _, rest = target.partition(":")
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        addr = rest
    elif kind == "vsock":
        cid, _, port = rest.partition(":")
        s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
        addr = (int(cid), int(port))
    else:
        raise ValueError("target must be unix:PATH or vsock:CID:PORT")
    s.settimeout(timeout)
    s.connect(addr)
    return s


def frame(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


def recv_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def exchange_bytes(target, data: bytes, timeout=5.0, chunk=0):
    """Send raw bytes, return the response JSON text or None (no response)."""
    s = connect(target, timeout)
    try:
        if chunk:
            for i in range(0, len(data), chunk):
                s.sendall(data[i:i + chunk])
                time.sleep(0.001)
        else:
            s.sendall(data)
        hdr = recv_exact(s, 4)
        if hdr is None:
            return None
        (n,) = struct.unpack(">I", hdr)
        body = recv_exact(s, n)
        return None if body is None else body.decode()
    except (ConnectionResetError, BrokenPipeError, socket.timeout):
        return None
    finally:
        s.close()


def exchange(target, request, timeout=5.0):
    payload = request if isinstance(request, bytes) else json.dumps(request).encode()
    return exchange_bytes(target, frame(payload), timeout)


def until_ready(target, request, deadline_s=10.0, interval=0.01):
    """conchd's loop: retry while not_ready+retryable.  Returns (resp, secs)."""
    t0 = time.monotonic()
    resp = None
    while True:
        try:
            resp = exchange(target, request)
        except OSError:
            resp = None  # listener not up yet
        if resp is not None:
            r = json.loads(resp)
            if r.get("status") == "ready" or not r.get("retryable"):
                return resp, time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            return resp, time.monotonic() - t0
        time.sleep(interval)


def build_request(a):
    req = {"version": a.version, "sandboxID": a.sandbox_id, "agentToken": a.token}
    if a.env:
        req["env"] = dict(kv.split("=", 1) for kv in a.env)
    net = {"guestIP": a.guest_ip, "prefixLength": a.prefix, "gateway": a.gateway}
    dns = {}
    if a.nameserver:
        dns["nameservers"] = a.nameserver
    if a.domain:
        dns["domain"] = a.domain
    if a.search:
        dns["search"] = a.search
    if a.option:
        dns["options"] = a.option
    if dns:
        net["dns"] = dns
    req["network"] = net
    return req


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target", help="unix:PATH or vsock:CID:PORT")
    p.add_argument("--version", type=int, default=1)
    p.add_argument("--sandbox-id", default="sandbox-manual")
    p.add_argument("--token", default="")
    p.add_argument("--env", action="append", default=[], metavar="K=V")
    p.add_argument("--guest-ip", default="192.168.100.21")
    p.add_argument("--prefix", type=int, default=24)
    p.add_argument("--gateway", default="192.168.100.2")
    p.add_argument("--nameserver", action="append", default=[])
    p.add_argument("--domain", default="")
    p.add_argument("--search", action="append", default=[])
    p.add_argument("--option", action="append", default=[])
    p.add_argument("--raw", help="send this exact JSON text (one attempt)")
    p.add_argument("--raw-frame", help="send these hex bytes as they are (one attempt)")
    p.add_argument("--chunk", type=int, default=0, help="write N bytes at a time (raw modes)")
    p.add_argument("--wait", type=float, default=0.0,
                   help="retry every 10 ms while not_ready+retryable, up to this many seconds")
    a = p.parse_args()
    t0 = time.monotonic()
    try:
        if a.raw_frame is not None:
            resp = exchange_bytes(a.target, bytes.fromhex(a.raw_frame), chunk=a.chunk)
        elif a.raw is not None:
            resp = exchange_bytes(a.target, frame(a.raw.encode()), chunk=a.chunk)
        elif a.wait > 0:
            resp, _ = until_ready(a.target, build_request(a), a.wait)
        else:
            resp = exchange(a.target, build_request(a))
    except OSError as e:
        print(f"cannot connect: {e}", file=sys.stderr)
        return 2
    print(f"elapsed {time.monotonic() - t0:.3f} s", file=sys.stderr)
    if resp is None:
        print("no response")
        return 2
    print(resp)
    return 0 if json.loads(resp).get("status") == "ready" else 1


if __name__ == "__main__":
    sys.exit(main())
