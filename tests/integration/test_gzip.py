"""Response compression (api.md §9 "HTTP and protocol extras"): gzip when the
client accepts it (Accept-Encoding for Connect unary, Connect-Accept-Encoding
for Connect streaming, grpc-accept-encoding for gRPC and gRPC-Web) and the
message is at least 1 KiB; identity otherwise.  Over HTTP/1.1 and HTTP/2,
with curl (--compressed and raw headers), python's h2, http.client and
grpcio (gzip both ways)."""
import base64
import gzip
import hashlib
import json
import os

import grpc
import pytest

import agent_pb2 as pb
from conch import Client, curl, envelope, parse_envelopes
from h2conn import H2Client

FS = "/pb.FileService/"
SP = "/pb.ProcessService/StartProcess"
GZ_MIN = 1024
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(own_server):
    return own_server


@pytest.fixture(scope="module")
def big_dir(tmp_path_factory):
    """A directory whose listing is ~60 KiB of JSON (over the pool threshold)."""
    d = tmp_path_factory.mktemp("gzlist")
    for i in range(400):
        (d / f"file-{i:05d}.txt").write_text("x" * i)
    return str(d)


@pytest.fixture()
def client(server):
    return Client(server.url, server.token)


def gunzip_ok(data):
    assert data[:2] == b"\x1f\x8b", data[:16]
    return gzip.decompress(data)


def is_gzip(data):
    return data[:2] == b"\x1f\x8b"


def hdrs(server, ctype="application/json", extra=()):
    out = ["-H", f"Content-Type: {ctype}", "-H", "Connect-Protocol-Version: 1",
           "-H", f"conch-init-token: {server.token}"]
    for h in extra:
        out += ["-H", h]
    return out


def curl_call(server, path, body, *args, http2=False):
    """curl -D- … → (status, headers dict, body bytes)."""
    ver = ["--http2-prior-knowledge"] if http2 else []
    r = curl("-D", "-", *ver, *args, "--data-binary", body, server.url + path)
    assert r.returncode == 0, r.stderr
    head, _, rest = r.stdout.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    h = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        h[k.strip().lower()] = v.strip()
    return status, h, rest


# ------------------------------------------------------------ Connect unary

@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_unary_compressed_when_accepted(server, big_dir, http2):
    body = json.dumps({"path": big_dir, "depth": 1})
    st, h, plain = curl_call(server, FS + "ListFiles", body, *hdrs(server), http2=http2)
    assert st == 200 and "content-encoding" not in h
    assert len(plain) > 32 * 1024  # big enough to be deflated in the pool
    # raw: the bytes on the wire are gzip, with their own Content-Length
    st, h, raw = curl_call(server, FS + "ListFiles", body, *hdrs(server, extra=["Accept-Encoding: gzip"]),
                           http2=http2)
    assert st == 200 and h["content-encoding"] == "gzip"
    assert int(h["content-length"]) == len(raw) < len(plain) // 5
    assert gunzip_ok(raw) == plain
    # what curl --compressed offers ("deflate, gzip, br, zstd") picks gzip too
    st, h, dec = curl_call(server, FS + "ListFiles", body, "--compressed", *hdrs(server), http2=http2)
    assert st == 200 and h["content-encoding"] == "gzip"
    assert dec == plain
    assert len(json.loads(dec)["entries"]) == 400


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_unary_small_answer_stays_identity(server, tmp_path, http2):
    (tmp_path / "s").write_text("s")
    body = json.dumps({"path": str(tmp_path / "s")})
    st, h, raw = curl_call(server, FS + "Stat", body, *hdrs(server, extra=["Accept-Encoding: gzip"]),
                           http2=http2)
    assert st == 200 and len(raw) < GZ_MIN
    assert "content-encoding" not in h
    assert json.loads(raw)["entry"]["name"] == "s"


def test_unary_threshold_exactly(server, tmp_path, client):
    """A listing just under and just over 1 KiB (sizes found by trying)."""
    seen = set()
    for n in range(1, 12):
        (tmp_path / f"f{n:02d}").write_text("")
        st, plain, _ = client.unary(FS + "ListFiles", {"path": str(tmp_path)})
        size = len(json.dumps(plain, separators=(",", ":")))
        c = client.conn()
        c.request("POST", FS + "ListFiles", body=json.dumps({"path": str(tmp_path)}).encode(),
                  headers=client.headers({"Accept-Encoding": "gzip"}))
        r = c.getresponse()
        raw = r.read()
        c.close()
        enc = r.getheader("content-encoding")
        wire_len = len(gunzip_ok(raw)) if enc else len(raw)
        assert wire_len == size
        assert (enc == "gzip") == (size >= GZ_MIN), (size, enc)
        seen.add(enc)
    assert seen == {None, "gzip"}


