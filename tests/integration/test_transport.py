"""Transport behaviour on the one port: HTTP/1.1 (keep-alive, pipelining,
chunked both ways, 100-continue, HTTP/1.0), HTTP/2 by prior knowledge and by
h2c upgrade, the plain routes (/health, 404, 405), and client disconnects
in the middle of an upload."""
import json
import os
import socket
import struct
import time

import pytest

import agent_pb2 as pb
from conch import Client, curl, envelope, parse_envelopes
from files_util import temp_leftovers
from conftest import serve
from h2conn import H2Client

FS = "/pb.FileService/"
HEALTH = b'{"status":"OK","message":"OK"}'
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(own_server):
    return own_server  # this module's own conch-init (see conftest.own_server)


@pytest.fixture()
def cl(server):
    return Client(server.url, server.token)


def read_http1_responses(sock, n, timeout=10):
    """Read n complete HTTP/1.1 responses (Content-Length or chunked)."""
    sock.settimeout(timeout)
    buf = b""
    out = []

    def need(k):
        nonlocal buf
        while len(buf) < k:
            b = sock.recv(65536)
            if not b:
                raise EOFError(buf)
            buf += b

    while len(out) < n:
        while b"\r\n\r\n" not in buf:
            need(len(buf) + 1)
        head, buf = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        hdrs = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:])}
        status = int(lines[0].split(" ")[1])
        if "content-length" in hdrs:
            ln = int(hdrs["content-length"])
            need(ln)
            body, buf = buf[:ln], buf[ln:]
        else:
            assert hdrs.get("transfer-encoding") == "chunked", hdrs
            body = b""
            while True:
                while b"\r\n" not in buf:
                    need(len(buf) + 1)
                size_line, buf = buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                need(size + 2)
                body += buf[:size]
                assert buf[size:size + 2] == b"\r\n"
                buf = buf[size + 2:]
                if size == 0:
                    break
        out.append((status, hdrs, body))
    return out


def temp_files(d, pid):
    return temp_leftovers(str(d), pid)


