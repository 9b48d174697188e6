"""A raw HTTP/2 cleartext client on python3-h2, for what libraries hide.

One H2Client is one TCP connection (prior knowledge).  Requests open
streams; the caller decides when to read, when to give flow-control credit
back (auto_ack=False: the slow reader) and when to reset a stream.  The
Connect helpers (connect_unary / connect_stream) frame messages the way
Connect clients do.

    c = H2Client(host, port)
    sid = c.request("POST", "/pb.FileService/ListFiles", headers, body)
    c.wait(sid)
    c.streams[sid].status, c.streams[sid].body
"""
import socket
import struct
import time

import h2.config
import h2.connection
import h2.errors
import h2.exceptions
import h2.events
import h2.settings

from conch import parse_envelopes


class Stream:
    def __init__(self, sid):
        self.sid = sid
        self.headers = {}        # response headers (lower-case str → str)
        self.status = None
        self.body = bytearray()
        self.trailers = {}
        self.ended = False       # END_STREAM seen
        self.reset = None        # RST_STREAM error code, if any
        self.unacked = 0         # flow-controlled bytes not yet acknowledged
        self.data_frames = 0

    @property
    def done(self):
        return self.ended or self.reset is not None


def _hdict(pairs):
    d = {}
    for k, v in pairs:
        k = k.decode() if isinstance(k, bytes) else k
        v = v.decode("latin-1") if isinstance(v, bytes) else v
        d[k.lower()] = v
    return d