@pytest.mark.parametrize("accept", [None, "identity", "br, zstd", "gzip;q=0", "x-gzip"])
def test_unary_not_accepted_gets_identity(server, big_dir, client, accept):
    extra = {"Accept-Encoding": accept} if accept else {}
    c = client.conn()
    c.request("POST", FS + "ListFiles", body=json.dumps({"path": big_dir}).encode(), headers=client.headers(extra))
    r = c.getresponse()
    raw = r.read()
    c.close()
    assert r.status == 200 and r.getheader("content-encoding") is None
    assert len(json.loads(raw)["entries"]) == 400


def test_unary_proto_codec(server, big_dir):
    req = pb.ListFilesRequest(path=big_dir).SerializeToString()
    st, h, raw = curl_call(server, FS + "ListFiles", req,
                           *hdrs(server, "application/proto", ["Accept-Encoding: gzip"]), http2=True)
    assert st == 200 and h["content-encoding"] == "gzip" and h["content-type"] == "application/proto"
    res = pb.ListFilesResponse.FromString(gunzip_ok(raw))
    assert len(res.entries) == 400


@pytest.mark.parametrize("http2", [False, True], ids=["h1", "h2"])
def test_unary_errors_identity(server, http2):
    """Errors are short JSON: sent as they are, status and body intact."""
    st, h, raw = curl_call(server, FS + "ListFiles", json.dumps({"path": "/nonexistent-gz"}),
                           *hdrs(server, extra=["Accept-Encoding: gzip"]), http2=http2)
    assert st == 404 and "content-encoding" not in h
    assert json.loads(raw) == {"code": "not_found", "message": "path not found: /nonexistent-gz"}
    st, h, raw = curl_call(server, FS + "ListFiles", "{}", "--compressed", "-H", "Content-Type: application/json",
                           "-H", "Connect-Protocol-Version: 1", http2=http2)
    assert st == 401 and json.loads(raw)["code"] == "unauthenticated"


