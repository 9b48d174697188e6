"""gRPC with python3-grpcio: generic stubs (no generated service code), the
token as metadata, status codes and messages in grpc-status/grpc-message."""
import hashlib
import os

import grpc
import pytest

import agent_pb2 as pb

FS = "/pb.FileService/"
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def server(own_server):
    return own_server  # this module's own conch-init (see conftest.own_server)


@pytest.fixture()
def channel(server):
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    grpc.channel_ready_future(ch).result(timeout=10)
    yield ch
    ch.close()


def stubs(ch):
    return {
        "list": ch.unary_unary(FS + "ListFiles", request_serializer=pb.ListFilesRequest.SerializeToString,
                               response_deserializer=pb.ListFilesResponse.FromString),
        "search": ch.unary_unary(FS + "SearchFiles", request_serializer=pb.SearchFilesRequest.SerializeToString,
                                 response_deserializer=pb.SearchFilesResponse.FromString),
        "get": ch.unary_stream(FS + "GetFileStream", request_serializer=pb.GetFileRequest.SerializeToString,
                               response_deserializer=pb.FileChunk.FromString),
        "post": ch.stream_unary(FS + "PostFileStream", request_serializer=pb.FileChunk.SerializeToString,
                                response_deserializer=pb.PostFilesResponse.FromString),
    }


def md(server):
    return [("conch-init-token", server.token)]


def test_list_files(server, channel, tmp_path):
    (tmp_path / "b.txt").write_text("bb")
    (tmp_path / "a").mkdir()
    res = stubs(channel)["list"](pb.ListFilesRequest(path=str(tmp_path)), metadata=md(server), timeout=10)
    assert [(e.name, e.type, e.is_directory) for e in res.entries] == [("a", "directory", True),
                                                                       ("b.txt", "file", False)]
    assert res.entries[1].size == 2
    assert res.entries[1].path == str(tmp_path / "b.txt")


def test_search_files(server, channel, tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.log").write_text("x")
    (tmp_path / "y.txt").write_text("y")
    res = stubs(channel)["search"](pb.SearchFilesRequest(path=str(tmp_path), pattern="*.log"), metadata=md(server))
    assert [e.path for e in res.entries] == [str(tmp_path / "d" / "x.log")]


def test_get_file_stream(server, channel, tmp_path):
    data = os.urandom(2 * MiB + 4)
    p = tmp_path / "big.bin"
    p.write_bytes(data)
    chunks = list(stubs(channel)["get"](pb.GetFileRequest(filepath=str(p)), metadata=md(server), timeout=30))
    assert [len(c.content) for c in chunks] == [MiB, MiB, 4]
    assert chunks[0].filepath == str(p) and chunks[1].filepath == "" and chunks[2].filepath == ""
    assert hashlib.sha256(b"".join(c.content for c in chunks)).digest() == hashlib.sha256(data).digest()


def test_post_file_stream(server, channel, tmp_path):
    data = os.urandom(MiB + 100)
    target = tmp_path / "sub" / "up.bin"
    chunks = [pb.FileChunk(filepath=str(target), content=data[:MiB]),
              pb.FileChunk(filepath=str(target), content=data[MiB:])]
    res = stubs(channel)["post"](iter(chunks), metadata=md(server), timeout=30)
    assert res.uploaded_count == 1
    assert [(e.name, e.path, e.type) for e in res.entries] == [("up.bin", str(target), "file")]
    assert target.read_bytes() == data


def test_not_found_status_and_message(server, channel, tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(grpc.RpcError) as ei:
        list(stubs(channel)["get"](pb.GetFileRequest(filepath=missing), metadata=md(server), timeout=10))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert ei.value.details() == f"file not found: {missing}"
    with pytest.raises(grpc.RpcError) as ei:
        stubs(channel)["list"](pb.ListFilesRequest(path=missing), metadata=md(server), timeout=10)
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert ei.value.details() == f"path not found: {missing}"


def test_error_message_with_non_ascii_and_percent(server, channel, tmp_path):
    """grpc-message is percent-encoded on the wire; the client decodes it."""
    missing = str(tmp_path / "é 100%.txt")
    with pytest.raises(grpc.RpcError) as ei:
        list(stubs(channel)["get"](pb.GetFileRequest(filepath=missing), metadata=md(server), timeout=10))
    assert ei.value.code() == grpc.StatusCode.NOT_FOUND
    assert ei.value.details() == f"file not found: {missing}"
    with pytest.raises(grpc.RpcError) as ei:
        stubs(channel)["list"](pb.ListFilesRequest(path="/tmp/é/../x"), metadata=md(server), timeout=10)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ei.value.details() == "filepath must be a normalized absolute guest path for list files"


@pytest.mark.parametrize("token,msg", [(None, "agent token is required"), ("wrong", "agent token is invalid")])
def test_unauthenticated(server, channel, token, msg):
    meta = [] if token is None else [("conch-init-token", token)]
    with pytest.raises(grpc.RpcError) as ei:
        stubs(channel)["list"](pb.ListFilesRequest(path="/"), metadata=meta, timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ei.value.details() == msg
    with pytest.raises(grpc.RpcError) as ei:
        list(stubs(channel)["get"](pb.GetFileRequest(filepath="/etc/hostname"), metadata=meta, timeout=10))
    assert ei.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert ei.value.details() == msg


def test_unknown_method_is_unimplemented(server, channel):
    stub = channel.unary_unary("/pb.FileService/NoSuchMethod",
                               request_serializer=pb.ListFilesRequest.SerializeToString,
                               response_deserializer=pb.ListFilesResponse.FromString)
    with pytest.raises(grpc.RpcError) as ei:
        stub(pb.ListFilesRequest(path="/"), metadata=md(server), timeout=10)
    assert ei.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_gzip_compressed_calls(server, tmp_path):
    """grpcio with channel-wide gzip: requests carry grpc-encoding: gzip."""
    (tmp_path / "z.txt").write_text("z" * 1000)
    ch = grpc.insecure_channel(f"127.0.0.1:{server.port}", compression=grpc.Compression.Gzip)
    try:
        res = stubs(ch)["list"](pb.ListFilesRequest(path=str(tmp_path)), metadata=md(server), timeout=10)
        assert [e.name for e in res.entries] == ["z.txt"]
        chunks = list(stubs(ch)["get"](pb.GetFileRequest(filepath=str(tmp_path / "z.txt")),
                                       metadata=md(server), timeout=10))
        assert b"".join(c.content for c in chunks) == b"z" * 1000
    finally:
        ch.close()


def test_many_calls_share_one_channel(server, channel, tmp_path):
    for i in range(20):
        (tmp_path / f"f{i:02}").write_bytes(os.urandom(1000 + i))
    lst = stubs(channel)["list"]
    get = stubs(channel)["get"]
    futs = [lst.future(pb.ListFilesRequest(path=str(tmp_path)), metadata=md(server), timeout=20) for _ in range(20)]
    for f in futs:
        assert len(f.result().entries) == 20
    for i in range(20):
        p = tmp_path / f"f{i:02}"
        got = b"".join(c.content for c in get(pb.GetFileRequest(filepath=str(p)), metadata=md(server), timeout=20))
        assert got == p.read_bytes()
