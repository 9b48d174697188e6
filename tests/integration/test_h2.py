"""HTTP/2 behaviour that client libraries hide, with a raw python3-h2 client.

* SETTINGS: MAX_CONCURRENT_STREAMS = 128 advertised.
* 10 concurrent streams on one connection (unary ListFiles mixed with
  GetFileStream), all answered correctly and interleaved.
* A client that resets a stream mid-upload: target untouched, no temp file.
* Flow control with a slow reader: a ~20 MiB GetFileStream read through a
  tiny window; the server's RSS stays bounded and the bytes are intact.
* h2c upgrade (curl --http2).
* The idle timer never cuts a response still going out: a stalled reader,
  and a client whose stream window stays at 0 (bytes held in the stream).
"""
import hashlib
import json
import os
import socket
import time

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.settings
import pytest

import agent_pb2 as pb
from conch import curl, envelope, parse_envelopes
from files_util import temp_leftovers
from conftest import Server, sanitizer_report, serve, status_kib
from h2conn import H2Client

FS = "/pb.FileService/"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(own_server):
    return own_server  # this module's own conch-init (see conftest.own_server)


def h2client(server, **kw):
    return H2Client("127.0.0.1", server.port, **kw)


def health_ok(server):
    r = curl(server.url + "/health")
    return r.returncode == 0 and r.stdout == b'{"status":"OK","message":"OK"}'


def stream_result(st, msg_type=None):
    """Connect streaming response → (messages, end-of-stream JSON)."""
    assert st.status == 200, (st.status, bytes(st.body[:500]))
    msgs, end = [], None
    for flags, payload in H2Client.envelopes(st.body):
        assert end is None, "data after the end-of-stream envelope"
        if flags & 0x02:
            end = json.loads(payload)
        else:
            msgs.append(msg_type.FromString(payload) if msg_type else json.loads(payload))
    assert end is not None, "no end-of-stream envelope"
    return msgs, end


def temp_files(d, pid):
    return temp_leftovers(str(d), pid)


def poll(cond, timeout=5.0, step=0.02):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def get_req(path):
    return pb.GetFileRequest(filepath=path).SerializeToString()


# ---------------------------------------------------------------- settings

def test_settings_advertise_128_concurrent_streams(server):
    c = h2client(server)
    try:
        s = c.wait_settings()
        assert c.remote_settings_seen
        assert s.max_concurrent_streams == 128
        # and the connection works
        sid = c.request("GET", "/health")
        (st,) = c.wait(sid)
        assert st.status == 200 and bytes(st.body) == b'{"status":"OK","message":"OK"}'
    finally:
        c.close()


# ---------------------------------------------------------------- concurrency

def test_ten_concurrent_streams_on_one_connection(server, tmp_path):
    files = {}
    for i in range(5):
        p = tmp_path / f"f{i}.bin"
        data = os.urandom(MiB + 300_000 * (i + 1))
        p.write_bytes(data)
        files[str(p)] = data
    (tmp_path / "sub").mkdir()
    # big connection window, small stream windows: the server must
    # interleave the streams rather than finish one after the other
    c = h2client(server, conn_window=64 * MiB)
    try:
        c.wait_settings()
        sids = {}
        paths = sorted(files)
        for i in range(10):
            if i % 2 == 0:
                sid = c.connect_unary(FS + "ListFiles", json.dumps({"path": str(tmp_path)}).encode(),
                                      server.token)
                sids[sid] = ("list", None)
            else:
                p = paths[i // 2]
                sid = c.connect_stream(FS + "GetFileStream", [get_req(p)], server.token)
                sids[sid] = ("get", p)
        assert len(sids) == 10
        c.wait(*sids, timeout=60)
        for sid, (kind, p) in sids.items():
            st = c.streams[sid]
            assert st.reset is None, f"stream {sid} reset: {st.reset}"
            if kind == "list":
                assert st.status == 200
                assert st.headers["content-type"] == "application/json"
                names = [e["name"] for e in json.loads(bytes(st.body))["entries"]]
                assert names == ["f0.bin", "f1.bin", "f2.bin", "f3.bin", "f4.bin", "sub"]
            else:
                assert st.headers["content-type"] == "application/connect+proto"
                chunks, end = stream_result(st, pb.FileChunk)
                assert end == {}
                assert chunks[0].filepath == p
                assert all(ch.filepath == "" for ch in chunks[1:])
                got = b"".join(ch.content for ch in chunks)
                assert hashlib.sha256(got).digest() == hashlib.sha256(files[p]).digest()
        # interleaving: some download stream received data while another
        # download was still in progress
        get_sids = [s for s, (k, _) in sids.items() if k == "get"]
        spans = {s: (c.order.index(s), len(c.order) - 1 - c.order[::-1].index(s)) for s in get_sids}
        overlapping = any(a != b and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]
                          for a in get_sids for b in get_sids)
        assert overlapping, "downloads were served strictly one after another"
    finally:
        c.close()
    assert health_ok(server)