def test_unary_gzip_both_ways(server, big_dir, client):
    """A gzip request (Content-Encoding) and a gzip answer on one call."""
    body = gzip.compress(json.dumps({"path": big_dir}).encode())
    c = client.conn()
    c.request("POST", FS + "ListFiles", body=body,
              headers=client.headers({"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}))
    r = c.getresponse()
    raw = r.read()
    c.close()
    assert r.status == 200 and r.getheader("content-encoding") == "gzip"
    assert len(json.loads(gunzip_ok(raw))["entries"]) == 400


# ------------------------------------------------------------ Connect streaming

OUT_CMD = {"cmd": "python3", "args": ["-c",
           "import sys\n"
           "for n in (10, 5000, 200000, 20, 70000, 3):\n"
           "    sys.stdout.write(chr(97 + n % 26) * n); sys.stdout.flush()\n"]}
OUT_EXPECT = b"".join(bytes([97 + n % 26]) * n for n in (10, 5000, 200000, 20, 70000, 3))


def check_stream(envs, compressed):
    """Events of a StartProcess stream: stdout joined, per-envelope flags as
    the threshold says; the end-of-stream message is never compressed."""
    out, kinds = b"", []
    assert envs[-1][0] == 2 and json.loads(envs[-1][1]) == {}
    for flags, p in envs[:-1]:
        if compressed and flags == 1:
            p = gunzip_ok(p)
            assert len(p) >= GZ_MIN
        else:
            assert flags == 0 and not is_gzip(p)
            if compressed:
                assert len(p) < GZ_MIN
        kinds.append(flags)
        ev = json.loads(p)
        if "data" in ev:
            out += base64.b64decode(ev["data"]["stdout"])
        if "end" in ev:
            assert ev["end"]["exited"] is True and "exitCode" not in ev["end"]
    assert out == OUT_EXPECT
    return kinds


@pytest.mark.parametrize("accept", [True, False], ids=["gzip", "identity"])
def test_stream_h1(server, client, accept):
    extra = {"Connect-Accept-Encoding": "gzip"} if accept else {}
    st, raw, h = client.stream(SP, [OUT_CMD], headers=extra, raw=True)
    assert st == 200
    assert h.get("connect-content-encoding") == ("gzip" if accept else None)
    kinds = check_stream(parse_envelopes(raw), accept)
    if accept:
        assert 1 in kinds and 0 in kinds  # the start event is small


@pytest.mark.parametrize("accept", [True, False], ids=["gzip", "identity"])
def test_stream_h2(server, accept):
    c = H2Client("127.0.0.1", server.port, conn_window=16 * MiB)
    try:
        extra = {"connect-accept-encoding": "gzip"} if accept else {}
        sid = c.connect_stream(SP, [json.dumps(OUT_CMD).encode()], server.token,
                               ctype="application/connect+json", extra=extra)
        c.wait(sid, timeout=60)
        s = c.streams[sid]
        assert s.status == 200
        assert s.headers.get("connect-content-encoding") == ("gzip" if accept else None)
        check_stream(c.envelopes(s.body), accept)
    finally:
        c.close()


def test_stream_download_json_and_proto(server, client, tmp_path):
    """GetFileStream: JSON chunks (1 MiB of content, base64) and proto
    chunks alike are deflated in the pool, in order; without gzip the
    proto chunks go as they are."""
    data = (b"conch " * 600000)[:3 * MiB + 17]
    p = tmp_path / "big.txt"
    p.write_bytes(data)
    st, raw, h = client.stream(FS + "GetFileStream", [{"filepath": str(p)}],
                               headers={"Connect-Accept-Encoding": "gzip"}, raw=True)
    assert st == 200 and h["connect-content-encoding"] == "gzip"
    envs = parse_envelopes(raw)
    assert envs[-1] == (2, b"{}")
    # three 1 MiB chunks, then 17 bytes of content: under 1 KiB, identity
    assert [f for f, _ in envs[:-1]] == [1, 1, 1, 0], [(f, len(pl)) for f, pl in envs]
    assert len(raw) < len(data) // 20
    got = b"".join(base64.b64decode(json.loads(gunzip_ok(pl) if f else pl)["content"]) for f, pl in envs[:-1])
    assert got == data
    st, raw, h = client.stream(FS + "GetFileStream", [pb.GetFileRequest(filepath=str(p)).SerializeToString()],
                               headers={"Connect-Accept-Encoding": "gzip"}, json_codec=False, raw=True)
    assert st == 200 and h["connect-content-encoding"] == "gzip"
    envs = parse_envelopes(raw)
    assert envs[-1][0] == 2
    assert [f for f, _ in envs[:-1]] == [1, 1, 1, 0], [(f, len(pl)) for f, pl in envs]
    assert len(raw) < len(data) // 20
    assert b"".join(pb.FileChunk.FromString(gunzip_ok(pl) if f else pl).content for f, pl in envs[:-1]) == data
    st, raw, h = client.stream(FS + "GetFileStream", [pb.GetFileRequest(filepath=str(p)).SerializeToString()],
                               json_codec=False, raw=True)
    envs = parse_envelopes(raw)
    assert st == 200 and "connect-content-encoding" not in h
    assert all(f == 0 for f, _ in envs[:-1]) and len(raw) > len(data)
    assert b"".join(pb.FileChunk.FromString(pl).content for _, pl in envs[:-1]) == data


def test_stream_error_end_identity(server, client):
    st, raw, h = client.stream(FS + "GetFileStream", [{"filepath": "/nonexistent-gz"}],
                               headers={"Connect-Accept-Encoding": "gzip"}, raw=True)
    envs = parse_envelopes(raw)
    assert envs == [(2, envs[0][1])]
    assert json.loads(envs[0][1])["error"]["code"] == "not_found"


# ------------------------------------------------------------ gRPC and gRPC-Web (raw)

def grpc_headers(server, ctype, accept):
    h = {"content-type": ctype, "te": "trailers", "conch-init-token": server.token}
    if accept:
        h["grpc-accept-encoding"] = accept
    return h


@pytest.mark.parametrize("accept", ["identity,deflate,gzip", None], ids=["gzip", "identity"])
def test_grpc_h2_raw(server, big_dir, accept):
    c = H2Client("127.0.0.1", server.port, conn_window=16 * MiB)
    try:
        body = envelope(pb.ListFilesRequest(path=big_dir).SerializeToString())
        sid = c.request("POST", FS + "ListFiles", grpc_headers(server, "application/grpc", accept), body)
        c.wait(sid, timeout=30)
        s = c.streams[sid]
        assert s.status == 200 and s.trailers.get("grpc-status") == "0"
        (flags, payload), = c.envelopes(s.body)
        if accept:
            assert s.headers["grpc-encoding"] == "gzip" and flags == 1
            payload = gunzip_ok(payload)
        else:
            assert "grpc-encoding" not in s.headers and flags == 0
        assert len(pb.ListFilesResponse.FromString(payload).entries) == 400
        # an error: trailers only, nothing compressed
        sid = c.request("POST", FS + "ListFiles", grpc_headers(server, "application/grpc", accept),
                        envelope(pb.ListFilesRequest(path="/nonexistent-gz").SerializeToString()))
        c.wait(sid, timeout=30)
        s = c.streams[sid]
        assert s.headers.get("grpc-status") == "5" and not s.body
    finally:
        c.close()


@pytest.mark.parametrize("accept", ["gzip", None], ids=["gzip", "identity"])
def test_grpc_web_h1(server, client, big_dir, accept):
    c = client.conn()
    h = {"Content-Type": "application/grpc-web+proto", "conch-init-token": server.token}
    if accept:
        h["grpc-accept-encoding"] = accept
    c.request("POST", FS + "ListFiles", body=envelope(pb.ListFilesRequest(path=big_dir).SerializeToString()),
              headers=h)
    r = c.getresponse()
    raw = r.read()
    c.close()
    envs = parse_envelopes(raw)
    assert envs[-1] == (0x80, b"grpc-status: 0\r\n")  # the trailer frame: never compressed
    (flags, payload), = envs[:-1]
    assert r.getheader("grpc-encoding") == ("gzip" if accept else None)
    if accept:
        assert flags == 1
        payload = gunzip_ok(payload)
    else:
        assert flags == 0
    assert len(pb.ListFilesResponse.FromString(payload).entries) == 400


def test_grpc_web_small_and_error(server, client, tmp_path):
    (tmp_path / "s").write_text("s")
    for req, want in ((pb.StatRequest(path=str(tmp_path / "s")), "0"), (pb.StatRequest(path="/nonexistent-gz"), "5")):
        c = client.conn()
        c.request("POST", FS + "Stat", body=envelope(req.SerializeToString()),
                  headers={"Content-Type": "application/grpc-web+proto", "conch-init-token": server.token,
                           "grpc-accept-encoding": "gzip"})
        r = c.getresponse()
        envs = parse_envelopes(r.read())
        c.close()
        assert envs[-1][0] == 0x80 and envs[-1][1].startswith(f"grpc-status: {want}\r\n".encode())
        assert all(f == 0 for f, _ in envs[:-1])  # a small answer is identity
        assert len(envs) == (2 if want == "0" else 1)


# ------------------------------------------------------------ grpcio, gzip both ways

@pytest.fixture()
def gz_channel(server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}", compression=grpc.Compression.Gzip)
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()


def md(server):
    return [("conch-init-token", server.token)]


def test_grpcio_unary_gzip(server, gz_channel, big_dir):
    list_files = gz_channel.unary_unary(FS + "ListFiles", request_serializer=pb.ListFilesRequest.SerializeToString,
                                        response_deserializer=pb.ListFilesResponse.FromString)
    res = list_files(pb.ListFilesRequest(path=big_dir), metadata=md(server), timeout=20)
    assert len(res.entries) == 400
    res, call = list_files.with_call(pb.ListFilesRequest(path=big_dir), metadata=md(server), timeout=20,
                                     compression=grpc.Compression.Gzip)
    assert len(res.entries) == 400 and call.code() == grpc.StatusCode.OK
    with pytest.raises(grpc.RpcError) as e:
        list_files(pb.ListFilesRequest(path="/nonexistent-gz"), metadata=md(server), timeout=20)
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert e.value.details() == "path not found: /nonexistent-gz"


def test_grpcio_server_stream_gzip(server, gz_channel, tmp_path):
    data = os.urandom(256 * 1024) + b"z" * (2 * MiB)
    p = tmp_path / "d.bin"
    p.write_bytes(data)
    get = gz_channel.unary_stream(FS + "GetFileStream", request_serializer=pb.GetFileRequest.SerializeToString,
                                  response_deserializer=pb.FileChunk.FromString)
    chunks = list(get(pb.GetFileRequest(filepath=str(p)), metadata=md(server), timeout=30))
    assert hashlib.sha256(b"".join(c.content for c in chunks)).digest() == hashlib.sha256(data).digest()
    start = gz_channel.unary_stream(SP, request_serializer=pb.StartProcessRequest.SerializeToString,
                                    response_deserializer=pb.ProcessEvent.FromString)
    evs = list(start(pb.StartProcessRequest(cmd=OUT_CMD["cmd"], args=OUT_CMD["args"]), metadata=md(server),
                     timeout=30, compression=grpc.Compression.Gzip))
    assert b"".join(e.data.stdout for e in evs if e.HasField("data")) == OUT_EXPECT
    assert evs[-1].end.exited and evs[-1].end.exit_code == 0
