"""gRPC server reflection (api.md §9): `buf curl` with no schema (the buf CLI
from npm, tests/buf; `make test-deps` installs it) over Connect, gRPC and
gRPC-Web, and python3-grpcio's generic stubs with messages of
proto/reflection.proto (compiled here with protoc --python_out) for v1 and
v1alpha: every request kind, unknown names, several requests on one stream,
full duplex, the token."""
import json
import os
import queue
import socket
import subprocess
import sys
import time

import grpc
import pytest
from google.protobuf import descriptor_pb2

import agent_pb2
from conftest import ROOT

BUF = os.path.join(ROOT, "tests", "buf", "node_modules", ".bin", "buf")
GEN = os.path.join(ROOT, "build", "py")
subprocess.run(["protoc", f"--python_out={GEN}", "-Iproto", "proto/reflection.proto",
                "proto/reflection_v1alpha.proto"], cwd=ROOT, check=True)
sys.path.insert(0, GEN)
import reflection_pb2 as v1  # noqa: E402
import reflection_v1alpha_pb2 as v1alpha  # noqa: E402

PACKAGES = {"v1": v1, "v1alpha": v1alpha}
REFLECTION = ["grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"]
AGENT_SERVICES = sorted("pb." + s for s in agent_pb2.DESCRIPTOR.services_by_name)
NOT_FOUND = grpc.StatusCode.NOT_FOUND.value[0]


@pytest.fixture(scope="module")
def server(own_server):
    return own_server