class H2Client:
    def __init__(self, host, port, *, stream_window=None, conn_window=None, auto_ack=True,
                 timeout=30, preface_extra=b"", validate=True):
        """stream_window: our SETTINGS_INITIAL_WINDOW_SIZE (default 65535).
        conn_window: grow the connection receive window to this size.
        validate=False: send header blocks as given (malformed on purpose)."""
        self.host, self.port = host, port
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout = timeout
        self.auto_ack = auto_ack
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None,
                                        validate_outbound_headers=validate,
                                        normalize_outbound_headers=validate)
        self.conn = h2.connection.H2Connection(config=cfg)
        if stream_window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window})
        self.conn.initiate_connection()
        if conn_window is not None and conn_window > 65535:
            self.conn.increment_flow_control_window(conn_window - 65535)
        self.streams = {}
        self.order = []          # stream id of every DATA frame, in arrival order
        self.terminated = None   # ConnectionTerminated event, if any
        self.remote_settings_seen = False
        self.closed = False      # the peer closed the TCP connection
        self.flush()

    # ------------------------------------------------------------ plumbing
    def flush(self):
        data = self.conn.data_to_send()
        if data:
            # the whole timeout, not what a pump(0.05) left: a server that
            # reads a stream's data only once its answer has room is slow
            # to take what its windows let through, not wrong
            self.sock.settimeout(self.timeout)
            self.sock.sendall(data)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def pump(self, timeout=None):
        """Read once (up to timeout) and handle the events. False on EOF/timeout."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            data = self.sock.recv(262144)
        except socket.timeout:
            return False
        except ConnectionResetError:
            self.closed = True
            return False
        if not data:
            self.closed = True
            return False
        for ev in self.conn.receive_data(data):
            self._event(ev)
        self.flush()
        return True

    def _event(self, ev):
        st = self.streams.get(getattr(ev, "stream_id", None) or 0)
        if isinstance(ev, h2.events.ResponseReceived):
            st.headers = _hdict(ev.headers)
            st.status = int(st.headers.get(":status", "0"))
        elif isinstance(ev, h2.events.TrailersReceived):
            st.trailers = _hdict(ev.headers)
        elif isinstance(ev, h2.events.DataReceived):
            if st is None:
                return
            st.body += ev.data
            st.data_frames += 1
            self.order.append(ev.stream_id)
            if self.auto_ack:
                if ev.flow_controlled_length:
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            else:
                st.unacked += ev.flow_controlled_length
        elif isinstance(ev, h2.events.StreamEnded):
            if st is not None:
                st.ended = True
        elif isinstance(ev, h2.events.StreamReset):
            if st is not None:
                st.reset = ev.error_code
        elif isinstance(ev, h2.events.RemoteSettingsChanged):
            self.remote_settings_seen = True
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.terminated = ev

    def ack(self, sid, n=None):
        """Give back flow-control credit for n (default: all) received bytes."""
        st = self.streams[sid]
        n = st.unacked if n is None else min(n, st.unacked)
        if n:
            st.unacked -= n
            try:
                self.conn.acknowledge_received_data(n, sid)
            except h2.exceptions.StreamClosedError:
                # the stream is gone: credit the connection window only
                self.conn.increment_flow_control_window(n)
            self.flush()

    def wait_settings(self, timeout=10):
        deadline = time.time() + timeout
        while not self.remote_settings_seen and time.time() < deadline:
            if not self.pump(deadline - time.time()):
                break
        return self.conn.remote_settings

    def wait(self, *sids, timeout=None):
        """Pump until every given stream is done (or the connection ends)."""
        deadline = time.time() + (self.timeout if timeout is None else timeout)
        while not all(self.streams[s].done for s in sids):
            if self.closed or self.terminated or time.time() > deadline:
                raise TimeoutError(f"streams {[s for s in sids if not self.streams[s].done]} not done"
                                   f" (closed={self.closed} goaway={self.terminated})")
            self.pump(max(0.01, deadline - time.time()))
        return [self.streams[s] for s in sids]

    # ------------------------------------------------------------ requests
    def request(self, method, path, headers=(), body=None, end_stream=True):
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":scheme", "http"), (":authority", f"{self.host}:{self.port}"),
                (":path", path)] + [(k.lower(), v) for k, v in (headers.items() if isinstance(headers, dict) else headers)]
        self.streams[sid] = Stream(sid)
        self.conn.send_headers(sid, [(k.encode(), v.encode() if isinstance(v, str) else v) for k, v in hdrs],
                               end_stream=end_stream and not body)
        self.flush()
        if body:
            self.send(sid, body, end_stream=end_stream)
        return sid

    def request_raw(self, hdrs, body=None, end_stream=True):
        """A request with exactly this header block (list of (name, value))."""
        sid = self.conn.get_next_available_stream_id()
        self.streams[sid] = Stream(sid)
        self.conn.send_headers(sid, [(k.encode() if isinstance(k, str) else k,
                                      v.encode() if isinstance(v, str) else v) for k, v in hdrs],
                               end_stream=end_stream and not body)
        self.flush()
        if body:
            self.send(sid, body, end_stream=end_stream)
        return sid

    def send(self, sid, data, end_stream=False):
        """Send request body bytes, honouring the peer's flow-control windows."""
        data = memoryview(bytes(data))
        while data:
            win = min(self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size)
            if win <= 0:
                if not self.pump(10):
                    raise TimeoutError("no flow-control credit from the server")
                if self.streams[sid].done:
                    return
                continue
            n = min(win, len(data))
            self.conn.send_data(sid, data[:n].tobytes())
            data = data[n:]
            self.flush()
        if end_stream:
            self.conn.end_stream(sid)
            self.flush()

    def end(self, sid):
        self.conn.end_stream(sid)
        self.flush()

    def reset(self, sid, code=h2.errors.ErrorCodes.CANCEL):
        self.conn.reset_stream(sid, error_code=code)
        self.flush()

    # ------------------------------------------------------------ Connect helpers
    @staticmethod
    def envelope(payload, flags=0):
        return struct.pack(">BI", flags, len(payload)) + payload

    @staticmethod
    def envelopes(data):
        """[(flags, payload)]; raises ValueError on a truncated envelope."""
        return parse_envelopes(bytes(data))

    def connect_headers(self, token, ctype, extra=None):
        h = {"content-type": ctype, "connect-protocol-version": "1"}
        if token:
            h["conch-init-token"] = token
        if extra:
            h.update(extra)
        return h

    def connect_unary(self, path, body, token, ctype="application/json", extra=None):
        return self.request("POST", path, self.connect_headers(token, ctype, extra), body)

    def connect_stream(self, path, payloads, token, ctype="application/connect+proto", extra=None,
                       end_stream=True):
        body = b"".join(self.envelope(p) for p in payloads)
        return self.request("POST", path, self.connect_headers(token, ctype, extra), body or None,
                            end_stream=end_stream)