def test_an_answer_waits_behind_about_one_chunk_of_a_download(server, tmp_path):
    """A download shares its connection: a /health asked while the client
    is behind on a big GetFileStream comes after about one 1 MiB chunk of
    it (what the server has queued, what the kernel holds unsent — short
    while a download streams, rpc_bulk — and the client's small receive
    buffer), not after the server's whole socket buffer (4 MiB here).
    Counted in bytes, not time.  Without the feature this fails where the
    kernel's send buffer grows past 2 MiB (tcp_wmem's max, 4 MiB on Debian)
    and net.ipv4.tcp_notsent_lowat is unlimited (the default)."""
    p = tmp_path / "sparse.bin"
    with open(p, "wb") as f:
        f.truncate(256 * MiB)
    c = h2client(server, stream_window=2**31 - 1, conn_window=2**31 - 1)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    try:
        sid = c.connect_stream(FS + "GetFileStream", [get_req(str(p))], server.token)
        st = c.streams[sid]
        while len(st.body) < 16 * MiB:  # the connection at full speed first
            assert c.pump(10) and not st.done, (st.status, bytes(st.body[:200]))
        time.sleep(0.5)  # the client falls behind: every queue on the way fills
        at = len(st.body)
        hs = c.request("GET", "/health")
        c.wait(hs, timeout=30)
        ahead = len(st.body) - at
        assert c.streams[hs].status == 200 and c.streams[hs].body == b'{"status":"OK","message":"OK"}'
        assert not st.done, "the download ended first: nothing was measured"
        assert ahead <= 2 * MiB, f"{ahead / MiB:.2f} MiB of the download came ahead of the answer"
    finally:
        c.close()
    assert health_ok(server)


