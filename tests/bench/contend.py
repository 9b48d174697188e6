"""contend — GET /health on an h2c connection that also carries a download.

    contend.py PORT TOKEN FILE [CALLS]

One HTTP/2 connection (python3-h2, windows of 2^31-1): first CALLS (200)
/health calls one after the other on the idle connection, then a
GetFileStream of FILE (proto codec) read as fast as this client can while a
/health is asked 5 ms after the previous answer, until the download ends.
Prints one line: idle p50, p50 and p90 during the download (ms), their
ratio, how many calls ran during it and the download's MiB/s.  Fails when
an answer is wrong, the download ends without its end-of-stream message,
or the whole run takes more than 300 s.
"""
import socket
import statistics
import struct
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.settings


def varint(n):
    out = b""
    while True:
        c, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([c])
        out += bytes([c | 0x80])


def main():
    port, token, path = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode()
    calls = int(sys.argv[4]) if len(sys.argv) > 4 else 200
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
    c.initiate_connection()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    c.increment_flow_control_window(2**31 - 1 - 65535)
    s.sendall(c.data_to_send())

    def headers(method, p, ctype=None):
        h = [(":method", method), (":scheme", "http"), (":authority", "bench"), (":path", p),
             ("conch-init-token", token)]
        return h + ([("content-type", ctype)] if ctype else [])

    state = {"dl": None, "got": 0, "dl_end": False, "tail": b"", "pending": {}, "answers": {}}

    def health():
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, headers("GET", "/health"), end_stream=True)
        s.sendall(c.data_to_send())
        state["pending"][sid] = time.monotonic()
        state["answers"][sid] = b""
        return sid

    deadline = time.monotonic() + 300

    def pump(timeout):
        if time.monotonic() > deadline:
            sys.exit("no end after 300 s")
        s.settimeout(timeout)
        try:
            data = s.recv(1 << 18)
        except socket.timeout:
            return []
        if not data:
            sys.exit("connection closed")
        done = []
        for ev in c.receive_data(data):
            if isinstance(ev, h2.events.DataReceived):
                if ev.flow_controlled_length:
                    c.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                if ev.stream_id == state["dl"]:
                    state["got"] += len(ev.data)
                    state["tail"] = (state["tail"] + ev.data)[-256:]
                else:
                    state["answers"][ev.stream_id] += ev.data
            elif isinstance(ev, h2.events.StreamEnded):
                if ev.stream_id == state["dl"]:
                    state["dl_end"] = True
                elif ev.stream_id in state["pending"]:
                    if state["answers"][ev.stream_id] != b'{"status":"OK","message":"OK"}':
                        sys.exit(f"bad /health answer {state['answers'][ev.stream_id]!r}")
                    done.append(time.monotonic() - state["pending"].pop(ev.stream_id))
            elif isinstance(ev, h2.events.StreamReset):
                sys.exit(f"stream {ev.stream_id} reset")
        out = c.data_to_send()
        if out:
            s.sendall(out)
        return done

    idle = []
    for _ in range(calls):
        health()
        while not idle or state["pending"]:
            idle += pump(10)
    msg = bytes([1 << 3 | 2]) + varint(len(path)) + path
    dl = state["dl"] = c.get_next_available_stream_id()
    c.send_headers(dl, headers("POST", "/pb.FileService/GetFileStream", "application/connect+proto"))
    c.send_data(dl, struct.pack(">BI", 0, len(msg)) + msg, end_stream=True)
    s.sendall(c.data_to_send())
    t0 = time.monotonic()
    busy, next_at = [], t0 + 0.005
    while not state["dl_end"]:
        if not state["pending"] and time.monotonic() >= next_at and state["got"]:
            health()
        for lat in pump(0.002):
            if not state["dl_end"]:  # an answer that came after the download's end did not contend
                busy.append(lat)
            next_at = time.monotonic() + 0.005
    secs = time.monotonic() - t0
    if not state["tail"].endswith(b"\x02\x00\x00\x00\x02{}"):
        sys.exit("the download did not end with an empty end-of-stream message")
    if len(busy) < 10:
        sys.exit(f"only {len(busy)} calls ran during the download: use a bigger file")
    i50, b50 = statistics.median(idle) * 1e3, statistics.median(busy) * 1e3
    b90 = sorted(busy)[len(busy) * 9 // 10] * 1e3
    print(f"idle_p50_ms={i50:.3f} busy_p50_ms={b50:.3f} busy_p90_ms={b90:.3f} ratio={b50 / i50:.1f}"
          f" calls={len(busy)} mib_s={state['got'] / secs / 2**20:.0f}")


main()
