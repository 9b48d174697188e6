"""Files over plain HTTP (api.md §9 "Files over plain HTTP"): GET/HEAD
with validators, ranges and conditionals, PUT/POST written whole or not at
all, OPTIONS and CORS, JSON errors, the user's file-system identity, signed
URLs — driven with curl, wget, Python's urllib and http.client."""
import base64
import hashlib
import hmac
import http.client
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from conftest import ROOT, Server, sanitizer_report

sys.path.insert(0, os.path.join(ROOT, "tests", "tools"))
import initpeer  # noqa: E402

NOBODY = 65534


@pytest.fixture(scope="module")
def srv():
    s = Server(name="files_http")
    yield s
    text = s.stop()
    rep = sanitizer_report(text)
    assert rep is None, rep


@pytest.fixture()
def d():
    p = f"/tmp/conch-fh-{secrets.token_hex(4)}"
    os.makedirs(p)
    os.chmod(p, 0o755)
    yield p
    shutil.rmtree(p, ignore_errors=True)


def q(path, **kw):
    return "/files?" + urllib.parse.urlencode(dict(path=path, **kw))


def req(srv, method, target, headers=None, body=None, token=True):
    """One request with http.client → (status, headers dict (lower case), body)."""
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
    h = dict(headers or {})
    if token:
        h.setdefault("conch-init-token", srv.token)
    c.request(method, target, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    hd = {k.lower(): v for k, v in r.getheaders()}
    c.close()
    return r.status, hd, data


def curl(*args, check=True, input=None):
    r = subprocess.run(["curl", "-sS", *args], capture_output=True, input=input, timeout=120)
    if check:
        assert r.returncode == 0, r.stderr
    return r


def write(path, data, mode=0o644):
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def sign(token, method, path, user, expires):
    msg = f"{method}\n{path}\n{user}\n{expires}".encode()
    return base64.urlsafe_b64encode(hmac.new(token.encode(), msg, hashlib.sha256).digest()).rstrip(b"=").decode()


# ---------------------------------------------------------------- GET / HEAD

def test_get_headers_and_bytes(srv, d):
    data = os.urandom(300_000)
    write(f"{d}/f.bin", data)
    st, h, body = req(srv, "GET", q(f"{d}/f.bin"))
    assert st == 200 and body == data
    s = os.stat(f"{d}/f.bin")
    assert h["content-length"] == str(len(data))
    assert h["content-type"] == "application/octet-stream"
    assert h["accept-ranges"] == "bytes"
    assert h["etag"] == f'"{s.st_ino:x}-{s.st_size:x}-{s.st_mtime_ns:x}"'
    assert h["last-modified"] == time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(s.st_mtime))
    assert h["content-disposition"] == 'attachment; filename="f.bin"'
    assert h["access-control-allow-origin"] == "*"
    assert "ETag" in h["access-control-expose-headers"] and "Content-Range" in h["access-control-expose-headers"]
    st, h2, body = req(srv, "HEAD", q(f"{d}/f.bin"))
    assert st == 200 and body == b"" and h2["content-length"] == str(len(data)) and h2["etag"] == h["etag"]


def test_non_ascii_name(srv, d):
    write(f"{d}/résumé \"x\".txt", b"hi")
    st, h, body = req(srv, "GET", q(f"{d}/résumé \"x\".txt"))
    assert st == 200 and body == b"hi"
    assert h["content-disposition"] == \
        "attachment; filename=\"r__sum__ _x_.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9%20%22x%22.txt"


def test_ranges(srv, d):
    data = bytes(range(256)) * 40  # 10240
    write(f"{d}/r", data)
    n = len(data)
    for rng, a, b in (("bytes=10-19", 10, 19), ("bytes=10000-", 10000, n - 1), ("bytes=-100", n - 100, n - 1),
                      ("bytes=0-999999", 0, n - 1), ("bytes=-999999", 0, n - 1)):
        st, h, body = req(srv, "GET", q(f"{d}/r"), {"Range": rng})
        assert st == 206, rng
        assert h["content-range"] == f"bytes {a}-{b}/{n}", rng
        assert body == data[a:b + 1] and h["content-length"] == str(b - a + 1)
    for rng in ("bytes=10240-", "bytes=-0", "bytes=99999-100000"):
        st, h, body = req(srv, "GET", q(f"{d}/r"), {"Range": rng})
        assert st == 416, rng
        assert h["content-range"] == f"bytes */{n}"
        assert json.loads(body)["code"] == "out_of_range"
    for rng in ("bytes=0-1,5-6", "bytes=x-1", "items=0-1", "bytes=5-1"):  # the whole file
        st, h, body = req(srv, "GET", q(f"{d}/r"), {"Range": rng})
        assert st == 200 and body == data, rng


def test_conditionals(srv, d):
    write(f"{d}/c", b"0123456789")
    st, h, _ = req(srv, "GET", q(f"{d}/c"))
    etag, lm = h["etag"], h["last-modified"]
    st, h, body = req(srv, "GET", q(f"{d}/c"), {"If-None-Match": etag})
    assert (st, body) == (304, b"") and h["etag"] == etag and "content-length" not in h
    st, _, _ = req(srv, "GET", q(f"{d}/c"), {"If-None-Match": f'"other", W/{etag}'})
    assert st == 304
    st, _, body = req(srv, "GET", q(f"{d}/c"), {"If-None-Match": '"other"'})
    assert (st, body) == (200, b"0123456789")
    st, _, _ = req(srv, "GET", q(f"{d}/c"), {"If-Modified-Since": lm})
    assert st == 304
    st, _, _ = req(srv, "HEAD", q(f"{d}/c"), {"If-Modified-Since": "Sun, 06 Nov 1994 08:49:37 GMT"})
    assert st == 200
    # If-None-Match decides alone when both are there
    st, _, _ = req(srv, "GET", q(f"{d}/c"), {"If-None-Match": '"other"', "If-Modified-Since": lm})
    assert st == 200
    st, h, body = req(srv, "GET", q(f"{d}/c"), {"Range": "bytes=2-3", "If-Range": etag})
    assert (st, body) == (206, b"23")
    st, h, body = req(srv, "GET", q(f"{d}/c"), {"Range": "bytes=2-3", "If-Range": lm})
    assert (st, body) == (206, b"23")
    st, h, body = req(srv, "GET", q(f"{d}/c"), {"Range": "bytes=2-3", "If-Range": '"stale"'})
    assert (st, body) == (200, b"0123456789")


