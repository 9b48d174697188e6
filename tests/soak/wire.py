"""The soak harness's client side of the wire: one streaming RPC per TCP
connection, over HTTP/1.1 (raw socket) or HTTP/2 prior knowledge
(python3-h2), in three flavours (Connect, gRPC, gRPC-Web) and two codecs
(JSON, protobuf), with the knobs a fault needs: send a request body in
pieces and stop anywhere, stop reading, reset the connection (RST through
SO_LINGER 0) or the HTTP/2 stream (RST_STREAM CANCEL).

Messages are the protobuf classes of proto/agent.proto (agent_pb2, made by
protoc into build/py); the JSON codec goes through json_format, so a test
sees one kind of object whatever the codec.
"""
import base64
import http.client
import json
import socket
import struct

from google.protobuf import json_format

import agent_pb2 as pb

HOST = "127.0.0.1"  # the harness talks to nothing else

METHODS = {
    "StartProcess": ("/pb.ProcessService/StartProcess", pb.StartProcessRequest, pb.ProcessEvent),
    "Connect": ("/pb.ProcessService/Connect", pb.ConnectProcessRequest, pb.ProcessEvent),
    "PostFileStream": ("/pb.FileService/PostFileStream", pb.FileChunk, pb.PostFilesResponse),
    "GetFileStream": ("/pb.FileService/GetFileStream", pb.GetFileRequest, pb.FileChunk),
}

GRPC_CODES = ["ok", "canceled", "unknown", "invalid_argument", "deadline_exceeded", "not_found",
              "already_exists", "permission_denied", "resource_exhausted", "failed_precondition",
              "aborted", "out_of_range", "unimplemented", "internal", "unavailable", "data_loss",
              "unauthenticated"]


class WireError(Exception):
    """The connection ended or broke where the protocol says it must not."""


class End:
    """The end of a call: code None for success, else the Connect code name."""

    def __init__(self, code=None, message="", detail=""):
        self.code, self.message, self.detail = code, message, detail

    def __repr__(self):
        return f"End({self.code!r}, {self.message!r})"