def test_streams_beyond_the_limit_are_refused(server):
    """Opening a 129th concurrent stream is refused: either that stream is
    reset (REFUSED_STREAM / PROTOCOL_ERROR) or — nghttp2's choice — the
    connection ends with GOAWAY naming stream 255 (the 128th) as the last one
    processed.  The first 128 streams are never refused; the server goes on."""
    c = h2client(server)
    try:
        c.wait_settings()
        # lift the client-side guard: we want to see the server enforce it
        c.conn.remote_settings[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = 1000
        c.conn.remote_settings.acknowledge()
        hdr = c.connect_headers(server.token, "application/connect+proto")
        # server-streaming calls whose request body never ends stay open
        sids = [c.request("POST", FS + "GetFileStream", hdr, end_stream=False) for _ in range(130)]
        deadline = time.time() + 10
        while (time.time() < deadline and not c.terminated and not c.closed
               and not any(c.streams[s].reset is not None for s in sids)):
            c.pump(0.2)
        refused = [s for s in sids if c.streams[s].reset is not None]
        assert not [s for s in refused if s in sids[:128]], "a stream within the limit was refused"
        if c.terminated is not None:
            assert c.terminated.last_stream_id == sids[127] == 255, c.terminated
            assert c.terminated.error_code in (h2.errors.ErrorCodes.PROTOCOL_ERROR,
                                               h2.errors.ErrorCodes.REFUSED_STREAM)
        else:
            assert refused, "no stream beyond 128 was refused"
            assert all(c.streams[s].reset in (h2.errors.ErrorCodes.REFUSED_STREAM,
                                              h2.errors.ErrorCodes.PROTOCOL_ERROR) for s in refused)
            for s in sids:
                if c.streams[s].reset is None:
                    c.reset(s)
            sid = c.request("GET", "/health")
            (st,) = c.wait(sid, timeout=10)
            assert st.status == 200
    finally:
        c.close()
    assert health_ok(server)


# ---------------------------------------------------------------- reset mid-upload

@pytest.mark.parametrize("where", ["between-envelopes", "inside-envelope", "tcp-close"])
def test_reset_mid_upload_leaves_target_untouched(server, tmp_path, where):
    target = tmp_path / "target.txt"
    target.write_bytes(b"original content\n")
    os.chmod(target, 0o600)
    c = h2client(server)
    try:
        c.wait_settings()
        first = pb.FileChunk(filepath=str(target), content=os.urandom(256 * 1024)).SerializeToString()
        sid = c.connect_stream(FS + "PostFileStream", [first], server.token, end_stream=False)
        # the upload is under way once its temp file exists in the target's dir
        assert poll(lambda: temp_files(tmp_path, server.proc.pid), 10), "no .conch-upload-* temp file appeared"
        if where == "inside-envelope":
            nxt = pb.FileChunk(filepath=str(target), content=os.urandom(512 * 1024)).SerializeToString()
            c.send(sid, H2Client.envelope(nxt)[:100_000])
            time.sleep(0.1)
        if where == "tcp-close":
            c.close()
        else:
            c.reset(sid)
        assert poll(lambda: not temp_files(tmp_path, server.proc.pid), 5), f"temp file left: {temp_files(tmp_path, server.proc.pid)}"
        assert target.read_bytes() == b"original content\n"
        assert os.stat(target).st_mode & 0o777 == 0o600
        assert sorted(os.listdir(tmp_path)) == ["target.txt"]
        if where != "tcp-close":
            # the connection survives a stream reset
            sid2 = c.connect_unary(FS + "ListFiles", json.dumps({"path": str(tmp_path)}).encode(),
                                   server.token)
            (st,) = c.wait(sid2, timeout=10)
            assert st.status == 200
            assert [e["name"] for e in json.loads(bytes(st.body))["entries"]] == ["target.txt"]
            # no response message was sent on the reset stream
            assert not c.streams[sid].body
    finally:
        c.close()
    assert health_ok(server)


def test_complete_upload_over_h2_with_many_data_frames(server, tmp_path):
    """The positive control for the reset test: same shape, finished."""
    target = tmp_path / "done.bin"
    data = os.urandom(3 * MiB + 17)
    chunks = [pb.FileChunk(filepath=str(target), content=data[i:i + MiB]).SerializeToString()
              for i in range(0, len(data), MiB)]
    c = h2client(server)
    try:
        sid = c.connect_stream(FS + "PostFileStream", chunks, server.token)
        (st,) = c.wait(sid, timeout=60)
        msgs, end = stream_result(st, pb.PostFilesResponse)
        assert end == {}
        assert len(msgs) == 1 and msgs[0].uploaded_count == 1
        assert msgs[0].entries[0].path == str(target)
    finally:
        c.close()
    assert target.read_bytes() == data
    assert temp_files(tmp_path, server.proc.pid) == []


# ---------------------------------------------------------------- flow control

@pytest.fixture()
def lean_server():
    """A private server whose ASan quarantine does not hold freed buffers
    (otherwise RSS grows with every byte ever allocated, bounded or not)."""
    s = Server(name="lean", env={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:quarantine_size_mb=1"})
    yield s
    text = s.stop()
    rep = sanitizer_report(text)
    assert rep is None, f"sanitizer report in server log:\n{rep}"


def test_slow_reader_flow_control_bounds_memory(lean_server, tmp_path):
    server = lean_server
    size = 20 * MiB
    big = tmp_path / "big.bin"
    data = os.urandom(size)
    big.write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    del data
    warm = tmp_path / "warm.bin"
    warm.write_bytes(os.urandom(4 * MiB))

    # warm up the allocator and thread pool with a fast read
    c0 = h2client(server, stream_window=4 * MiB, conn_window=64 * MiB)
    (st,) = c0.wait(c0.connect_stream(FS + "GetFileStream", [get_req(str(warm))], server.token))
    stream_result(st, pb.FileChunk)
    c0.close()
    time.sleep(0.2)
    base = status_kib(server.proc.pid, "VmRSS")

    # the slow reader: 64 KiB stream window, credit given back late
    c = h2client(server, stream_window=64 * 1024, auto_ack=False)
    try:
        sid = c.connect_stream(FS + "GetFileStream", [get_req(str(big))], server.token)
        st = c.streams[sid]
        # read nothing for a while: a server ignoring flow control would
        # now pull the whole file into memory
        t_end = time.time() + 1.0
        while time.time() < t_end:
            c.pump(0.1)
        peak = status_kib(server.proc.pid, "VmRSS")
        assert len(st.body) <= 64 * 1024 + 5, "server sent beyond the flow-control window"
        last_sample = time.time()
        deadline = time.time() + 120
        while not st.done:
            assert time.time() < deadline, f"slow read did not finish ({len(st.body)} bytes)"
            if st.unacked >= 32 * 1024:
                time.sleep(0.002)
                c.ack(sid)
            c.pump(5)
            if time.time() - last_sample > 0.1:
                peak = max(peak, status_kib(server.proc.pid, "VmRSS"))
                last_sample = time.time()
        c.ack(sid)
        assert st.reset is None
        chunks, end = stream_result(st, pb.FileChunk)
        assert end == {}
        got = hashlib.sha256(b"".join(ch.content for ch in chunks)).hexdigest()
        assert got == want, "bytes differ"
        assert len(chunks) == 20
    finally:
        c.close()
    growth_mib = (peak - base) / 1024
    print(f"slow reader: base {base} KiB peak {peak} KiB growth {growth_mib:.1f} MiB")
    # the server may hold its output queue (4 MiB high-water) plus a read
    # chunk or two; a server ignoring flow control holds the whole 20 MiB
    assert growth_mib < 12, f"RSS grew by {growth_mib:.1f} MiB while a 20 MiB file was read slowly"


# ---------------------------------------------------------------- h2c upgrade (curl --http2)

def test_h2c_upgrade_health(server):
    r = curl("-v", "--http2", server.url + "/health")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert "HTTP/1.1 101" in err, err
    assert "< HTTP/2 200" in err, err
    assert r.stdout == b'{"status":"OK","message":"OK"}'


def test_h2c_upgrade_unary_with_body(server, tmp_path):
    (tmp_path / "a.txt").write_text("a")
    r = curl("-v", "--http2", server.url + FS + "ListFiles",
             "-H", "Content-Type: application/json", "-H", "Connect-Protocol-Version: 1",
             "-H", f"conch-init-token: {server.token}",
             "--data", json.dumps({"path": str(tmp_path)}))
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert "HTTP/1.1 101" in err and "< HTTP/2 200" in err, err
    body = json.loads(r.stdout)
    assert [e["name"] for e in body["entries"]] == ["a.txt"]
    assert body["entries"][0]["size"] == "1"


def test_h2c_upgrade_server_stream(server, tmp_path):
    p = tmp_path / "s.txt"
    p.write_bytes(b"streamed over an upgraded connection\n")
    body = H2Client.envelope(json.dumps({"filepath": str(p)}).encode())
    r = curl("-v", "--http2", server.url + FS + "GetFileStream",
             "-H", "Content-Type: application/connect+json",
             "-H", f"conch-init-token: {server.token}", "--data-binary", "@-", input=body)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert "HTTP/1.1 101" in err and "< HTTP/2 200" in err, err
    envs = H2Client.envelopes(r.stdout)
    assert envs[-1] == (2, b"{}")
    msgs = [json.loads(p_) for f, p_ in envs[:-1]]
    assert msgs == [{"filepath": str(p), "content": "c3RyZWFtZWQgb3ZlciBhbiB1cGdyYWRlZCBjb25uZWN0aW9uCg=="}]


def test_h2c_upgrade_then_more_requests_on_the_connection(server):
    """curl reuses the upgraded connection for a second URL."""
    r = curl("-v", "--http2", server.url + "/health", server.url + "/health")
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert err.count("HTTP/1.1 101") == 1, err
    assert err.count("< HTTP/2 200") == 2, err
    assert "Re-using existing connection" in err or "Reusing existing connection" in err, err
    assert r.stdout == b'{"status":"OK","message":"OK"}' * 2


@pytest.fixture(scope="module")
def quick_idle():
    """A server whose idle timer is 1.5 s."""
    yield from serve("h2-timers", env={"CONCH_HTTP_IDLE_MS": "1500"})


def test_idle_timer_never_cuts_a_response_still_going_out(quick_idle, tmp_path):
    """HTTP/2 with huge windows and a reader that stalls for more than twice
    the idle time mid-download: the stream's response is complete on the
    server side, its bytes still queued; the connection must stay up until
    every byte and END_STREAM are out."""
    data = os.urandom(8 * MiB)
    f = tmp_path / "slow.bin"
    f.write_bytes(data)
    body = envelope(pb.GetFileRequest(filepath=str(f)).SerializeToString())
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.connect(("127.0.0.1", quick_idle.port))
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    c.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 2**31 - 1})
    c.increment_flow_control_window(2**31 - 1 - 65535)
    c.send_headers(1, [(":method", "POST"), (":path", FS + "GetFileStream"), (":scheme", "http"),
                       (":authority", "x"), ("content-type", "application/connect+proto"),
                       ("conch-init-token", quick_idle.token)])
    c.send_data(1, body, end_stream=True)
    s.sendall(c.data_to_send())
    s.settimeout(10)
    got, paused, ended = b"", False, False
    while not ended:
        d = s.recv(65536)
        assert d, "connection closed under the response (%d bytes)" % len(got)
        for e in c.receive_data(d):
            if isinstance(e, h2.events.DataReceived):
                got += e.data
            elif isinstance(e, h2.events.StreamEnded):
                ended = True
        s.sendall(c.data_to_send())
        if not paused and len(got) >= 3 * MiB:
            paused = True
            time.sleep(3.5)
    s.close()
    envs = parse_envelopes(got)
    assert envs[-1] == (2, b"{}")
    assert b"".join(pb.FileChunk.FromString(p).content for fl, p in envs[:-1]) == data


def test_idle_timer_with_a_closed_stream_window(quick_idle, tmp_path):
    """A client whose stream window is 0: the download's service finishes at
    once and every byte waits in the stream's queue inside the server (none
    in the socket, nothing for the kernel to push).  The idle timer fires
    twice meanwhile; the connection must stay up because the response has
    not ended (no END_STREAM yet), and everything arrives once the client
    opens the window."""
    data = os.urandom(300 * 1024)
    f = tmp_path / "shut.bin"
    f.write_bytes(data)
    c = H2Client("127.0.0.1", quick_idle.port, stream_window=0)
    try:
        sid = c.connect_stream(FS + "GetFileStream", [pb.GetFileRequest(filepath=str(f)).SerializeToString()],
                               quick_idle.token)
        deadline = time.time() + 4.0  # > 2 idle times (1.5 s)
        while time.time() < deadline:
            c.pump(0.2)
            assert not c.closed and c.terminated is None, "connection cut while the response waits"
        st = c.streams[sid]
        assert st.status == 200 and st.body == b"" and not st.done
        c.conn.increment_flow_control_window(4 * MiB, stream_id=sid)
        c.flush()
        c.wait(sid, timeout=20)
    finally:
        c.close()
    envs = H2Client.envelopes(st.body)
    assert envs[-1] == (2, b"{}")
    assert b"".join(pb.FileChunk.FromString(p).content for _, p in envs[:-1]) == data


# ---------------------------------------------------------------- malformed requests
# RFC 9113 §8.1.1: a malformed request is a stream error of type
# PROTOCOL_ERROR.  nghttp2's HTTP messaging checks enforce these today
# (they cost ~2.5 k of the loop's ~20.7 k instructions per unary call); the
# tests pin the behaviour for whatever does the checking.

def _good(server, path=FS + "ListFiles", body=b'{"path":"/"}'):
    return [(":method", "POST"), (":scheme", "http"), (":authority", "x"), (":path", path),
            ("content-type", "application/json"), ("connect-protocol-version", "1"),
            ("conch-init-token", server.token)], body


def _bad_blocks(server):
    h, body = _good(server)
    regular = h[4:]
    return {
        "uppercase name": (h[:4] + [("Content-Type", "application/json")] + regular[1:], body),
        "space in a name": (h + [("x a", "1")], body),
        "missing :path": ([x for x in h if x[0] != ":path"], body),
        "missing :method": ([x for x in h if x[0] != ":method"], body),
        "unknown pseudo-header": (h + [(":foo", "bar")], body),
        "pseudo-header after a regular one": (h[:3] + regular + [h[3]], body),
        "duplicate :path": (h + [(":path", FS + "ListFiles")], body),
        "connection-specific header": (h + [("connection", "keep-alive")], body),
        "transfer-encoding": (h + [("transfer-encoding", "chunked")], body),
        "te other than trailers": (h + [("te", "gzip")], body),
        "CR LF in a value": (h + [("x-a", "a\r\nb: c")], body),
        "NUL in a value": (h + [("x-a", "a\x00b")], body),
        "content-length larger than the body": (h + [("content-length", str(len(body) + 10))], body),
        "content-length smaller than the body": (h + [("content-length", str(len(body) - 2))], body),
        "two different content-lengths": (h + [("content-length", str(len(body))), ("content-length", "3")], body),
        "neither :authority nor host": ([x for x in h if x[0] != ":authority"], body),
        "asterisk path without OPTIONS": ([(k, "*" if k == ":path" else v) for k, v in h], body),
        "leading space in a value": (h + [("x-a", " 1")], body),
    }


@pytest.mark.parametrize("case", ["uppercase name", "space in a name", "missing :path", "missing :method",
                                  "unknown pseudo-header", "pseudo-header after a regular one",
                                  "duplicate :path", "connection-specific header", "transfer-encoding",
                                  "te other than trailers", "CR LF in a value", "NUL in a value",
                                  "content-length larger than the body",
                                  "content-length smaller than the body", "two different content-lengths",
                                  "neither :authority nor host", "asterisk path without OPTIONS",
                                  "leading space in a value"])
def test_malformed_h2_request_is_reset(server, case):
    """Each malformed header block or body is refused with RST_STREAM
    PROTOCOL_ERROR before any service sees it; the connection lives on and
    serves a good request next."""
    hdrs, body = _bad_blocks(server)[case]
    c = H2Client("127.0.0.1", server.port, validate=False)
    try:
        sid = c.request_raw(hdrs, body)
        c.wait(sid, timeout=10)
        st = c.streams[sid]
        assert st.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR, (case, st.reset, st.status, bytes(st.body[:200]))
        assert st.status is None, (case, st.status)
        good, gbody = _good(server)
        sid2 = c.request_raw(good, gbody)
        c.wait(sid2, timeout=10)
        assert c.streams[sid2].status == 200, c.streams[sid2].body[:200]
        assert c.terminated is None
    finally:
        c.close()



def test_malformed_h2_requests_on_one_connection(server):
    """The server remembers, per connection, which HPACK-indexed fields it
    has checked (server/h2.c's memo): the checks that depend on the rest of
    the block (order, repeats, content-length against the body) must still
    run for every request.  All the malformed blocks, one after another on
    one connection whose good fields are indexed by then, are each reset,
    and good requests between them still succeed."""
    blocks = _bad_blocks(server)
    c = H2Client("127.0.0.1", server.port, validate=False)
    try:
        for case, (hdrs, body) in blocks.items():
            good, gbody = _good(server)
            sid = c.request_raw(good, gbody)
            c.wait(sid, timeout=10)
            assert c.streams[sid].status == 200, (case, c.streams[sid].reset)
            for _ in range(2):  # the second time its fields are indexed too
                sid = c.request_raw(hdrs, body)
                c.wait(sid, timeout=10)
                st = c.streams[sid]
                assert st.reset == h2.errors.ErrorCodes.PROTOCOL_ERROR, (case, st.reset, st.status)
        assert c.terminated is None
    finally:
        c.close()


@pytest.mark.parametrize("trailer", [[(":path", "/x")], [("X-Sum", "1")], [("connection", "close")]],
                         ids=["pseudo-header", "upper case", "connection-specific"])
def test_malformed_h2_trailers_reset_the_stream(server, trailer):
    """Request trailers are ignored, but malformed ones still make the
    request malformed (RFC 9113 8.1): the stream is reset, the connection
    goes on."""
    hdrs, body = _good(server)
    c = H2Client("127.0.0.1", server.port, validate=False)
    try:
        sid = c.request_raw(hdrs, body, end_stream=False)
        c.conn.send_headers(sid, [(k.encode(), v.encode()) for k, v in trailer], end_stream=True)
        c.flush()
        c.wait(sid, timeout=10)
        assert c.streams[sid].reset == h2.errors.ErrorCodes.PROTOCOL_ERROR, (c.streams[sid].status,)
        good, gbody = _good(server)
        sid2 = c.request_raw(good, gbody)
        c.wait(sid2, timeout=10)
        assert c.streams[sid2].status == 200
    finally:
        c.close()


def test_good_h2_trailers_are_accepted(server):
    hdrs, body = _good(server)
    c = H2Client("127.0.0.1", server.port, validate=False)
    try:
        sid = c.request_raw(hdrs, body, end_stream=False)
        c.conn.send_headers(sid, [(b"x-checksum", b"abc")], end_stream=True)
        c.flush()
        c.wait(sid, timeout=10)
        assert c.streams[sid].status == 200, (c.streams[sid].reset, bytes(c.streams[sid].body[:200]))
    finally:
        c.close()