@pytest.fixture()
def channel(server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()


def info(ch, pkg):
    m = PACKAGES[pkg]
    return ch.stream_stream(f"/grpc.reflection.{pkg}.ServerReflection/ServerReflectionInfo",
                            request_serializer=m.ServerReflectionRequest.SerializeToString,
                            response_deserializer=m.ServerReflectionResponse.FromString)


def ask(server, ch, pkg, reqs, token=True):
    md = [("conch-init-token", server.token)] if token else []
    return list(info(ch, pkg)(iter(reqs), metadata=md, timeout=20))


def plain(fdp):
    """fdp without json_name (protoc's descriptor sets carry it, the copy
    compiled into a _pb2 module does not)."""
    fdp = type(fdp).FromString(fdp.SerializeToString())

    def strip(msgs):
        for m in msgs:
            for f in list(m.field) + list(m.extension):
                f.ClearField("json_name")
            strip(m.nested_type)

    strip(fdp.message_type)
    for f in fdp.extension:
        f.ClearField("json_name")
    return fdp


def fdps(resp):
    return [descriptor_pb2.FileDescriptorProto.FromString(b) for b in resp.file_descriptor_response.file_descriptor_proto]


# ---------------------------------------------------------------- buf curl

def buf(server, *args, token=True, reflect_token=True, timeout=60):
    assert os.access(BUF, os.X_OK), f"{BUF} missing: run make test-deps"
    cmd = [BUF, "curl", *args]
    if token:
        cmd += ["-H", f"conch-init-token: {server.token}"]
    if reflect_token:
        cmd += ["--reflect-header", f"conch-init-token: {server.token}"]
    env = dict(os.environ, HOME=os.path.join(ROOT, "build", "buf-home"), BUF_CACHE_DIR=os.path.join(ROOT, "build", "buf-cache"))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def json_docs(text):
    """The JSON documents buf curl printed, one after another."""
    dec, out, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        doc, i = dec.raw_decode(text, i)
        out.append(doc)


PROTOCOLS = ["connect", "grpc", "grpcweb"]


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("rproto", ["grpc-v1", "grpc-v1alpha"])
def test_buf_list_services(server, protocol, rproto):
    r = buf(server, "--protocol", protocol, "--reflect-protocol", rproto, "--http2-prior-knowledge",
            "--list-services", server.url, token=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == sorted(REFLECTION + AGENT_SERVICES)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_buf_list_methods(server, protocol):
    r = buf(server, "--protocol", protocol, "--list-methods", server.url, token=False)
    assert r.returncode == 0, r.stderr
    want = [f"{s}/ServerReflectionInfo" for s in REFLECTION]
    for name, svc in agent_pb2.DESCRIPTOR.services_by_name.items():
        want += [f"pb.{name}/{m}" for m in svc.methods_by_name]
    assert sorted(r.stdout.split()) == sorted(want)
    assert "pb.ProcessService/StreamInput" in want and "pb.FileService/WatchDir" in want


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_buf_list_files(server, protocol, tmp_path):
    (tmp_path / "hello.txt").write_text("hello")
    r = buf(server, "--protocol", protocol, "-d", json.dumps({"path": str(tmp_path), "depth": 1}),
            f"{server.url}/pb.FileService/ListFiles")
    assert r.returncode == 0, r.stderr
    [doc] = json_docs(r.stdout)
    [e] = doc["entries"]
    assert (e["name"], e["path"], e["type"], e["size"]) == ("hello.txt", str(tmp_path / "hello.txt"), "file", "5")


@pytest.mark.parametrize("protocol", PROTOCOLS)
@pytest.mark.parametrize("rproto", ["grpc-v1", "grpc-v1alpha"])
def test_buf_start_process_stream(server, protocol, rproto):
    r = buf(server, "--protocol", protocol, "--reflect-protocol", rproto, "-d",
            json.dumps({"cmd": "sh", "args": ["-c", "echo hi; echo oops >&2; exit 3"]}),
            f"{server.url}/pb.ProcessService/StartProcess")
    assert r.returncode == 0, r.stderr
    docs = json_docs(r.stdout)
    assert "pid" in docs[0]["start"]
    data = [d["data"] for d in docs[1:-1]]
    assert {"stdout": "aGkK"} in data and {"stderr": "b29wcwo="} in data
    # the §6 fields exactly; the envelope's usage (api.md §9) is there too
    end = docs[-1]["end"]
    assert "usage" in end, end
    assert {k: v for k, v in end.items() if k != "usage"} == {
        "exitCode": 3, "exited": True, "status": "error", "error": "exit status 3"}


def test_buf_without_reflect_header_is_unauthenticated(server):
    # -H carries the token on the RPC itself; buf sends it on reflection
    # calls only with --reflect-header
    r = buf(server, "--list-services", server.url, reflect_token=False)
    assert r.returncode != 0
    assert "not authenticated" in r.stderr, r.stderr  # buf's words for unauthenticated
    # a call: buf reports the schema it could not get
    r = buf(server, f"{server.url}/pb.ProcessService/List", reflect_token=False)
    assert r.returncode != 0
    assert 'failed to find service named "pb.ProcessService"' in r.stderr, r.stderr
    r = buf(server, f"{server.url}/pb.ProcessService/List")
    assert r.returncode == 0, r.stderr
    assert json_docs(r.stdout) == [{}]


def test_buf_wrong_reflect_token(server):
    r = buf(server, "--list-services", "--reflect-header", "conch-init-token: nope", server.url,
            token=False, reflect_token=False)
    assert r.returncode != 0 and "not authenticated" in r.stderr, r.stderr


# ---------------------------------------------------------------- HTTP/1.1

def test_http1_bidi_is_505_and_closes(server):
    """Reflection is bidi: over HTTP/1.1 it is answered 505 with Connection:
    close before any other check, as connect-go and connect-es do (buf curl
    always uses HTTP/2 for reflection)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    body = b"\0\0\0\0\x02{}"
    s.sendall(b"POST /grpc.reflection.v1.ServerReflection/ServerReflectionInfo HTTP/1.1\r\n"
              b"Host: x\r\nContent-Type: application/connect+json\r\n"
              b"conch-init-token: " + server.token.encode() + b"\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break  # the server closed
        data += chunk
    s.close()
    head = data.split(b"\r\n\r\n")[0].lower()
    assert head.startswith(b"http/1.1 505 ")
    assert b"connection: close" in head


def test_http1_bidi_505_while_the_body_streams(server):
    """A client still sending (chunked, as a full-duplex client would) gets
    the 505 at once; the connection closes once its body is in, not over
    unread bytes (an RST could destroy the answer)."""
    s = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    s.sendall(b"POST /grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo HTTP/1.1\r\n"
              b"Host: x\r\nContent-Type: application/grpc-web+proto\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"7\r\n\0\0\0\0\x02\x3a\0\r\n")
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = s.recv(4096)
        assert chunk, "closed before the answer"
        head += chunk
    assert head.lower().startswith(b"http/1.1 505 ") and b"connection: close" in head.lower()
    time.sleep(0.3)
    s.sendall(b"7\r\n\0\0\0\0\x02\x3a\0\r\n0\r\n\r\n")  # still accepted: the server reads on
    rest = b""
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        rest += chunk
    s.close()
    assert (head + rest).endswith(b"505 bidi streams require HTTP/2\n")


# ---------------------------------------------------------------- grpcio, both packages

@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_list_services(server, channel, pkg):
    m = PACKAGES[pkg]
    [r] = ask(server, channel, pkg, [m.ServerReflectionRequest(host="h1", list_services="*")])
    assert r.WhichOneof("message_response") == "list_services_response"
    assert sorted(s.name for s in r.list_services_response.service) == sorted(REFLECTION + AGENT_SERVICES)
    assert r.valid_host == "h1"
    assert r.original_request == m.ServerReflectionRequest(host="h1", list_services="*")


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_file_by_filename(server, channel, pkg):
    m = PACKAGES[pkg]
    [r] = ask(server, channel, pkg, [m.ServerReflectionRequest(file_by_filename="agent.proto")])
    [f] = fdps(r)
    # the embedded descriptor is the one protoc gives agent.proto here, with json names
    assert plain(f) == descriptor_pb2.FileDescriptorProto.FromString(agent_pb2.DESCRIPTOR.serialized_pb)
    assert f.package == "pb" and [s.name for s in f.service] == ["ProcessService", "FileService", "NetworkService",
                                                             "AgentService"]
    [sp] = [mt for mt in f.message_type if mt.name == "StartProcessRequest"]
    assert {fl.name: fl.json_name for fl in sp.field}["stdin_open"] == "stdinOpen"
    for name, mod in (("reflection.proto", v1), ("reflection_v1alpha.proto", v1alpha)):
        [r] = ask(server, channel, pkg, [m.ServerReflectionRequest(file_by_filename=name)])
        [f] = fdps(r)
        assert plain(f) == descriptor_pb2.FileDescriptorProto.FromString(mod.DESCRIPTOR.serialized_pb)


def agent_symbols():
    """Every kind of name agent.proto declares, walked from its descriptor."""
    out = set()
    fd = agent_pb2.DESCRIPTOR

    def walk(msg):
        out.add(msg.full_name)
        out.update(f.full_name for f in msg.fields)
        out.update(o.full_name for o in msg.oneofs)
        for e in msg.enum_types:
            out.add(e.full_name)
            out.update(msg.full_name + "." + v.name for v in e.values)  # values sit beside their enum
        for n in msg.nested_types:
            walk(n)

    for msg in fd.message_types_by_name.values():
        walk(msg)
    for e in fd.enum_types_by_name.values():
        out.add(e.full_name)
        out.update("pb." + v.name for v in e.values)
    for s in fd.services_by_name.values():
        out.add(s.full_name)
        out.update(mm.full_name for mm in s.methods)
    return sorted(out)


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_file_containing_symbol(server, channel, pkg):
    m = PACKAGES[pkg]
    syms = agent_symbols()
    # the kinds are all there: services, methods, nested messages, enums, values, fields, oneofs
    for s in ("pb.ProcessService", "pb.FileService.ListFiles", "pb.StartProcessRequest.EnvEntry",
              "pb.EventType", "pb.EVENT_TYPE_CREATE", "pb.StartProcessRequest.cmd", "pb.ProcessEvent.event",
              "pb.FileEntry.MetadataEntry.key"):
        assert s in syms
    resps = ask(server, channel, pkg, [m.ServerReflectionRequest(file_containing_symbol=s) for s in syms])
    assert len(resps) == len(syms)
    for s, r in zip(syms, resps):
        assert r.original_request.file_containing_symbol == s
        assert [f.name for f in fdps(r)] == ["agent.proto"], s
    [r1, r2] = ask(server, channel, pkg, [m.ServerReflectionRequest(file_containing_symbol=s) for s in
                                          ("grpc.reflection.v1.ServerReflection.ServerReflectionInfo",
                                           "grpc.reflection.v1alpha.ExtensionRequest.extension_number")])
    assert [f.name for f in fdps(r1)] == ["reflection.proto"]
    assert [f.name for f in fdps(r2)] == ["reflection_v1alpha.proto"]


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_unknown_names_are_not_found(server, channel, pkg):
    m = PACKAGES[pkg]
    reqs = [
        m.ServerReflectionRequest(file_containing_symbol="pb.Nope"),
        m.ServerReflectionRequest(file_containing_symbol="pb.ProcessService.Nope"),
        m.ServerReflectionRequest(file_containing_symbol="pb"),  # a package is no symbol
        m.ServerReflectionRequest(file_containing_symbol=".pb.ProcessService"),
        m.ServerReflectionRequest(file_containing_symbol=""),
        m.ServerReflectionRequest(file_by_filename="nope.proto"),
        m.ServerReflectionRequest(file_by_filename="proto/agent.proto"),
        m.ServerReflectionRequest(file_containing_extension=m.ExtensionRequest(
            containing_type="pb.StartProcessRequest", extension_number=100)),
        m.ServerReflectionRequest(all_extension_numbers_of_type="pb.Nope"),
        m.ServerReflectionRequest(all_extension_numbers_of_type="pb.EventType"),  # an enum, not a message
    ]
    resps = ask(server, channel, pkg, reqs)
    assert len(resps) == len(reqs)
    for q, r in zip(reqs, resps):
        assert r.original_request == q
        assert r.WhichOneof("message_response") == "error_response", q
        assert r.error_response.error_code == NOT_FOUND
    assert resps[0].error_response.error_message == "symbol not found: pb.Nope"
    assert resps[5].error_response.error_message == "file not found: nope.proto"
    assert resps[7].error_response.error_message == "extension not found: pb.StartProcessRequest 100"
    assert resps[8].error_response.error_message == "type not found: pb.Nope"


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_all_extension_numbers(server, channel, pkg):
    m = PACKAGES[pkg]
    [r] = ask(server, channel, pkg, [m.ServerReflectionRequest(all_extension_numbers_of_type="pb.StartProcessRequest")])
    assert r.WhichOneof("message_response") == "all_extension_numbers_response"
    assert r.all_extension_numbers_response.base_type_name == "pb.StartProcessRequest"
    assert list(r.all_extension_numbers_response.extension_number) == []  # agent.proto declares none


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_many_requests_one_stream_in_order(server, channel, pkg):
    m = PACKAGES[pkg]
    kinds = [dict(list_services=""), dict(file_by_filename="agent.proto"),
             dict(file_containing_symbol="pb.Nope"), dict(file_containing_symbol="pb.FileService"),
             dict(all_extension_numbers_of_type="pb.FileEntry"),
             dict(file_containing_extension=m.ExtensionRequest(containing_type="pb.FileEntry", extension_number=5))]
    reqs = [m.ServerReflectionRequest(host=f"h{i}", **kinds[i % len(kinds)]) for i in range(60)]
    resps = ask(server, channel, pkg, reqs)
    assert [r.original_request for r in resps] == reqs
    assert [r.valid_host for r in resps] == [f"h{i}" for i in range(60)]
    assert [r.WhichOneof("message_response") for r in resps[:6]] == [
        "list_services_response", "file_descriptor_response", "error_response", "file_descriptor_response",
        "all_extension_numbers_response", "error_response"]


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_full_duplex(server, channel, pkg):
    """Each answer arrives while the request stream is still open: the next
    request is sent only once the previous answer is in."""
    m = PACKAGES[pkg]
    q = queue.Queue()

    def requests():
        for i in range(5):
            yield m.ServerReflectionRequest(host=str(i), file_containing_symbol="pb.ProcessService")
            assert q.get(timeout=10) == str(i)

    call = info(channel, pkg)(requests(), metadata=[("conch-init-token", server.token)], timeout=20)
    got = []
    for r in call:
        got.append(r.valid_host)
        q.put(r.valid_host)
    assert got == ["0", "1", "2", "3", "4"]
    assert call.code() == grpc.StatusCode.OK


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_empty_stream_and_no_kind(server, channel, pkg):
    m = PACKAGES[pkg]
    assert ask(server, channel, pkg, []) == []
    with pytest.raises(grpc.RpcError) as ei:
        ask(server, channel, pkg, [m.ServerReflectionRequest(host="x")])
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.details() == "invalid MessageRequest: no request kind set"


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_token_required(server, channel, pkg):
    m = PACKAGES[pkg]
    req = [m.ServerReflectionRequest(list_services="")]
    with pytest.raises(grpc.RpcError) as ei:
        ask(server, channel, pkg, req, token=False)
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ei.value.details() == "agent token is required"
    with pytest.raises(grpc.RpcError) as ei:
        list(info(channel, pkg)(iter(req), metadata=[("conch-init-token", "bad")], timeout=10))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ei.value.details() == "agent token is invalid"


# ---------------------------------------------------------------- a client that does not read

def test_requests_without_reading_are_bounded(server):
    """A client writes requests and never reads (its window held at 0): the
    server stops reading the stream once 4 MiB of answers wait, instead of
    queueing one ~9 KiB answer per 18-byte request (50 000 of them: ~450 MiB
    unbounded).  Then a smaller stream read after the fact gets every answer
    in order, and the server answers /health throughout."""
    import urllib.request
    from conftest import status_kib
    from h2conn import H2Client

    path = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
    one = v1.ServerReflectionRequest(file_by_filename="agent.proto").SerializeToString()
    rss0 = status_kib(server.proc.pid, "VmRSS")
    c = H2Client("127.0.0.1", server.port, stream_window=0, conn_window=64 * 1024 * 1024, auto_ack=False)
    try:
        sid = c.connect_stream(path, [one] * 50000, server.token, end_stream=False)
        deadline = time.time() + 3
        while time.time() < deadline:
            c.pump(0.1)
        grown = status_kib(server.proc.pid, "VmRSS") - rss0
        with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
            assert r.status == 200
        assert not c.streams[sid].done
    finally:
        c.close()
    assert grown < 64 * 1024, f"RSS grew by {grown} KiB"

    n = 700  # ~6 MiB of answers: past the 4 MiB mark, so input pauses and resumes
    c = H2Client("127.0.0.1", server.port, stream_window=0, conn_window=64 * 1024 * 1024, auto_ack=False)
    try:
        reqs = [v1.ServerReflectionRequest(host=str(i), file_by_filename="agent.proto") for i in range(n)]
        sid = c.connect_stream(path, [r.SerializeToString() for r in reqs], server.token)
        c.pump(1)
        c.conn.increment_flow_control_window(64 * 1024 * 1024, stream_id=sid)
        c.flush()
        c.auto_ack = True
        st = c.wait(sid, timeout=60)[0]
    finally:
        c.close()
    envs = H2Client.envelopes(st.body)
    assert envs[-1] == (2, b"{}")
    got = [v1.ServerReflectionResponse.FromString(p) for _, p in envs[:-1]]
    assert [r.valid_host for r in got] == [str(i) for i in range(n)]
    assert all(len(r.file_descriptor_response.file_descriptor_proto) == 1 for r in got)


@pytest.mark.parametrize("pkg", ["v1", "v1alpha"])
def test_connect_json_full_duplex(server, pkg):
    """Connect streaming with the JSON codec over HTTP/2: each envelope is
    answered before the next is sent, then the half-close ends the stream."""
    import base64
    from h2conn import H2Client

    c = H2Client("127.0.0.1", server.port)
    try:
        sid = c.connect_stream(f"/grpc.reflection.{pkg}.ServerReflection/ServerReflectionInfo", [], server.token,
                               ctype="application/connect+json", end_stream=False)
        asks = [{"host": "a", "fileContainingSymbol": "pb.FileService.Stat"},
                {"fileByFilename": "nope.proto"}, {"listServices": ""}]
        got = []
        for i, q in enumerate(asks):
            c.send(sid, H2Client.envelope(json.dumps(q).encode()))
            deadline = time.time() + 10
            while time.time() < deadline:
                try:
                    envs = H2Client.envelopes(c.streams[sid].body)
                except ValueError:  # an envelope still arriving
                    envs = []
                if len(envs) == i + 1:
                    break
                c.pump(0.1)
            assert len(envs) == i + 1 and not c.streams[sid].done
            got.append(json.loads(envs[i][1]))
        c.end(sid)
        st = c.wait(sid, timeout=10)[0]
    finally:
        c.close()
    assert c.streams[sid].headers["content-type"] == "application/connect+json"
    assert H2Client.envelopes(st.body)[-1] == (2, b"{}")
    assert [g["originalRequest"] for g in got] == asks
    assert got[0]["validHost"] == "a"
    [fd] = got[0]["fileDescriptorResponse"]["fileDescriptorProto"]
    assert descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(fd)).name == "agent.proto"
    assert got[1]["errorResponse"] == {"errorCode": 5, "errorMessage": "file not found: nope.proto"}
    assert len(got[2]["listServicesResponse"]["service"]) == 2 + len(AGENT_SERVICES)