def test_curl_o_resume_wget_urllib_h2(srv, d):
    data = os.urandom(3_000_000)
    write(f"{d}/big", data)
    url = srv.url + q(f"{d}/big")
    tok = f"conch-init-token: {srv.token}"
    curl("-o", f"{d}/out1", "-H", tok, url)
    assert open(f"{d}/out1", "rb").read() == data
    write(f"{d}/out2", data[:1_234_567])
    curl("-C", "-", "-o", f"{d}/out2", "-H", tok, url)
    assert open(f"{d}/out2", "rb").read() == data
    curl("--http2-prior-knowledge", "-o", f"{d}/out3", "-H", tok, url)
    assert open(f"{d}/out3", "rb").read() == data
    r = subprocess.run(["wget", "-q", "-O", f"{d}/out4", "--header", tok, url], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert open(f"{d}/out4", "rb").read() == data
    with urllib.request.urlopen(urllib.request.Request(url, headers={"conch-init-token": srv.token})) as r:
        assert r.status == 200 and r.read() == data
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(srv.url + q(f"{d}/nope"))
    assert e.value.code == 401


def test_errors(srv, d):
    os.makedirs(f"{d}/sub")
    cases = [
        ("GET", q(f"{d}/nope"), 404, "not_found", f"file not found: {d}/nope"),
        ("GET", q(f"{d}/sub"), 400, "invalid_argument", f"path is a directory: {d}/sub"),
        ("PUT", q(f"{d}/sub"), 400, "invalid_argument", f"path is a directory: {d}/sub"),
        ("GET", "/files", 400, "invalid_argument", "filepath is required for http file download"),
        ("GET", f"/files?path={d}/../x", 400, "invalid_argument",
         "filepath must be a normalized absolute guest path for http file download"),
        ("GET", "/files?path=/tmp/%00x", 400, "invalid_argument", "filepath contains a NUL byte for http file download"),
        ("PUT", "/files?path=rel", 400, "invalid_argument",
         "filepath must be a normalized absolute guest path for http file upload"),
        ("GET", "/files?path=/tmp/%zz", 400, "invalid_argument", "invalid query: bad percent-encoding in path"),
        ("GET", "/files?path=/tmp/%ff", 400, "invalid_argument", "invalid query: path is not valid UTF-8"),
        ("GET", "/files?path=/a&path=/b", 400, "invalid_argument", "invalid query: path given more than once"),
    ]
    for method, target, status, code, msg in cases:
        st, h, body = req(srv, method, target, body=b"x" if method == "PUT" else None)
        assert st == status, (target, body)
        assert h["content-type"] == "application/json"
        assert json.loads(body) == {"code": code, "message": msg}, target
    st, h, body = req(srv, "GET", q(f"{d}/nope"), token=False)
    assert (st, json.loads(body)) == (401, {"code": "unauthenticated", "message": "agent token is required"})
    st, h, body = req(srv, "GET", q(f"{d}/nope"), {"conch-init-token": "wrong"})
    assert (st, json.loads(body)) == (401, {"code": "unauthenticated", "message": "agent token is invalid"})
    st, h, body = req(srv, "DELETE", q(f"{d}/nope"))
    assert st == 405 and h["allow"] == "GET, HEAD, PUT, POST, OPTIONS"
    assert json.loads(body)["code"] == "unimplemented"
    st, h, body = req(srv, "OPTIONS", "/files", token=False)
    assert st == 204 and body == b""
    assert h["access-control-allow-origin"] == "*"
    assert h["access-control-allow-methods"] == "GET, HEAD, PUT, POST"
    assert h["access-control-allow-headers"] == "content-type, range, conch-init-token, conch-init-user"
    assert h["access-control-max-age"] == "7200"
    assert srv.alive()


def test_special_files_stream(srv, d):
    os.mkfifo(f"{d}/fifo")
    p = subprocess.Popen(["sh", "-c", f"sleep 0.5; printf 'through a fifo' > {d}/fifo"])
    st, h, body = req(srv, "GET", q(f"{d}/fifo"))
    p.wait()
    assert (st, body) == (200, b"through a fifo") and "content-length" not in h
    # /dev/zero streams until the client leaves
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(f"GET {q('/dev/zero')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n\r\n".encode())
    got = 0
    while got < 8_000_000:
        b = s.recv(1 << 20)
        assert b
        got += len(b)
    s.close()
    st, _, body = req(srv, "GET", "/health", token=False)
    assert st == 200


def test_kernel_and_zero_size_files_stream_until_eof(srv, d):
    # a /proc file says 0 bytes and is read (in the pool) until EOF
    st, h, body = req(srv, "GET", q(f"/proc/{srv.proc.pid}/mountinfo"))
    assert st == 200 and "content-length" not in h and h.get("transfer-encoding") == "chunked"
    assert body == open(f"/proc/{srv.proc.pid}/mountinfo", "rb").read() and b" / " in body
    # a regular file that says 0 bytes (as FUSE files may) is not trusted to be
    # empty: streamed until EOF, never answered with Content-Length: 0
    write(f"{d}/empty", b"")
    st, h, body = req(srv, "GET", q(f"{d}/empty"))
    assert (st, body) == (200, b"") and "content-length" not in h and h.get("transfer-encoding") == "chunked"


# ---------------------------------------------------------------- PUT / POST

def test_put_created_replaced_modes(srv, d):
    data = os.urandom(2_500_000)
    st, h, body = req(srv, "PUT", q(f"{d}/new/deep/f"), body=data)
    assert st == 201 and json.loads(body) == {"path": f"{d}/new/deep/f", "size": len(data)}
    assert open(f"{d}/new/deep/f", "rb").read() == data
    assert os.stat(f"{d}/new/deep/f").st_mode & 0o7777 == 0o644
    assert os.stat(f"{d}/new/deep").st_mode & 0o7777 == 0o755
    os.chmod(f"{d}/new/deep/f", 0o600)
    st, h, body = req(srv, "POST", q(f"{d}/new/deep/f"), {"Content-Type": "text/plain"}, body=b"second")
    assert st == 200 and json.loads(body) == {"path": f"{d}/new/deep/f", "size": 6}
    assert open(f"{d}/new/deep/f", "rb").read() == b"second"
    assert os.stat(f"{d}/new/deep/f").st_mode & 0o7777 == 0o600
    # setuid and setgid bits, and the owner, stay on a replaced file
    for uid, mode in ((0, 0o4755), (NOBODY, 0o6750)):
        write(f"{d}/suid", b"old", mode)
        os.chown(f"{d}/suid", uid, uid)
        os.chmod(f"{d}/suid", mode)
        st, h, body = req(srv, "PUT", q(f"{d}/suid"), body=b"new")
        sb = os.stat(f"{d}/suid")
        assert (st, sb.st_mode & 0o7777, sb.st_uid, sb.st_gid) == (200, mode, uid, uid), oct(sb.st_mode)
    os.unlink(f"{d}/suid")
    st, h, body = req(srv, "PUT", q(f"{d}/empty"), body=b"")
    assert st == 201 and os.path.getsize(f"{d}/empty") == 0
    assert sorted(os.listdir(d)) == ["empty", "new"] and os.listdir(f"{d}/new/deep") == ["f"]


def test_put_with_curl_chunked_expect_h2(srv, d):
    data = os.urandom(1_500_000)
    write(f"{d}/src", data)
    tok = f"conch-init-token: {srv.token}"
    r = curl("-D", "-", "-T", f"{d}/src", "-H", tok, "-H", "Expect: 100-continue", srv.url + q(f"{d}/a"))
    assert b"HTTP/1.1 100 Continue" in r.stdout and b"HTTP/1.1 201 Created" in r.stdout
    assert open(f"{d}/a", "rb").read() == data
    r = curl("-T", "-", "-H", tok, srv.url + q(f"{d}/b"), input=data)  # stdin: chunked
    assert json.loads(r.stdout)["size"] == len(data) and open(f"{d}/b", "rb").read() == data
    r = curl("--http2-prior-knowledge", "-T", f"{d}/src", "-H", tok, "-w", "%{http_code}", srv.url + q(f"{d}/c"))
    assert r.stdout.endswith(b"201") and open(f"{d}/c", "rb").read() == data
    r = curl("--data-binary", f"@{d}/src", "-H", tok, "-H", "Content-Type: application/octet-stream",
             "-w", "%{http_code}", srv.url + q(f"{d}/c"))
    assert r.stdout.endswith(b"200")


def expect_100(srv, target, headers=""):
    """A PUT with Expect: 100-continue whose body is sent only after a
    100 → (what came before the body was sent, all that came)."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(f"PUT {target} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n{headers}"
              "Expect: 100-continue\r\nContent-Length: 5\r\n\r\n".encode())
    first = s.recv(65536)
    after = first
    if first.startswith(b"HTTP/1.1 100 "):
        s.sendall(b"hello")
        while not after.endswith(b"}"):
            b = s.recv(65536)
            if not b:
                break
            after += b
    s.close()
    return first, after


def test_expect_100_only_once_the_upload_is_accepted(srv, d):
    # nobody may not write in d: the final 403 comes without a 100 first
    first, after = expect_100(srv, q(f"{d}/no"), "conch-init-user: nobody\r\n")
    assert first.startswith(b"HTTP/1.1 403 "), first
    assert b"100 Continue" not in first and not os.path.exists(f"{d}/no")
    first, after = expect_100(srv, q(d))  # a directory: 400, no 100
    assert first.startswith(b"HTTP/1.1 400 "), first
    first, after = expect_100(srv, q(f"{d}/yes"))  # accepted: 100, then the body, then 201
    assert first.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), first
    assert b"HTTP/1.1 201 " in after and open(f"{d}/yes", "rb").read() == b"hello"


def test_cut_put_leaves_nothing(srv, d):
    for cut in (0, 1000, 700_000, 1_500_000):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"PUT {q(f'{d}/cut')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n"
                  f"Content-Length: 2000000\r\n\r\n".encode() + b"x" * cut)
        time.sleep(0.3)
        s.close()
    time.sleep(1)
    assert os.listdir(d) == []
    # an existing target stays as it was
    write(f"{d}/keep", b"old")
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(f"PUT {q(f'{d}/keep')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n"
              f"Transfer-Encoding: chunked\r\n\r\n100000\r\n".encode() + b"y" * 5000)
    time.sleep(0.3)
    s.close()
    time.sleep(1)
    assert os.listdir(d) == ["keep"] and open(f"{d}/keep", "rb").read() == b"old"


# ---------------------------------------------------------------- users

def test_as_nobody(srv, d):
    os.chmod(d, 0o777)
    st, h, body = req(srv, "PUT", q(f"{d}/mine/f"), {"conch-init-user": "nobody"}, body=b"n")
    assert st == 201, body
    for p in (f"{d}/mine", f"{d}/mine/f"):
        assert os.stat(p).st_uid == NOBODY, p
    st, h, body = req(srv, "PUT", q(f"{d}/q", username="nobody"), body=b"q")
    assert st == 201 and os.stat(f"{d}/q").st_uid == NOBODY
    write(f"{d}/secret", b"root only", 0o600)
    st, h, body = req(srv, "GET", q(f"{d}/secret"), {"conch-init-user": "nobody"})
    assert st == 403 and json.loads(body) == {"code": "permission_denied",
                                              "message": f"open file {d}/secret: permission denied"}
    st, h, body = req(srv, "GET", q(f"{d}/secret", username="nobody"))
    assert st == 403
    st, h, body = req(srv, "PUT", q("/root/conch-fh-nope"), {"conch-init-user": "nobody"}, body=b"x")
    assert st == 403 and not os.path.exists("/root/conch-fh-nope")
    st, h, body = req(srv, "GET", q(f"{d}/secret", username="no-such-user-x"))
    assert (st, json.loads(body)) == (400, {"code": "invalid_argument", "message": "unknown user: no-such-user-x"})
    st, h, body = req(srv, "GET", q(f"{d}/secret"))
    assert (st, body) == (200, b"root only")


# ---------------------------------------------------------------- signed URLs

def signed(token, method, path, user="", expires=None):
    expires = expires if expires is not None else int(time.time()) + 300
    kw = {"expires": expires, "signature": sign(token, method, path, user, expires)}
    if user:
        kw["username"] = user
    return q(path, **kw)


def test_signed_urls(srv, d):
    write(f"{d}/s", b"signed bytes")
    write(f"{d}/other", b"other")
    t = srv.token
    st, h, body = req(srv, "GET", signed(t, "GET", f"{d}/s"), token=False)
    assert (st, body) == (200, b"signed bytes")
    st, h, body = req(srv, "HEAD", signed(t, "GET", f"{d}/s"), token=False)
    assert st == 200 and h["content-length"] == "12"
    with urllib.request.urlopen(srv.url + signed(t, "GET", f"{d}/s")) as r:
        assert r.read() == b"signed bytes"
    st, h, body = req(srv, "PUT", signed(t, "PUT", f"{d}/up"), body=b"put", token=False)
    assert st == 201 and open(f"{d}/up", "rb").read() == b"put"
    st, h, body = req(srv, "POST", signed(t, "PUT", f"{d}/up"), body=b"post", token=False)
    assert st == 200 and open(f"{d}/up", "rb").read() == b"post"
    # a PUT signature is for one file: never a multipart upload of many files under it
    mp = mp_body("BND", [('name="a"; filename="x1"', b"1"), ('name="b"; filename="x2"', b"2")])
    ct = {"Content-Type": "multipart/form-data; boundary=BND"}
    st, h, body = req(srv, "POST", signed(t, "PUT", f"{d}/dir"), ct, body=mp, token=False)
    assert (st, json.loads(body)) == (403, {"code": "permission_denied", "message":
                                            "a signed URL uploads one file: multipart/form-data needs the token"})
    assert not os.path.exists(f"{d}/dir")
    st, h, body = req(srv, "PUT", signed(t, "PUT", f"{d}/mine", "nobody"), body=b"x", token=False)
    assert st == 403 and not os.path.exists(f"{d}/mine")  # d is root's 0755: nobody may not write

    def refused(method, target, msg, body=None):
        st, h, b = req(srv, method, target, body=body, token=False)
        assert (st, json.loads(b)) == (401, {"code": "unauthenticated", "message": msg}), target

    refused("GET", signed(t, "GET", f"{d}/s", expires=int(time.time()) - 5), "signature expired")
    good = signed(t, "GET", f"{d}/s")
    sig = urllib.parse.parse_qs(urllib.parse.urlparse(good).query)["signature"][0]
    exp = urllib.parse.parse_qs(urllib.parse.urlparse(good).query)["expires"][0]
    refused("GET", q(f"{d}/other", expires=exp, signature=sig), "signature mismatch")           # another path
    refused("GET", q(f"{d}/s", expires=exp, signature=sig, username="nobody"), "signature mismatch")  # user
    refused("PUT", good, "signature mismatch", body=b"x")                                       # method
    refused("GET", signed(t, "PUT", f"{d}/s"), "signature mismatch")                            # (both ways)
    refused("POST", signed(t, "GET", f"{d}/s"), "signature mismatch", body=b"x")
    refused("GET", q(f"{d}/s", expires=int(exp) + 1, signature=sig), "signature mismatch")       # expires
    for i in (0, len(sig) // 2, len(sig) - 1):                                                  # a changed byte
        bad = sig[:i] + ("A" if sig[i] != "A" else "B") + sig[i + 1:]
        refused("GET", q(f"{d}/s", expires=exp, signature=bad), "signature mismatch")
    refused("GET", q(f"{d}/s", expires=exp, signature=sig + "A"), "signature mismatch")
    refused("GET", q(f"{d}/s", expires="soon", signature=sig), "signature mismatch")
    refused("GET", signed("another-token", "GET", f"{d}/s"), "signature mismatch")


def test_signed_url_as_a_user(srv, d):
    os.chmod(d, 0o777)
    t = srv.token
    tok = f"conch-init-token: {t}"
    write(f"{d}/a.txt", b"a")
    r = curl("-F", f"f=@{d}/a.txt", "-H", tok, "-H", "conch-init-user: nobody", srv.url + q(f"{d}/mp"))
    assert json.loads(r.stdout)["files"][0]["path"] == f"{d}/mp/a.txt"
    assert os.stat(f"{d}/mp").st_uid == NOBODY and os.stat(f"{d}/mp/a.txt").st_uid == NOBODY
    r = curl("--http2-prior-knowledge", "-I", "-H", tok, srv.url + q(f"{d}/a.txt"))
    assert r.stdout.startswith(b"HTTP/2 200") and b"content-length: 1\r\n" in r.stdout
    st, h, body = req(srv, "PUT", signed(t, "PUT", f"{d}/n", "nobody"), body=b"x", token=False)
    assert st == 201 and os.stat(f"{d}/n").st_uid == NOBODY
    write(f"{d}/secret", b"s", 0o600)
    st, h, body = req(srv, "GET", signed(t, "GET", f"{d}/secret", "nobody"), token=False)
    assert st == 403


def test_replaced_token_voids_signed_urls(tmp_path):
    sock = str(tmp_path / "init.sock")
    s = Server(token="", extra_args=["--init-listen", "unix:" + sock], name="files_http-token")

    def set_token(tok):
        m = {"version": 1, "sandboxID": "sb-fh", "agentToken": tok,
             "network": {"guestIP": "192.168.100.21", "prefixLength": 24, "gateway": "192.168.100.2"}}
        resp, _ = initpeer.until_ready("unix:" + sock, m, 10)
        assert resp and json.loads(resp)["status"] == "ready", resp

    try:
        p = str(tmp_path / "f")
        write(p, b"data")
        tok1 = "first-" + secrets.token_hex(8)
        set_token(tok1)
        url = signed(tok1, "GET", p)
        st, _, body = req(s, "GET", url, token=False)
        assert (st, body) == (200, b"data")
        set_token("next-" + secrets.token_hex(8))
        st, _, body = req(s, "GET", url, token=False)
        assert (st, json.loads(body)["message"]) == (401, "signature mismatch")
    finally:
        text = s.stop()
        assert sanitizer_report(text) is None


# ---------------------------------------------------------------- multipart

def mp_body(boundary, parts):
    out = b""
    for disp, data in parts:
        out += f"--{boundary}\r\nContent-Disposition: form-data; {disp}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def test_multipart_with_curl(srv, d):
    a, b = os.urandom(3000), os.urandom(2_200_000)
    write(f"{d}/a.bin", a)
    write(f"{d}/b.bin", b)
    tok = f"conch-init-token: {srv.token}"
    r = curl("-F", f"one=@{d}/a.bin", "-F", f"two=@{d}/b.bin;filename=../x/y/two.bin", "-F", "field=value",
             "-H", tok, srv.url + q(f"{d}/up"))
    assert json.loads(r.stdout) == {"files": [{"path": f"{d}/up/a.bin", "size": 3000},
                                              {"path": f"{d}/up/two.bin", "size": len(b)}]}
    assert open(f"{d}/up/a.bin", "rb").read() == a and open(f"{d}/up/two.bin", "rb").read() == b
    assert sorted(os.listdir(f"{d}/up")) == ["a.bin", "two.bin"]
    r = curl("--http2-prior-knowledge", "-F", f"f=@{d}/a.bin;filename=h2.bin", "-H", tok, srv.url + q(f"{d}/up"))
    assert json.loads(r.stdout)["files"][0]["path"] == f"{d}/up/h2.bin"


@pytest.mark.parametrize("disp", ['name="f"; filename=".."', 'name="f"; filename="."', 'name="f"; filename=""',
                                  'name="f"; filename="a/"', 'name="f"; filename="/"',
                                  "name=\"f\"; filename*=UTF-8''a%00b"])
def test_multipart_bad_names(srv, d, disp):
    body = mp_body("BND", [(disp, b"data")])
    st, h, got = req(srv, "POST", q(f"{d}/m"), {"Content-Type": "multipart/form-data; boundary=BND"}, body=body)
    assert st == 400 and json.loads(got)["code"] == "invalid_argument", got
    assert json.loads(got)["message"].startswith("invalid file name in multipart body: ")
    assert os.listdir(d) == [] or os.listdir(f"{d}/m") == []


def test_multipart_bad_name_in_a_later_part_lists_what_was_written(srv, d):
    ct = {"Content-Type": "multipart/form-data; boundary=BND"}
    body = mp_body("BND", [('name="a"; filename="good.txt"', b"good"), ('name="b"; filename=".."', b"bad"),
                           ('name="c"; filename="after.txt"', b"after")])
    st, h, got = req(srv, "POST", q(f"{d}/m"), ct, body=body)
    assert (st, json.loads(got)) == (400, {"code": "invalid_argument",
                                           "message": 'invalid file name in multipart body: ".."',
                                           "files": [{"path": f"{d}/m/good.txt", "size": 4}]}), got
    assert os.listdir(f"{d}/m") == ["good.txt"]


def test_multipart_answer_is_in_the_memory_budget(d):
    """The list of written files grows with every part: it is held in the
    memory budget, so many parts with long names (escaped six-fold in the
    JSON) end in 429 instead of growing without bound."""
    s = Server(name="files_http-budget", env={"CONCH_MEM_BUDGET": str(4 << 20)})
    small = f"{d}/t"
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", small], check=True)
    try:
        name = "\x01" * 200
        parts = [(f'name="f"; filename="{name}{i:05d}"', b"") for i in range(3000)]
        body = mp_body("BND", parts)
        st, h, got = req(s, "POST", q(small), {"Content-Type": "multipart/form-data; boundary=BND"}, body=body)
        ans = json.loads(got)
        assert (st, ans["code"], ans["message"]) == (429, "resource_exhausted", "memory budget exhausted")
        assert 0 < len(ans["files"]) < 3000
        st, _, _ = req(s, "GET", "/health", token=False)
        assert st == 200
    finally:
        subprocess.run(["umount", small], check=True)
        text = s.stop()
        assert sanitizer_report(text) is None


def test_multipart_malformed_and_cut(srv, d):
    ct = {"Content-Type": "multipart/form-data; boundary=BND"}
    st, h, got = req(srv, "POST", q(f"{d}/m"), {"Content-Type": "multipart/form-data"}, body=b"x")
    assert (st, json.loads(got)["message"]) == (400, "invalid multipart body: missing or invalid boundary")
    whole = mp_body("BND", [('name="a"; filename="done.txt"', b"complete")])
    st, h, got = req(srv, "POST", q(f"{d}/m"), ct, body=whole[:-20])
    assert (st, json.loads(got)["message"]) == (400, "invalid multipart body: cut short")
    # a connection cut in the second part keeps the first file, nothing of the second
    body = mp_body("BND", [('name="a"; filename="first.txt"', b"first"),
                           ('name="b"; filename="second.bin"', b"z" * 3_000_000)])
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(f"POST {q(f'{d}/c')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n"
              f"Content-Type: multipart/form-data; boundary=BND\r\nContent-Length: {len(body)}\r\n\r\n".encode()
              + body[:1_500_000])
    deadline = time.time() + 10
    while time.time() < deadline and not os.path.exists(f"{d}/c/first.txt"):
        time.sleep(0.05)
    s.close()
    time.sleep(1)
    assert os.listdir(f"{d}/c") == ["first.txt"] and open(f"{d}/c/first.txt", "rb").read() == b"first"


def held_bytes(srv):
    st, _, body = req(srv, "GET", "/metrics", {"Accept": "text/plain"})
    assert st == 200
    return int(next(l for l in body.decode().splitlines() if l.startswith("conch_memory_budget_held_bytes ")).split()[1])


def test_zero_copy_client_leaves_and_slow_reader(srv, d):
    """HTTP/1.1 sends a sized file with sendfile: clients that stop reading
    hold no buffer in the agent (a copy through user space would hold a
    256 KiB chunk each, in the memory budget); one that leaves midway ends
    it."""
    with open(f"{d}/sparse", "wb") as f:
        f.truncate(64 << 20)
    assert held_bytes(srv) < 64 << 10
    socks = []
    for leave_after in (1 << 20, 20 << 20, 1 << 20, 1 << 20):
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        s.sendall(f"GET {q(f'{d}/sparse')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n\r\n".encode())
        got = 0
        while got < leave_after:
            b = s.recv(1 << 16)
            assert b
            got += len(b)
        socks.append(s)
    time.sleep(0.5)  # not reading: the kernel's buffers fill, the agent waits
    assert held_bytes(srv) < 256 << 10  # four stalled copies would hold >= 1 MiB
    st, _, _ = req(srv, "GET", "/health", token=False)
    assert st == 200
    for s in socks:
        s.close()
    st, h, body = req(srv, "GET", q(f"{d}/sparse"), {"Range": "bytes=-5"})
    assert (st, body) == (206, b"\0" * 5)
    st, h, body = req(srv, "GET", q(f"{d}/sparse"))
    assert st == 200 and len(body) == 64 << 20


# ---------------------------------------------------------------- a real browser

def png_encode(w, h, pixel):
    """An RGB PNG of w x h whose pixel (x, y) is pixel(x, y)."""
    import struct
    import zlib
    raw = b"".join(b"\0" + b"".join(bytes(pixel(x, y)) for x in range(w)) for y in range(h))

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def png_decode(data):
    """(w, h, rows of RGB(A) tuples) of an 8-bit RGB/RGBA non-interlaced PNG."""
    import struct
    import zlib
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, w = 8, b"", 0
    while pos < len(data):
        n, t = struct.unpack(">I4s", data[pos:pos + 8])
        d = data[pos + 8:pos + 8 + n]
        if t == b"IHDR":
            w, h, depth, ctype, _, _, inter = struct.unpack(">IIBBBBB", d)
            assert depth == 8 and ctype in (2, 6) and inter == 0, (depth, ctype, inter)
            bpp = 3 if ctype == 2 else 4
        elif t == b"IDAT":
            idat += d
        pos += 12 + n
    raw, stride, prev, rows, i = zlib.decompress(idat), w * bpp, bytearray(w * bpp), [], 0
    for _ in range(h):
        f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(line[k:k + 3]) for k in range(0, stride, bpp)])
        prev = line
    return w, h, rows


def test_chromium_shows_a_signed_png(srv, d):
    """Headless Chromium opens a page whose <img> is a signed URL of a PNG
    uploaded with PUT; its screenshot shows the image's four colours."""
    quad = {(0, 0): (220, 20, 60), (1, 0): (30, 144, 255), (0, 1): (50, 205, 50), (1, 1): (255, 215, 0)}
    png = png_encode(80, 80, lambda x, y: quad[(x // 40, y // 40)])
    st, _, _ = req(srv, "PUT", q(f"{d}/pic.png"), body=png)
    assert st == 201
    url = srv.url + signed(srv.token, "GET", f"{d}/pic.png")
    page = f"{d}/page.html"
    with open(page, "w") as f:
        f.write('<!doctype html><html><body style="margin:0;background:#fff">'
                f'<img src="{url.replace("&", "&amp;")}" style="position:absolute;left:10px;top:10px">'
                '</body></html>')
    shot, profile = f"{d}/shot.png", f"{d}/profile"
    r = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                        "--hide-scrollbars", "--force-device-scale-factor=1", "--window-size=200,200",
                        "--virtual-time-budget=3000", f"--screenshot={shot}", "file://" + page],
                       capture_output=True, timeout=120)
    assert os.path.exists(shot), r.stderr.decode(errors="replace")[-3000:]
    w, h, rows = png_decode(open(shot, "rb").read())
    assert (w, h) == (200, 200)

    def near(a, b):
        return all(abs(x - y) <= 3 for x, y in zip(a, b))
    for (qx, qy), colour in quad.items():
        for x, y in ((qx * 40 + 12, qy * 40 + 12), (qx * 40 + 45, qy * 40 + 45), (qx * 40 + 30, qy * 40 + 30)):
            assert near(rows[y][x], colour), ((x, y), rows[y][x], colour)
    assert near(rows[5][5], (255, 255, 255)) and near(rows[150][150], (255, 255, 255))


# ---------------------------------------------------------------- the docs, as written

def md_blocks(text, lang):
    out, cur = [], None
    for line in text.splitlines():
        if cur is None and line.strip() == f"```{lang}":
            cur = []
        elif cur is not None and line.strip() == "```":
            out.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def test_api_md_examples_run(srv, tmp_path):
    """docs/api.md's shell definitions, its /files examples (curl, the
    openssl signature) and its Python signed URL, and `frame` with a message
    far over the argument limit, run as written."""
    doc = open(os.path.join(ROOT, "docs", "api.md")).read()
    defs = md_blocks(doc, "sh")[0]
    assert defs.startswith("U=http://127.0.0.1:4064 TOKEN=my-token")
    defs = defs.replace("U=http://127.0.0.1:4064 TOKEN=my-token", f"U={srv.url} TOKEN={srv.token}", 1)
    sec = doc[doc.index("\n## Files over plain HTTP\n"):]
    sec = sec[:sec.index("\n## ", 5)]
    big = doc[doc.index("A message of any size goes through standard input"):]
    shells = md_blocks(sec, "sh") + md_blocks(big, "sh")[:1]
    with open(tmp_path / "notes.txt", "w") as f:
        f.write("hello\n")
    for i, block in enumerate(shells):
        r = subprocess.run(["bash", "-c", "set -eo pipefail\n" + defs + "\n" + block], cwd=tmp_path,
                           capture_output=True, timeout=60)
        assert r.returncode == 0, (block, r.stderr)
        want = [line[2:] for line in block.splitlines() if line.startswith("# {")]
        got = r.stdout.decode().splitlines()
        assert got[-len(want):] == want if want else True, (block, got)
        if "openssl" in block:
            assert r.stdout == b"hello\n", r.stdout
    assert open(tmp_path / "hostname", "rb").read() == open("/etc/hostname", "rb").read()
    assert open("/tmp/api-demo/numbers.copy").read() == open("/tmp/api-demo/numbers").read()
    [py] = md_blocks(sec, "python")
    env = dict(os.environ, CONCH_URL=srv.url, CONCH_TOKEN=srv.token)
    r = subprocess.run(["/usr/bin/python3", "-c", py], capture_output=True, env=env, timeout=60)
    assert r.returncode == 0 and r.stdout.decode().strip() == repr(open("/etc/hostname", "rb").read()), r


def test_help_names_docs_that_exist_and_unknown_command():
    from conftest import BIN
    r = subprocess.run([BIN, "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0
    import re
    docs = re.findall(r"(README\.md|docs/[\w/]+\.md)", r.stdout.decode())
    assert "docs/api.md" in docs and "boot.md" not in r.stdout.decode()
    for p in docs:
        assert os.path.exists(os.path.join(ROOT, p)), p
    r = subprocess.run([BIN, "bogus"], capture_output=True, timeout=30)
    assert r.returncode == 2 and r.stderr.decode().startswith('conch-init: unknown command "bogus"')


# ---------------------------------------------------------------- gzip

def test_gzip_both_ways(srv, d):
    import gzip
    data = b"".join(b"line %d\n" % i for i in range(300_000))
    write(f"{d}/t", data)
    tok = f"conch-init-token: {srv.token}"
    for extra in ([], ["--http2-prior-knowledge"]):
        r = curl(*extra, "--compressed", "-D", f"{d}/h", "-o", f"{d}/o", "-H", tok, srv.url + q(f"{d}/t"))
        head = open(f"{d}/h").read().lower()
        assert "content-encoding: gzip" in head and "vary: accept-encoding" in head and "\ncontent-length:" not in head
        assert open(f"{d}/o", "rb").read() == data
    st, h, body = req(srv, "GET", q(f"{d}/t"), {"Accept-Encoding": "gzip"})
    assert st == 200 and h["content-encoding"] == "gzip" and h["etag"].endswith('-gzip"') and h["vary"] == "Accept-Encoding"
    assert gzip.decompress(body) == data and len(body) < len(data) // 3
    st, h2, _ = req(srv, "GET", q(f"{d}/t"), {"Accept-Encoding": "gzip", "If-None-Match": h["etag"]})
    assert st == 304
    st, h3, body = req(srv, "GET", q(f"{d}/t"))
    assert "content-encoding" not in h3 and h3["etag"] != h["etag"] and h3["vary"] == "Accept-Encoding"
    st, h4, body = req(srv, "GET", q(f"{d}/t"), {"Accept-Encoding": "gzip", "Range": "bytes=0-9"})
    assert (st, body) == (206, data[:10]) and "content-encoding" not in h4  # a range: identity
    write(f"{d}/empty", b"")
    st, _, body = req(srv, "GET", q(f"{d}/empty"), {"Accept-Encoding": "gzip"})
    assert st == 200 and gzip.decompress(body) == b""
    os.mkfifo(f"{d}/fifo")
    p = subprocess.Popen(["sh", "-c", f"sleep 0.3; seq 1000 > {d}/fifo"])
    st, _, body = req(srv, "GET", q(f"{d}/fifo"), {"Accept-Encoding": "gzip"})
    p.wait()
    assert gzip.decompress(body) == subprocess.run(["seq", "1000"], capture_output=True).stdout
    # uploads: Content-Encoding gzip, whole and chunked
    z = gzip.compress(data)
    write(f"{d}/t.gz", z)
    st, _, body = req(srv, "PUT", q(f"{d}/u1"), {"Content-Encoding": "gzip"}, body=z)
    assert st == 201 and json.loads(body)["size"] == len(data) and open(f"{d}/u1", "rb").read() == data
    r = curl("-T", "-", "-H", "Content-Encoding: gzip", "-H", tok, srv.url + q(f"{d}/u2"), input=z + gzip.compress(b"more"))
    assert json.loads(r.stdout)["size"] == len(data) + 4 and open(f"{d}/u2", "rb").read() == data + b"more"
    st, _, body = req(srv, "PUT", q(f"{d}/u3"), {"Content-Encoding": "gzip"}, body=z[:-10])
    assert (st, json.loads(body)["message"]) == (400, "invalid gzip body") and not os.path.exists(f"{d}/u3")
    st, _, body = req(srv, "PUT", q(f"{d}/u4"), {"Content-Encoding": "br"}, body=b"x")
    assert (st, json.loads(body)) == (415, {"code": "invalid_argument", "message": "unsupported content encoding: br"})
    assert not os.path.exists(f"{d}/u4")


def test_out_of_space_is_507_and_leaves_nothing(srv, d):
    small = f"{d}/small"
    os.makedirs(small)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", small], check=True)
    try:
        write(f"{small}/keep", b"old")
        for target in (f"{small}/new", f"{small}/keep"):
            st, h, body = req(srv, "PUT", q(target), body=os.urandom(3_000_000))
            assert (st, json.loads(body)) == (507, {"code": "resource_exhausted", "message": "no space left on device"})
        assert os.listdir(small) == ["keep"] and open(f"{small}/keep", "rb").read() == b"old"
    finally:
        subprocess.run(["umount", small], check=True)
    # 507 comes from the error, not from words in a message: a path that
    # says "no space left on device" where nobody may write is still 403
    odd = f"{d}/x: no space left on device"
    os.makedirs(odd)
    st, h, body = req(srv, "PUT", q(f"{odd}/f"), {"conch-init-user": "nobody"}, body=b"x")
    assert (st, json.loads(body)["code"]) == (403, "permission_denied"), body


def test_readme_routes_opening_lines(srv, tmp_path):
    """The README's Routes section opens with a download and an upload by
    plain curl: both run as written (address, token and path put in)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    sec = text[text.index("\n## Routes\n"):]
    block = md_blocks(sec[:sec.index("\n## ", 5)], "sh")[0]
    lines = block.splitlines()
    assert len(lines) == 2 and "curl -o" in lines[0] and "curl -T" in lines[1]
    script = (block.replace("http://127.0.0.1:4064", srv.url).replace("$(cat build/run-token)", srv.token)
              .replace("/tmp/notes.txt", str(tmp_path / "up" / "notes.txt")))
    (tmp_path / "notes.txt").write_bytes(b"some notes\n")
    r = subprocess.run(["bash", "-c", "set -e\n" + script], cwd=tmp_path, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "hostname").read_bytes() == open("/etc/hostname", "rb").read()
    assert (tmp_path / "up" / "notes.txt").read_bytes() == b"some notes\n"


def test_file_shrinking_while_sent_cuts_the_answer(srv, d):
    """Content-Length was promised: a file truncated during the download
    ends the connection short of it, never with other bytes."""
    with open(f"{d}/shrink", "wb") as f:
        f.truncate(256 << 20)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.sendall(f"GET {q(f'{d}/shrink')} HTTP/1.1\r\nHost: x\r\nconch-init-token: {srv.token}\r\n\r\n".encode())
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200")
    time.sleep(0.3)
    os.truncate(f"{d}/shrink", 1 << 20)
    total = len(got)
    s.settimeout(30)
    while True:
        b = s.recv(1 << 20)
        if not b:
            break
        assert b.count(b"\0") == len(b)  # only the file's bytes
        total += len(b)
    s.close()
    assert total < (256 << 20)
    st, _, _ = req(srv, "GET", "/health", token=False)
    assert st == 200


def test_file_shrinking_while_sent_on_h2c_resets_only_its_stream(srv, d):
    """On HTTP/2 the answer cut short is its stream alone (RST_STREAM): the
    connection goes on and serves the next request."""
    from h2conn import H2Client
    with open(f"{d}/shrink2", "wb") as f:
        f.truncate(64 << 20)
    c = H2Client("127.0.0.1", srv.port, auto_ack=False)
    try:
        sid = c.request("GET", q(f'{d}/shrink2'), [("conch-init-token", srv.token)])
        deadline = time.time() + 10
        while c.streams[sid].status is None and time.time() < deadline:
            c.pump(0.2)
        assert c.streams[sid].status == 200
        os.truncate(f"{d}/shrink2", 1 << 20)
        deadline = time.time() + 30
        while not c.streams[sid].done and time.time() < deadline:
            c.ack(sid)
            c.pump(0.2)
        s = c.streams[sid]
        assert s.reset is not None and not s.ended  # reset, never ended as if whole
        assert len(s.body) < (64 << 20) and s.body.count(b"\0") == len(s.body)
        sid2 = c.request("GET", "/health")
        c.wait(sid2, timeout=10)
        assert c.streams[sid2].status == 200
    finally:
        c.close()