def poll(cond, timeout=5.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


# ---------------------------------------------------------------- /health and plain routes

@pytest.mark.parametrize("flags", [[], ["--http2-prior-knowledge"], ["--http2"], ["--http1.0"]])
def test_health_every_transport(server, flags):
    r = curl("-i", *flags, server.url + "/health")
    assert r.returncode == 0, r.stderr
    head, _, body = r.stdout.rpartition(b"\r\n\r\n")
    assert body == HEALTH
    assert b"content-type: application/json" in head.lower()
    # the final status line (after a 101 for --http2)
    final = [l for l in head.split(b"\r\n") if l.startswith(b"HTTP/")][-1]
    assert final.split(b" ")[1] == b"200", head
    if "--http2" in flags:
        assert head.startswith(b"HTTP/1.1 101") and final.startswith(b"HTTP/2 "), head


def test_health_with_query_string(server):
    r = curl("-sS", server.url + "/health?probe=1")
    assert r.stdout == HEALTH


@pytest.mark.parametrize("flags", [[], ["--http2-prior-knowledge"]])
def test_unknown_path_is_404(server, flags):
    for path in ("/", "/nope", "/pb.FileService/Nope", "/pb.NoService/ListFiles", "/health/x",
                 "/pb.FileService/ListFiles/", "//pb.FileService/ListFiles"):
        r = curl("-o", "/dev/null", "-w", "%{http_code}", *flags, "-X", "POST",
                 "-H", "Content-Type: application/json", "-H", f"conch-init-token: {server.token}",
                 "--data", "{}", server.url + path)
        assert r.stdout == b"404", (path, r.stdout)


@pytest.mark.parametrize("flags", [[], ["--http2-prior-knowledge"]])
def test_rpc_routes_are_post_only(server, flags):
    for rpc in ("ListFiles", "SearchFiles", "GetFileStream", "PostFileStream"):
        r = curl("-i", *flags, server.url + FS + rpc)
        head = r.stdout.split(b"\r\n\r\n")[0].lower()
        assert head.split(b"\r\n")[0].split(b" ")[1] == b"405", head
        assert b"\r\nallow: post" in head


# ---------------------------------------------------------------- HTTP/1.1

def test_keep_alive_mixed_calls_on_one_connection(cl, tmp_path):
    target = tmp_path / "ka.bin"
    data = os.urandom(300_000)
    c = cl.conn()
    c.request("GET", "/health")
    r = c.getresponse()
    assert r.read() == HEALTH
    sock = c.sock
    st, body, _ = cl.unary(FS + "ListFiles", {"path": str(tmp_path)}, conn=c)
    assert (st, body) == (200, {})
    chunk = json.dumps({"filepath": str(target), "content": __import__("base64").b64encode(data).decode()})
    st, msgs, end = cl.stream(FS + "PostFileStream", [json.loads(chunk)], conn=c)
    assert st == 200 and end == {} and msgs[0]["uploadedCount"] == 1
    st, msgs, end = cl.stream(FS + "PostFileStream", [json.loads(chunk)], conn=c, chunked=True)
    assert st == 200 and end == {}
    st, raw_body, hdrs = cl.stream(FS + "GetFileStream", [{"filepath": str(target)}], conn=c, raw=True)
    assert hdrs["transfer-encoding"] == "chunked"
    envs = parse_envelopes(raw_body)
    assert envs[-1] == (2, b"{}")
    st, body, _ = cl.unary(FS + "ListFiles", {"path": str(tmp_path)}, conn=c)
    assert [e["name"] for e in body["entries"]] == ["ka.bin"]
    assert c.sock is sock, "the connection was not kept alive"
    c.close()


def test_pipelined_requests_answered_in_order(server, tmp_path):
    (tmp_path / "p.txt").write_text("p")
    tok = server.token.encode()
    body = json.dumps({"path": str(tmp_path)}).encode()
    req_list = (b"POST /pb.FileService/ListFiles HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Connect-Protocol-Version: 1\r\nconch-init-token: " + tok +
                b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    get_body = envelope(json.dumps({"filepath": str(tmp_path / "p.txt")}).encode())
    req_get = (b"POST /pb.FileService/GetFileStream HTTP/1.1\r\nHost: x\r\nContent-Type: application/connect+json\r\n"
               b"conch-init-token: " + tok + b"\r\nTransfer-Encoding: chunked\r\n\r\n" +
               b"%x\r\n" % len(get_body) + get_body + b"\r\n0\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + req_list + req_get + req_list +
                  b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n" + b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        res = read_http1_responses(s, 6)
    finally:
        s.close()
    assert [r[0] for r in res] == [200, 200, 200, 200, 404, 200]
    assert res[0][2] == HEALTH and res[5][2] == HEALTH
    assert [e["name"] for e in json.loads(res[1][2])["entries"]] == ["p.txt"]
    assert res[1][2] == res[3][2]
    envs = parse_envelopes(res[2][2])
    assert json.loads(envs[0][1])["content"] == "cA==" and envs[-1] == (2, b"{}")


def test_chunked_upload_in_small_pieces(server, tmp_path):
    """A chunked request body whose chunk boundaries cut envelopes anywhere."""
    target = tmp_path / "pieces.bin"
    data = os.urandom(200_000)
    msgs = [pb.FileChunk(filepath=str(target), content=data[i:i + 50_000]).SerializeToString()
            for i in range(0, len(data), 50_000)]
    stream = b"".join(envelope(m) for m in msgs)
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(b"POST /pb.FileService/PostFileStream HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/connect+proto\r\nconch-init-token: " + server.token.encode() +
                  b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        off, sizes = 0, [1, 2, 3, 4, 5, 6, 7, 8, 4093, 65536, 3]
        i = 0
        while off < len(stream):
            n = sizes[i % len(sizes)]
            piece = stream[off:off + n]
            s.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            off += n
            i += 1
        s.sendall(b"0\r\n\r\n")
        ((status, hdrs, body),) = read_http1_responses(s, 1)
    finally:
        s.close()
    assert status == 200
    envs = parse_envelopes(body)
    assert envs[-1] == (2, b"{}")
    assert pb.PostFilesResponse.FromString(envs[0][1]).uploaded_count == 1
    assert target.read_bytes() == data


def test_expect_100_continue_upload_with_curl(server, tmp_path):
    target = tmp_path / "cont.bin"
    data = os.urandom(2 * MiB)
    body = b"".join(envelope(pb.FileChunk(filepath=str(target), content=data[i:i + MiB]).SerializeToString())
                    for i in range(0, len(data), MiB))
    r = curl("-v", "-H", "Content-Type: application/connect+proto", "-H", f"conch-init-token: {server.token}",
             "-H", "Expect: 100-continue", "--data-binary", "@-", server.url + FS + "PostFileStream", input=body)
    err = r.stderr.decode(errors="replace")
    assert r.returncode == 0, err
    assert "HTTP/1.1 100 Continue" in err, err
    envs = parse_envelopes(r.stdout)
    assert envs[-1] == (2, b"{}")
    assert target.read_bytes() == data


def test_http10_request_is_answered_and_closed(server):
    s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        s.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        data = b""
        while True:
            b = s.recv(65536)
            if not b:
                break
            data += b
    finally:
        s.close()
    assert data.split(b"\r\n")[0].split(b" ")[1] == b"200"
    assert data.endswith(HEALTH)


def test_absolute_form_request_target(server, tmp_path):
    r = curl("-sS", "--request-target", f"http://127.0.0.1:{server.port}/health", server.url + "/health")
    assert r.stdout == HEALTH


@pytest.mark.parametrize("where", ["after-first-envelope", "inside-envelope", "inside-chunk-header"])
def test_http1_disconnect_mid_upload(server, tmp_path, where):
    target = tmp_path / "keep.txt"
    target.write_bytes(b"keep me\n")
    first = envelope(pb.FileChunk(filepath=str(target), content=os.urandom(100_000)).SerializeToString())
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(b"POST /pb.FileService/PostFileStream HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/connect+proto\r\nconch-init-token: " + server.token.encode() +
                  b"\r\nTransfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(first) + first + b"\r\n")
        assert poll(lambda: temp_files(tmp_path, server.proc.pid), 10), "the upload did not start"
        if where == "inside-envelope":
            nxt = envelope(pb.FileChunk(filepath=str(target), content=os.urandom(100_000)).SerializeToString())
            s.sendall(b"%x\r\n" % len(nxt) + nxt[:5000])
        elif where == "inside-chunk-header":
            s.sendall(b"1f")
        time.sleep(0.1)
    finally:
        s.close()
    assert poll(lambda: not temp_files(tmp_path, server.proc.pid), 5), temp_files(tmp_path, server.proc.pid)
    assert target.read_bytes() == b"keep me\n"
    assert os.listdir(tmp_path) == ["keep.txt"]


def test_content_length_upload_cut_short(server, tmp_path):
    """Content-Length promises more than arrives before the client leaves."""
    target = tmp_path / "short.txt"
    first = envelope(pb.FileChunk(filepath=str(target), content=b"abc").SerializeToString())
    s = socket.create_connection(("127.0.0.1", server.port))
    try:
        s.sendall(b"POST /pb.FileService/PostFileStream HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/connect+proto\r\nconch-init-token: " + server.token.encode() +
                  b"\r\nContent-Length: %d\r\n\r\n" % (len(first) + 1000) + first)
        assert poll(lambda: temp_files(tmp_path, server.proc.pid), 10)
    finally:
        s.close()
    assert poll(lambda: not os.listdir(tmp_path), 5), os.listdir(tmp_path)


# ---------------------------------------------------------------- HTTP/2 by prior knowledge

def test_h2_prior_knowledge_unary_and_streams(server, tmp_path):
    p = tmp_path / "h2.txt"
    p.write_bytes(b"over h2\n")
    r = curl("--http2-prior-knowledge", "-i", server.url + FS + "ListFiles",
             "-H", "Content-Type: application/json", "-H", "Connect-Protocol-Version: 1",
             "-H", f"conch-init-token: {server.token}", "--data", json.dumps({"path": str(tmp_path)}))
    head, _, body = r.stdout.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/2 200"), head
    assert [e["name"] for e in json.loads(body)["entries"]] == ["h2.txt"]
    c = H2Client("127.0.0.1", server.port)
    try:
        up = tmp_path / "up.txt"
        sid1 = c.connect_stream(FS + "GetFileStream", [json.dumps({"filepath": str(p)}).encode()], server.token,
                                ctype="application/connect+json")
        sid2 = c.connect_stream(FS + "PostFileStream",
                                [json.dumps({"filepath": str(up), "content": "aGk="}).encode(),
                                 json.dumps({"filepath": str(up), "content": "IHRoZXJl"}).encode()],
                                server.token, ctype="application/connect+json")
        s1, s2 = c.wait(sid1, sid2)
        e1 = H2Client.envelopes(s1.body)
        assert json.loads(e1[0][1]) == {"filepath": str(p), "content": "b3ZlciBoMgo="}
        assert e1[-1] == (2, b"{}")
        e2 = H2Client.envelopes(s2.body)
        assert json.loads(e2[0][1])["uploadedCount"] == 1 and e2[-1] == (2, b"{}")
        assert up.read_bytes() == b"hi there"
    finally:
        c.close()


def test_h2_request_body_with_content_length_and_padding_free_frames(server, tmp_path):
    """Unary proto over h2 with the body split into many tiny DATA frames."""
    (tmp_path / "x").write_text("x")
    body = pb.ListFilesRequest(path=str(tmp_path), depth=3).SerializeToString()
    c = H2Client("127.0.0.1", server.port)
    try:
        sid = c.request("POST", FS + "ListFiles",
                        c.connect_headers(server.token, "application/proto", {"content-length": str(len(body))}),
                        end_stream=False)
        for b in body:
            c.send(sid, bytes([b]))
        c.end(sid)
        (st,) = c.wait(sid)
        assert st.status == 200
        assert [e.name for e in pb.ListFilesResponse.FromString(bytes(st.body)).entries] == ["x"]
    finally:
        c.close()


# ---------------------------------------------------------------- review regressions

def _drain(s, quiet=0.5):
    s.settimeout(quiet)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return out + b"<EOF>"
            out += d
    except socket.timeout:
        return out


def test_h2c_upgrade_after_pipelined_request_keeps_reading(server):
    """The upgrade request parsed from held-back (pipelined) bytes: the
    connection must resume reading as HTTP/2 (a PING is answered)."""
    pre = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
    up = (b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
          b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n")
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + up + pre)
    r = _drain(s)
    assert b"101 Switching Protocols" in r
    s.sendall(b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"pingpong")
    r = _drain(s)
    s.close()
    assert b"\x00\x00\x08\x06\x01\x00\x00\x00\x00pingpong" in r


def _upgrade_download(port, token, path):
    """Send an h2c upgrade request for a proto download of path; returns the
    socket, the client-side h2 connection and what followed the 101 head."""
    import h2.config
    import h2.connection
    hc = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = hc.initiate_upgrade_connection()
    body = envelope(pb.GetFileRequest(filepath=path).SerializeToString())
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(("POST /pb.FileService/GetFileStream HTTP/1.1\r\nHost: x\r\n"
               "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
               "HTTP2-Settings: %s\r\nContent-Type: application/connect+proto\r\n"
               "conch-init-token: %s\r\nContent-Length: %d\r\n\r\n"
               % (settings.decode(), token, len(body))).encode() + body)
    s.settimeout(10)
    got = b""
    while b"\r\n\r\n" not in got:
        d = s.recv(65536)
        assert d, got
        got += d
    head, _, rest = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return s, hc, rest


def test_h2c_upgrade_waits_for_client_preface(server, tmp_path):
    """After the 101 the server sends nothing until the client's preface:
    curl 7.88 (Debian 12) fails with "connection buffer size is too small to
    store data following HTTP Upgrade response header" when a large answer
    (here a 4 MiB download, ready at once) shares a read with the 101."""
    import h2.events
    data = os.urandom(4 * MiB + 5)
    f = tmp_path / "up.bin"
    f.write_bytes(data)
    s, hc, rest = _upgrade_download(server.port, server.token, str(f))
    assert rest == b""
    s.settimeout(0.5)
    with pytest.raises(socket.timeout):
        early = s.recv(65536)
        raise AssertionError(f"{len(early)} bytes before the client preface")
    s.settimeout(30)
    s.sendall(hc.data_to_send())  # the preface and SETTINGS
    raw, ended = b"", False
    while not ended:
        d = s.recv(1 << 20)
        assert d, "connection closed before the stream ended"
        for ev in hc.receive_data(d):
            if isinstance(ev, h2.events.DataReceived):
                raw += ev.data
                hc.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, h2.events.StreamEnded):
                ended = True
        s.sendall(hc.data_to_send())
    s.close()
    envs = list(parse_envelopes(raw))
    assert envs[-1] == (2, b"{}")
    chunks = [pb.FileChunk.FromString(p) for _, p in envs[:-1]]
    assert len(chunks) == 5
    assert b"".join(c.content for c in chunks) == data


def test_h2c_upgrade_with_bad_settings_is_400(server):
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
              b"Upgrade: h2c\r\nHTTP2-Settings: !!\r\n\r\n")
    r = _drain(s, 2)
    s.close()
    assert r.startswith(b"HTTP/1.1 400 "), r[:100]
    assert b"101" not in r.split(b"\r\n")[0]


def test_head_response_has_no_body(server):
    """A HEAD answer carries headers only, so keep-alive stays in sync."""
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    r = _drain(s, 1)
    s.close()
    first, _, rest = r.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 405 ")
    assert rest.startswith(b"HTTP/1.1 200 OK"), rest[:80]
    assert rest.endswith(HEALTH)


# ---------------------------------------------------------------- timers (shortened)

@pytest.fixture(scope="module")
def quick_timers():
    """A server whose header timer is 1 s and idle timer 1.5 s."""
    yield from serve("transport-timers", env={"CONCH_HTTP_HEADER_MS": "1000", "CONCH_HTTP_IDLE_MS": "1500"})


def test_discarded_body_wait_is_bounded(quick_timers):
    """An early answer (404) while the client never sends the body it
    announced: the connection closes after the idle time, not never."""
    s = socket.create_connection(("127.0.0.1", quick_timers.port))
    s.sendall(b"POST /nope HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\nabc")
    t0 = time.time()
    s.settimeout(10)
    got = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    assert got.startswith(b"HTTP/1.1 404 ")
    assert 1.0 <= time.time() - t0 <= 6, time.time() - t0


def test_upgrade_body_wait_is_bounded(quick_timers):
    """An h2c upgrade request whose body never comes (buffered before auth)."""
    s = socket.create_connection(("127.0.0.1", quick_timers.port))
    s.sendall(b"POST /health HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\n"
              b"Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 100000\r\n\r\nabc")
    t0 = time.time()
    s.settimeout(10)
    assert s.recv(65536) == b""
    s.close()
    assert time.time() - t0 <= 6


def test_upgrade_without_client_preface_is_closed(quick_timers, tmp_path):
    """An upgraded client that never sends its preface holds nothing for
    long: the connection closes after the header time (1 s here)."""
    f = tmp_path / "never.bin"
    f.write_bytes(b"x" * 1000)
    t0 = time.time()
    s, _, rest = _upgrade_download(quick_timers.port, quick_timers.token, str(f))
    assert rest == b""
    s.settimeout(10)
    assert s.recv(65536) == b""
    s.close()
    assert 0.8 <= time.time() - t0 <= 6, time.time() - t0
    assert quick_timers.alive()


def test_idle_timer_never_cuts_a_response_still_going_out(quick_timers, tmp_path):
    """A reader that stalls for twice the idle time in the middle of an
    8 MiB download: the service has long finished and the rest of the
    response waits in the server's queue; the idle timer must not close the
    connection under it (long streams have no write timeout)."""
    data = os.urandom(8 * MiB)
    f = tmp_path / "slow.bin"
    f.write_bytes(data)
    body = envelope(pb.GetFileRequest(filepath=str(f)).SerializeToString())
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    s.connect(("127.0.0.1", quick_timers.port))
    s.sendall(b"POST /pb.FileService/GetFileStream HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/connect+proto\r\nconch-init-token: " + quick_timers.token.encode() +
              b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.settimeout(10)
    raw = b""
    while len(raw) < 1 * MiB:
        raw += s.recv(65536)
    time.sleep(3.5)  # > 2 x the 1.5 s idle timer
    while not raw.endswith(b"\r\n0\r\n\r\n"):
        d = s.recv(1 << 20)
        assert d, "connection closed under the response (%d bytes)" % len(raw)
        raw += d
    s.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    body, i = b"", 0
    while True:
        j = chunked.index(b"\r\n", i)
        n = int(chunked[i:j], 16)
        if n == 0:
            break
        body += chunked[j + 2:j + 2 + n]
        i = j + 2 + n + 2
    envs = parse_envelopes(body)
    assert envs[-1] == (2, b"{}")
    assert b"".join(pb.FileChunk.FromString(p).content for fl, p in envs[:-1]) == data


def test_connection_cap_refuses_then_recovers():
    """Past CONCH_MAX_CONNS open connections a new one is closed at once (and
    counted in the log); when one closes, new connections are served again."""
    gen = serve("transport-cap", env={"CONCH_MAX_CONNS": "3"})
    srv = next(gen)
    try:
        time.sleep(0.3)  # the fixture's own /health connection is gone by now
        held = []
        for _ in range(3):  # each one served, so each one counted
            h = socket.create_connection(("127.0.0.1", srv.port))
            h.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert _drain(h, 0.3).endswith(HEALTH)
            held.append(h)
        extra = socket.create_connection(("127.0.0.1", srv.port))
        extra.settimeout(5)
        extra.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            got = extra.recv(100)
        except ConnectionResetError:
            got = b""
        assert got == b"", got
        extra.close()
        held.pop().close()
        time.sleep(0.2)
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _drain(s, 1).endswith(HEALTH)
        s.close()
        for h in held:
            h.close()
        assert "connection limit reached max=3" in open(srv.log_path, errors="replace").read()
    finally:
        for _ in gen:
            pass


def test_request_input_budget_is_shared_and_bounded():
    """All calls together buffer at most CONCH_RX_BUDGET bytes of request
    input: a second large unary body that would pass it is refused with
    resource_exhausted while the first goes on; once the first is done the
    budget is free again."""
    gen = serve("transport-rx", env={"CONCH_RX_BUDGET": str(4 * MiB)})
    srv = next(gen)
    try:
        def start(n_announced, n_sent):
            s = socket.create_connection(("127.0.0.1", srv.port))
            s.sendall(b"POST /pb.FileService/ListFiles HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\n"
                      b"conch-init-token: " + srv.token.encode() +
                      b"\r\nContent-Length: %d\r\n\r\n" % n_announced + b"\0" * n_sent)
            return s
        first = start(3 * MiB, int(2.5 * MiB))
        time.sleep(0.3)
        second = start(3 * MiB, 1 * MiB)
        r = _drain(second, 2)
        assert r.startswith(b"HTTP/1.1 429 "), r[:200]
        assert b"too much request data buffered" in r
        second.close()
        first.close()
        time.sleep(0.3)
        c = Client(srv.url, srv.token)
        st, body, _ = c.unary(FS + "ListFiles", {"path": "/", "depth": 1})
        assert st == 200, body
    finally:
        for _ in gen:
            pass


def test_serve_removes_its_unix_init_socket_on_exit(tmp_path):
    """`serve --init-listen unix:PATH` creates the socket and removes it
    when stopped (SIGTERM), instead of leaving it for the next start."""
    from conftest import Server, sanitizer_report
    sock = str(tmp_path / "init.sock")
    srv = Server(name="init-sock", extra_args=["--init-listen", "unix:" + sock])
    try:
        assert os.path.exists(sock)
    finally:
        log = srv.stop()
    assert srv.proc.returncode == 0, log
    assert not os.path.exists(sock), log
    assert sanitizer_report(log) is None, log
