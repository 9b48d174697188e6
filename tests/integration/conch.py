"""A small test client for the conch-init agent API (Connect protocol).

HTTP/1.1 via http.client, HTTP/2 via python3-h2 (h2conn.py).  JSON codec
helpers and envelope framing; enough to see what libraries hide.
"""
import base64
import http.client
import json
import socket
import struct
import subprocess
import urllib.parse

CURL = "curl"


def envelope(payload: bytes, flags: int = 0) -> bytes:
    return struct.pack(">BI", flags, len(payload)) + payload


def parse_envelopes(data: bytes):
    """[(flags, payload)], raises on a truncated envelope."""
    out, off = [], 0
    while off < len(data):
        if len(data) - off < 5:
            raise ValueError("truncated envelope header")
        flags, n = struct.unpack(">BI", data[off:off + 5])
        if len(data) - off - 5 < n:
            raise ValueError("truncated envelope body")
        out.append((flags, data[off + 5:off + 5 + n]))
        off += 5 + n
    return out


def free_port():
    """A free TCP port on 127.0.0.1."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def unb64(s: str) -> bytes:
    return base64.b64decode(s)


class Client:
    def __init__(self, url, token):
        u = urllib.parse.urlparse(url)
        self.host, self.port = u.hostname, u.port
        self.url, self.token = url, token

    def metrics(self):
        """GET /metrics in its JSON form."""
        conn = self.conn()
        try:
            conn.request("GET", "/metrics", headers={"conch-init-token": self.token})
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def conn(self, timeout=60):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra=None, token=True, ctype="application/json", version=True):
        h = {}
        if ctype:
            h["Content-Type"] = ctype
        if version:
            h["Connect-Protocol-Version"] = "1"
        if token and self.token:
            h["conch-init-token"] = self.token
        if extra:
            h.update(extra)
        return h

    def unary(self, path, body, headers=None, conn=None, **kw):
        """POST a unary Connect JSON call → (status, json-or-bytes, headers)."""
        data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
        c = conn or self.conn()
        c.request("POST", path, body=data, headers=self.headers(headers, **kw))
        r = c.getresponse()
        raw = r.read()
        if conn is None:
            c.close()
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw
        return r.status, parsed, dict((k.lower(), v) for k, v in r.getheaders())

    def stream(self, path, msgs, headers=None, json_codec=True, conn=None, chunked=False, raw=False):
        """Connect streaming call over HTTP/1.1.  msgs: list of dicts (JSON) or
        bytes (already-encoded payloads).  Returns (status, [messages], end)."""
        ctype = "application/connect+json" if json_codec else "application/connect+proto"
        body = b""
        for m in msgs:
            p = m if isinstance(m, (bytes, bytearray)) else json.dumps(m).encode()
            body += envelope(p)
        c = conn or self.conn()
        h = self.headers(headers, ctype=ctype)
        if chunked:
            def gen():
                yield body
            c.request("POST", path, body=gen(), headers=h, encode_chunked=True)
        else:
            c.request("POST", path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        if conn is None:
            c.close()
        if raw:
            return r.status, data, dict((k.lower(), v) for k, v in r.getheaders())
        if r.status != 200:
            return r.status, data, None
        envs = parse_envelopes(data)
        msgs_out, end = [], None
        for flags, p in envs:
            if flags & 2:
                end = json.loads(p)
            else:
                msgs_out.append(json.loads(p) if json_codec else p)
        return r.status, msgs_out, end


def curl(*args, input=None, check=False, timeout=120):
    """Run curl; returns CompletedProcess with bytes stdout."""
    return subprocess.run([CURL, "-sS", *args], input=input, capture_output=True,
                          timeout=timeout, check=check)


class RawStream:
    """A Connect streaming call (JSON) over HTTP/1.1 on a raw socket, the
    chunked response decoded as it comes (http.client cannot read again
    after a timeout): poll(timeout) returns the messages that arrived,
    `end` is the end-of-stream JSON once seen, `eof` the socket's end."""

    def __init__(self, port, token, path, req, rcvbuf=None):
        self.s = socket.socket()
        if rcvbuf:
            self.s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.s.connect(("127.0.0.1", port))
        body = envelope(json.dumps(req).encode())
        head = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
                f"conch-init-token: {token}\r\nContent-Length: {len(body)}\r\n\r\n")
        self.s.sendall(head.encode() + body)
        self.raw = b""      # bytes from the socket not yet de-chunked
        self.head = None
        self.buf = b""      # de-chunked body not yet parsed
        self.end = None
        self.eof = False

    def _dechunk(self):
        if self.head is None:
            i = self.raw.find(b"\r\n\r\n")
            if i < 0:
                return
            self.head, self.raw = self.raw[:i], self.raw[i + 4:]
            assert self.head.startswith(b"HTTP/1.1 200"), self.head
        while True:
            i = self.raw.find(b"\r\n")
            if i < 0:
                return
            n = int(self.raw[:i].split(b";")[0], 16)
            if len(self.raw) < i + 2 + n + 2:
                return
            self.buf += self.raw[i + 2:i + 2 + n]
            self.raw = self.raw[i + 2 + n + 2:]
            if n == 0:
                self.eof = True
                return

    def poll(self, timeout):
        """New messages within timeout (maybe none)."""
        if not self.eof:
            self.s.settimeout(timeout)
            try:
                data = self.s.recv(1 << 20)
                if not data:
                    self.eof = True
                self.raw += data
            except (socket.timeout, TimeoutError):
                pass
        self._dechunk()
        out = []
        while len(self.buf) >= 5:
            flags, n = struct.unpack(">BI", self.buf[:5])
            if len(self.buf) < 5 + n:
                break
            p, self.buf = self.buf[5:5 + n], self.buf[5 + n:]
            if flags & 2:
                self.end = json.loads(p)
            else:
                out.append(json.loads(p))
        return out

    def close(self):
        self.s.close()