def rst(sock):
    """Close with a TCP RST instead of a FIN (SO_LINGER on, 0 s)."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def envelope(payload, flags=0):
    return struct.pack(">BI", flags, len(payload)) + payload


def encode(msg, codec):
    if codec == "json":
        return json.dumps(json_format.MessageToDict(msg)).encode()
    return msg.SerializeToString()


def decode(cls, payload, codec):
    if codec == "json":
        return json_format.Parse(payload.decode(), cls())
    return cls.FromString(payload)


# ------------------------------------------------------------------ HTTP/1.1
class H1:
    """One HTTP/1.1 request on its own socket; the response read in pieces."""
    name = "h1"

    def __init__(self, port, timeout=30.0, rcvbuf=None):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.status = None
        self.headers = {}
        self.chunked_out = False
        self.mode = None       # response body: "length", "chunked", "close"
        self.left = 0          # bytes left of the body (length) or of this chunk
        self.body_done = False
        self.trailers = {}

    def settimeout(self, t):
        self.sock.settimeout(t)

    def send_head(self, path, headers, length=None):
        """length None: chunked transfer coding."""
        lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        if length is None:
            lines.append("Transfer-Encoding: chunked")
            self.chunked_out = True
        else:
            lines.append(f"Content-Length: {length}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    @staticmethod
    def head_bytes(path, headers, length):
        lines = [f"POST {path} HTTP/1.1", f"Host: {HOST}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        lines.append(f"Content-Length: {length}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def send_body(self, data):
        if not data:
            return
        if self.chunked_out:
            self.sock.sendall(b"%x\r\n" % len(data) + bytes(data) + b"\r\n")
        else:
            self.sock.sendall(data)

    def end_body(self):
        if self.chunked_out:
            self.sock.sendall(b"0\r\n\r\n")

    def _fill(self):
        d = self.sock.recv(65536)
        if not d:
            raise WireError("connection closed by the server")
        self.buf += d

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line = bytes(self.buf[:i])
                del self.buf[:i + 2]
                return line
            if len(self.buf) > 65536:
                raise WireError("response line too long")
            self._fill()

    def read_head(self):
        while True:
            line = self._line()
            parts = line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                raise WireError(f"bad status line {line[:80]!r}")
            status = int(parts[1])
            headers = {}
            while True:
                h = self._line()
                if not h:
                    break
                k, _, v = h.partition(b":")
                headers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
            if status == 100:
                continue
            break
        self.status, self.headers = status, headers
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode, self.left = "chunked", -1
        elif "content-length" in headers:
            self.mode, self.left = "length", int(headers["content-length"])
            self.body_done = self.left == 0
        else:
            self.mode = "close"
        return status, headers

    def read_body(self):
        """Some body bytes; b"" once the body ended."""
        if self.body_done:
            return b""
        if self.mode == "length":
            if not self.buf:
                self._fill()
            n = min(self.left, len(self.buf))
            out = bytes(self.buf[:n])
            del self.buf[:n]
            self.left -= n
            self.body_done = self.left == 0
            return out
        if self.mode == "close":
            if not self.buf:
                try:
                    d = self.sock.recv(65536)
                except ConnectionResetError as e:
                    raise WireError(f"reset: {e}")
                if not d:
                    self.body_done = True
                    return b""
                return d
            out = bytes(self.buf)
            self.buf.clear()
            return out
        # chunked
        while True:
            if self.left == -1:
                line = self._line()
                try:
                    self.left = int(line.split(b";")[0], 16)
                except ValueError:
                    raise WireError(f"bad chunk size {line[:40]!r}")
                if self.left == 0:
                    while True:  # trailers
                        t = self._line()
                        if not t:
                            break
                        k, _, v = t.partition(b":")
                        self.trailers[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
                    self.body_done = True
                    return b""
            if self.left > 0:
                if not self.buf:
                    self._fill()
                n = min(self.left, len(self.buf))
                out = bytes(self.buf[:n])
                del self.buf[:n]
                self.left -= n
                if self.left == 0:
                    self.left = -2
                return out
            # -2: the CRLF after a chunk
            while len(self.buf) < 2:
                self._fill()
            if self.buf[:2] != b"\r\n":
                raise WireError("chunk not followed by CRLF")
            del self.buf[:2]
            self.left = -1

    def reset(self):
        rst(self.sock)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def cancel(self):  # no stream to cancel in HTTP/1.1: the connection it is
        self.reset()


# ------------------------------------------------------------------ HTTP/2
class H2:
    """One HTTP/2 stream (prior knowledge) on its own connection."""
    name = "h2"

    def __init__(self, port, timeout=30.0, rcvbuf=None, window=None):
        import h2.config
        import h2.connection
        import h2.settings
        self._h2 = __import__("h2.events").events
        self._exc = __import__("h2.exceptions").exceptions
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=cfg)
        if window:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.conn.initiate_connection()
        self.sid = None
        self.status = None
        self.headers = {}
        self.trailers = {}
        self.q = bytearray()
        self.ended = False
        self.reset_code = None
        self.closed = False
        self._flush()

    def settimeout(self, t):
        self.sock.settimeout(t)

    def _flush(self):
        d = self.conn.data_to_send()
        if d:
            self.sock.sendall(d)

    def _pump(self):
        try:
            d = self.sock.recv(262144)
        except ConnectionResetError as e:
            raise WireError(f"reset: {e}")
        if not d:
            self.closed = True
            raise WireError("connection closed by the server")
        E = self._h2
        for ev in self.conn.receive_data(d):
            if getattr(ev, "stream_id", None) not in (None, self.sid):
                continue
            if isinstance(ev, E.ResponseReceived):
                self.headers = {k.decode().lower(): v.decode("latin-1") for k, v in ev.headers}
                self.status = int(self.headers.get(":status", "0"))
            elif isinstance(ev, E.TrailersReceived):
                self.trailers = {k.decode().lower(): v.decode("latin-1") for k, v in ev.headers}
            elif isinstance(ev, E.DataReceived):
                self.q += ev.data
                if ev.flow_controlled_length:
                    try:
                        self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    except self._exc.StreamClosedError:
                        self.conn.increment_flow_control_window(ev.flow_controlled_length)
            elif isinstance(ev, E.StreamEnded):
                self.ended = True
            elif isinstance(ev, E.StreamReset):
                self.reset_code = ev.error_code
            elif isinstance(ev, E.ConnectionTerminated):
                self.closed = True
                if not self.ended and self.reset_code is None:
                    self.reset_code = f"goaway {ev.error_code}"
        self._flush()

    def send_head(self, path, headers, length=None):
        self.sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", "POST"), (":scheme", "http"), (":authority", HOST), (":path", path)]
        hdrs += [(k.lower(), str(v)) for k, v in headers.items()]
        if length is not None:
            hdrs.append(("content-length", str(length)))
        self.conn.send_headers(self.sid, [(k.encode(), v.encode()) for k, v in hdrs])
        self._flush()

    def send_body(self, data):
        data = memoryview(bytes(data))
        while data:
            if self.reset_code is not None or self.ended:
                raise WireError(f"stream closed by the server while sending ({self.reset_code})")
            win = min(self.conn.local_flow_control_window(self.sid), self.conn.max_outbound_frame_size)
            if win <= 0:
                self._pump()
                continue
            n = min(win, len(data))
            self.conn.send_data(self.sid, data[:n].tobytes())
            data = data[n:]
            self._flush()

    def end_body(self):
        if self.reset_code is None and not self.ended:
            self.conn.end_stream(self.sid)
            self._flush()

    def read_head(self):
        while self.status is None:
            if self.reset_code is not None:
                raise WireError(f"stream reset before the response ({self.reset_code})")
            self._pump()
        return self.status, self.headers

    def read_body(self):
        while not self.q:
            if self.ended:
                return b""
            if self.reset_code is not None:
                raise WireError(f"stream reset ({self.reset_code})")
            self._pump()
        out = bytes(self.q)
        self.q.clear()
        return out

    def cancel(self):
        """RST_STREAM (CANCEL), then close the connection."""
        try:
            self.conn.reset_stream(self.sid, error_code=8)
            self._flush()
        except Exception:  # noqa: BLE001 - the stream may be closed already
            pass
        self.close()

    def reset(self):
        rst(self.sock)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


# ------------------------------------------------------------------ RPC framing
class Call:
    """A streaming RPC: flavour "connect" (HTTP/1.1 or HTTP/2), "grpc"
    (HTTP/2 only) or "grpcweb" (HTTP/1.1 or HTTP/2); codec "json" or
    "proto".  send()/finish() the request messages, next() the answers."""

    def __init__(self, port, token, method, transport="h1", flavor="connect", codec="json",
                 timeout=30.0, rcvbuf=None, window=None, headers=None):
        self.path, self.req_cls, self.resp_cls = METHODS[method]
        self.flavor, self.codec = flavor, codec
        if transport == "h2":
            self.t = H2(port, timeout, rcvbuf, window)
        else:
            self.t = H1(port, timeout, rcvbuf)
        self.hdrs = {"conch-init-token": token}
        sub = "json" if codec == "json" else "proto"
        if flavor == "connect":
            self.hdrs["Content-Type"] = f"application/connect+{sub}"
            self.hdrs["Connect-Protocol-Version"] = "1"
        elif flavor == "grpc":
            self.hdrs["Content-Type"] = f"application/grpc+{sub}"
            self.hdrs["TE"] = "trailers"
        else:
            self.hdrs["Content-Type"] = f"application/grpc-web+{sub}"
        if headers:
            self.hdrs.update(headers)
        self.inbuf = bytearray()
        self.started = False
        self.end = None
        self.status = None

    @property
    def label(self):
        return f"{self.t.name}/{self.flavor}/{self.codec}"

    def body_of(self, msgs):
        return b"".join(envelope(encode(m, self.codec)) for m in msgs)

    def start(self, length=None):
        if self.t.name == "h1" and self.flavor == "grpc":
            raise ValueError("gRPC needs HTTP/2")
        self.t.send_head(self.path, self.hdrs, length)
        self.started = True

    def send_raw(self, data):
        self.t.send_body(data)

    def finish(self):
        self.t.end_body()

    def request(self, msgs, chunked=False):
        """Send the whole request (a list of messages) and end it."""
        body = self.body_of(msgs)
        self.start(None if chunked else len(body))
        self.send_raw(body)
        self.finish()

    def _head(self):
        if self.status is None:
            self.status, _ = self.t.read_head()
            h = self.t.headers
            if self.flavor == "grpc" and "grpc-status" in h:  # trailers-only
                self.end = self._grpc_end(h)
            elif self.status != 200:
                body = bytearray()
                while True:
                    d = self.t.read_body()
                    if not d:
                        break
                    body += d
                self.end = self._error_body(bytes(body))

    def _error_body(self, body):
        try:
            j = json.loads(body or b"{}")
            return End(j.get("code", f"http {self.status}"), j.get("message", ""), body[:200])
        except ValueError:
            return End(f"http {self.status}", "", body[:200])

    @staticmethod
    def _grpc_end(h):
        st = int(h.get("grpc-status", "2"))
        msg = h.get("grpc-message", "")
        return End(None if st == 0 else (GRPC_CODES[st] if st < len(GRPC_CODES) else str(st)), msg)

    def next(self):
        """("msg", message) or ("end", End).  Raises WireError when the
        stream ends without its end (a cut stream, a reset)."""
        if self.end is not None:
            return ("end", self.end)
        self._head()
        if self.end is not None:
            return ("end", self.end)
        while True:
            if len(self.inbuf) >= 5:
                flags, n = struct.unpack(">BI", self.inbuf[:5])
                if len(self.inbuf) >= 5 + n:
                    payload = bytes(self.inbuf[5:5 + n])
                    del self.inbuf[:5 + n]
                    if flags & 0x80 and self.flavor == "grpcweb":
                        h = {}
                        for line in payload.decode("latin-1").split("\r\n"):
                            k, _, v = line.partition(":")
                            if k:
                                h[k.strip().lower()] = v.strip()
                        self.end = self._grpc_end(h)
                        return ("end", self.end)
                    if flags & 0x02 and self.flavor == "connect":
                        j = json.loads(payload or b"{}")
                        e = j.get("error")
                        self.end = End(e.get("code", "unknown"), e.get("message", "")) if e else End()
                        return ("end", self.end)
                    if flags & 0x01:
                        raise WireError("compressed message without an encoding")
                    return ("msg", decode(self.resp_cls, payload, self.codec))
            d = self.t.read_body()
            if not d:
                if self.flavor == "grpc":
                    if self.inbuf:
                        raise WireError(f"stream ended inside a message ({len(self.inbuf)} bytes)")
                    if "grpc-status" in self.t.trailers:
                        self.end = self._grpc_end(self.t.trailers)
                        return ("end", self.end)
                raise WireError(f"stream ended without its end ({len(self.inbuf)} bytes left)")
            self.inbuf += d

    def reset(self):
        self.t.reset()

    def cancel(self):
        self.t.cancel()

    def close(self):
        self.t.close()

    def settimeout(self, t):
        self.t.settimeout(t)


def pick_transport(rng, method_kind="stream"):
    """(transport, flavor, codec) at random: every combination the daemon serves."""
    transport = rng.choice(["h1", "h1", "h2"])
    flavors = ["connect", "connect", "grpcweb"] + (["grpc"] if transport == "h2" else [])
    return transport, rng.choice(flavors), rng.choice(["json", "proto"])


# ------------------------------------------------------------------ unary (Connect JSON)
def unary(port, token, path, body, timeout=30.0):
    """(http status, parsed JSON answer)."""
    c = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body).encode(),
                  headers={"Content-Type": "application/json", "Connect-Protocol-Version": "1",
                           "conch-init-token": token})
        r = c.getresponse()
        raw = r.read()
        try:
            return r.status, json.loads(raw or b"null")
        except ValueError:
            return r.status, raw
    finally:
        c.close()


def b64(b):
    return base64.b64encode(b).decode()
