"""A conch-init sandbox in Linux namespaces, for tests and the boot benchmark.

Builds what a microVM would have, from this machine's own binaries:
  * a boot root (the "initramfs"): /sbin/conch-init and its shared libraries;
  * two erofs layer images on loop devices (mkfs.erofs, losetup): the base
    layer (a shell and a few tools with their libraries, /etc/passwd, …) and
    a newer top layer (an /etc/conch/entrypoint, the envd feature flag, a file
    that shadows one of the base layer);
  * an ext4 image on a loop device as the writable layer;
then starts conch-init as PID 1 with `unshare -pfmn --mount-proc chroot ROOT
/sbin/conch-init conch.layers=… conch.disk=… conch.init_listen=…` (argv words
are the documented stand-in for the kernel command line), moves one end of a
veth pair into its network namespace as eth0 and keeps the other end in a
private peer namespace (10.77.0.1/24) from which the API is reached.  Nothing
is configured in the machine's own network namespace.

Everything is undone by close(): PID 1 killed (its namespaces and mounts go
with it), loop devices detached, the peer namespace deleted, files removed.
"""
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import initpeer  # noqa: E402

GUEST_IP, GATEWAY, PREFIX = "10.77.0.2", "10.77.0.1", 24
TOOLS = ["sh", "cat", "echo", "sleep", "id", "ls", "seq", "env", "touch", "pwd", "true", "chown"]
ENTRYPOINT = """#!/bin/sh
{ echo "CONCH_SANDBOX_ID=$CONCH_SANDBOX_ID"; echo "HOME=$HOME"; echo "PATH=$PATH"
  echo "FOO=$FOO"; echo "ARGS=$#"; echo "PWD=$(pwd)"; } > /tmp/entrypoint.out
sleep 0.3
kill -USR1 1
"""
PASSWD = ("root:x:0:0:root:/home/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
          "worker:x:4100:4100:worker:/home/worker:/bin/sh\n")
GROUP = "root:x:0:\nworker:x:4100:\nstaff:x:50:worker\n"


def run(*cmd, check=True, **kw):
    return subprocess.run(cmd, check=check, capture_output=True, text=True, **kw)


def missing_tools():
    need = ["unshare", "chroot", "mkfs.erofs", "mkfs.ext4", "losetup", "ip", "nsenter", "curl"]
    return [t for t in need if shutil.which(t) is None]


def libs_of(binary):
    out = run("ldd", binary).stdout
    libs = []
    for line in out.splitlines():
        for tok in line.split():
            if tok.startswith("/"):
                libs.append(tok)
    return libs


def copy_with_libs(binary, dest_root, dest_path):
    os.makedirs(os.path.dirname(dest_root + dest_path), exist_ok=True)
    shutil.copy2(binary, dest_root + dest_path, follow_symlinks=True)
    for lib in libs_of(binary):
        d = dest_root + lib
        if not os.path.exists(d):
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copy2(lib, d, follow_symlinks=True)


def write(path, text, mode=0o644):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, mode)


def _rmdir_retry(path, timeout=5.0):
    """rmdir a cgroup whose last processes may still be exiting."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


def cgroup2_mount():
    """The host's cgroup v2 hierarchy as this process sees it, or None."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            if post.startswith("cgroup2 ") and pre.split()[3] == "/":
                return pre.split()[4]
    return None


class Sandbox:
    def __init__(self, binary, vsock_port=None, with_disk=True, entrypoint=True, extra_args=(), closed_stdio=False):
        self.binary = os.path.abspath(binary)
        self.work = tempfile.mkdtemp(prefix="conch-ns-")
        self.root = os.path.join(self.work, "root")
        self.loops = []
        self.proc = None
        self.pid1 = None
        tag = f"{os.getpid() % 10000}{random.randint(0, 99)}"
        self.peer_ns = f"conch-peer-{tag}"
        self.peer_if = f"cph{tag}"[:15]
        self.vsock_port = vsock_port
        self.with_disk = with_disk
        self.entrypoint = entrypoint  # False: no entrypoint, services not required
        self.extra_args = list(extra_args)
        self.closed_stdio = closed_stdio  # PID 1 started with fds 0-2 closed (no console)
        self.sock = os.path.join(self.root, "run", "conch-init.sock")
        self.log_path = os.path.join(self.work, "console.log")
        self.t_exec = None

    # ------------------------------------------------------------ build
    def build(self):
        copy_with_libs(self.binary, self.root, "/sbin/conch-init")
        base = os.path.join(self.work, "base")
        for t in TOOLS:
            copy_with_libs(shutil.which(t) if t != "sh" else "/bin/dash", base, "/usr/bin/" + t)
        os.symlink("usr/bin", os.path.join(base, "bin"))
        write(os.path.join(base, "etc/passwd"), PASSWD)
        write(os.path.join(base, "etc/group"), GROUP)
        os.makedirs(os.path.join(base, "home/worker"))  # root's in the image (--all-root): chown'ed by the test
        write(os.path.join(base, "etc/layer-marker"), "base\n")
        write(os.path.join(base, "etc/base-only"), "base-only\n")
        os.makedirs(os.path.join(base, "tmp"), exist_ok=True)
        top = os.path.join(self.work, "top")
        write(os.path.join(top, "etc/layer-marker"), "top\n")
        if self.entrypoint:
            write(os.path.join(top, "etc/conch/entrypoint"), ENTRYPOINT, 0o755)
            write(os.path.join(top, "etc/conch/features/envd"), "")
        self.layer_devs = [self._loop(self._erofs(top, "top.img")), self._loop(self._erofs(base, "base.img"))]
        if self.with_disk:
            img = os.path.join(self.work, "disk.img")
            with open(img, "wb") as f:
                f.truncate(64 << 20)
            run("mkfs.ext4", "-q", "-F", img)
            self.disk_dev = self._loop(img)
        else:
            self.disk_dev = "none"

    def _erofs(self, src, name):
        img = os.path.join(self.work, name)
        run("mkfs.erofs", "--quiet", "--all-root", img, src)
        return img

    def _loop(self, img):
        dev = run("losetup", "-f", "--show", img).stdout.strip()
        self.loops.append(dev)
        return dev

    # ------------------------------------------------------------ boot
    def cmdline(self):
        listen = "unix:/run/conch-init.sock"
        if self.vsock_port:
            listen = f"vsock:{self.vsock_port}," + listen
        return [f"conch.layers={','.join(self.layer_devs)}", f"conch.disk={self.disk_dev}",
                "conch.sandbox_id=ns-boot", f"conch.init_listen={listen}", *self.extra_args]

    def boot(self):
        """Start PID 1 and wire the network; returns once eth0 is in place."""
        run("ip", "netns", "add", self.peer_ns)
        self.log = open(self.log_path, "wb")
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")  # PID 1 never exits
        self.t_exec = time.monotonic()
        wrap = ["sh", "-c", 'exec "$@" 0<&- 1>&- 2>&-', "sh"] if self.closed_stdio else []
        self.proc = subprocess.Popen(
            [*wrap, "unshare", "-pfmn", "--mount-proc", "chroot", self.root, "/sbin/conch-init", *self.cmdline()],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.pid1 = self._find_pid1()
        run("ip", "-n", self.peer_ns, "link", "add", self.peer_if, "type", "veth",
            "peer", "name", "eth0", "netns", str(self.pid1))
        run("ip", "-n", self.peer_ns, "addr", "add", f"{GATEWAY}/{PREFIX}", "dev", self.peer_if)
        run("ip", "-n", self.peer_ns, "link", "set", self.peer_if, "up")
        run("ip", "-n", self.peer_ns, "link", "set", "lo", "up")
        self.t_wired = time.monotonic()

    def _find_pid1(self):
        deadline = time.monotonic() + 10
        path = f"/proc/{self.proc.pid}/task/{self.proc.pid}/children"
        while time.monotonic() < deadline:
            try:
                kids = open(path).read().split()
            except OSError:
                kids = []
            for k in kids:
                try:
                    nspid = [l for l in open(f"/proc/{k}/status") if l.startswith("NSpid:")][0].split()
                except (OSError, IndexError):
                    continue
                if nspid[-1] == "1":
                    return int(k)
            if self.proc.poll() is not None:
                raise RuntimeError("unshare exited: " + self.console())
            time.sleep(0.005)
        raise RuntimeError("PID 1 did not appear")

    def request(self, token="tok-1", sandbox_id="ns-sb-1", env=None, **net):
        n = {"guestIP": GUEST_IP, "prefixLength": PREFIX, "gateway": GATEWAY,
             "dns": {"nameservers": ["10.77.0.53", "10.77.0.54", "10.77.0.53"],
                     "search": ["svc.test", "example.test"], "options": ["timeout:2", "ndots:1"]}}
        n.update(net)
        return {"version": 1, "sandboxID": sandbox_id, "agentToken": token,
                "env": env if env is not None else {"FOO": "bar"}, "network": n}

    def init_until_ready(self, request, deadline=20.0):
        return initpeer.until_ready("unix:" + self.sock, request, deadline)

    # ------------------------------------------------------------ looking
    def console(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""

    def logged(self):
        """The log file: every line from boot step 11 on (the console gets
        warn and above only once the sandbox is ready)."""
        try:
            return open(self.in_root("/var/log/conch-init/conch-init.log"), errors="replace").read()
        except OSError:
            return ""

    def in_root(self, path):
        return f"/proc/{self.pid1}/root{path}"

    def ns(self, *cmd, kinds=("-n",)):
        return run("nsenter", "-t", str(self.pid1), *kinds, *cmd, check=False)

    def peer(self, *cmd, timeout=30):
        return run("ip", "netns", "exec", self.peer_ns, *cmd, check=False, timeout=timeout)

    def ns_processes(self):
        """[(host pid, ns pid, state, ppid, comm)] of every process in PID 1's pid namespace."""
        me = os.readlink(f"/proc/{self.pid1}/ns/pid")
        out = []
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{d}/ns/pid") != me:
                    continue
                st = {}
                for line in open(f"/proc/{d}/status"):
                    k, _, v = line.partition(":")
                    st[k] = v.strip()
                out.append((int(d), int(st["NSpid"].split()[-1]), st["State"][0], int(st["PPid"]), st["Name"]))
            except (OSError, KeyError, ValueError):
                continue
        return out

    # ------------------------------------------------------------ API (from the peer namespace)
    def url(self, path):
        return f"http://{GUEST_IP}:4064{path}"

    def health(self):
        r = self.peer("curl", "-s", "-m", "5", "-w", "\n%{http_code}", self.url("/health"))
        return r.stdout

    def unary(self, path, body, token):
        r = self.peer("curl", "-s", "-m", "20", "-w", "\n%{http_code}", "-H", "Content-Type: application/json",
                      "-H", "Connect-Protocol-Version: 1", "-H", f"conch-init-token: {token}",
                      "--data-binary", json.dumps(body), self.url(path))
        text, _, code = r.stdout.rpartition("\n")
        return int(code or 0), text

    def start_process(self, cmd, args, token, timeout=30):
        """StartProcess over Connect streaming JSON: (http code, events, stdout bytes)."""
        import struct
        import base64
        payload = json.dumps({"cmd": cmd, "args": args}).encode()
        env_path = os.path.join(self.work, "req.env")
        with open(env_path, "wb") as f:
            f.write(struct.pack(">BI", 0, len(payload)) + payload)
        out_path = os.path.join(self.work, "resp.bin")
        r = self.peer("curl", "-s", "-m", str(timeout), "-o", out_path, "-w", "%{http_code}",
                      "-H", "Content-Type: application/connect+json", "-H", f"conch-init-token: {token}",
                      "--data-binary", "@" + env_path, self.url("/pb.ProcessService/StartProcess"),
                      timeout=timeout + 5)
        code = int(r.stdout or 0)
        data = open(out_path, "rb").read() if os.path.exists(out_path) else b""
        events, stdout, off = [], b"", 0
        while off + 5 <= len(data):
            flags, n = struct.unpack(">BI", data[off:off + 5])
            ev = json.loads(data[off + 5:off + 5 + n] or b"{}")
            events.append((flags, ev))
            if flags == 0 and "data" in ev and "stdout" in ev["data"]:
                stdout += base64.b64decode(ev["data"]["stdout"])
            off += 5 + n
        return code, events, stdout

    # ------------------------------------------------------------ teardown
    def close(self):
        """Undo everything; returns a list of leftovers (empty = clean)."""
        if self.pid1:
            try:
                os.kill(self.pid1, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if getattr(self, "log", None):
            self.log.close()
        run("ip", "netns", "del", self.peer_ns, check=False)
        # PID 1's command cgroups live in the host's cgroup2 hierarchy (no
        # cgroup namespace here): empty once its processes are gone.  PID 1
        # logs where it made them.
        mnt = cgroup2_mount()
        self.cgroups = list(getattr(self, "cgroups", []))
        if mnt:
            for m in re.finditer(r"process cgroups: (/\S+)", self.console()):
                self.cgroups.append(mnt + m.group(1))
        for d in sorted(set(self.cgroups), key=len, reverse=True):
            if os.path.isdir(d):
                for sub in sorted(os.listdir(d)):
                    if os.path.isdir(os.path.join(d, sub)):
                        _rmdir_retry(os.path.join(d, sub))
                _rmdir_retry(d)
        # the namespace's mounts are gone with its last process; loop devices
        # may still be busy for a moment while the kernel tears the mounts down
        deadline = time.monotonic() + 10
        for dev in self.loops:
            while run("losetup", "-d", dev, check=False).returncode != 0 and time.monotonic() < deadline:
                time.sleep(0.05)
        leftovers = []
        for dev in self.loops:
            back = run("losetup", "-n", "-O", "BACK-FILE", dev, check=False).stdout.strip()
            if back.startswith(self.work):
                leftovers.append(f"loop device {dev} still attached to {back}")
        for d in getattr(self, "cgroups", []):
            if os.path.exists(d):
                leftovers.append(f"cgroup {d} not removed")
        if self.peer_ns in run("ip", "netns", "list", check=False).stdout:
            leftovers.append(f"netns {self.peer_ns} still present")
        if self.peer_if in run("ip", "-o", "link", check=False).stdout:
            leftovers.append(f"veth {self.peer_if} leaked into the root netns")
        shutil.rmtree(self.work, ignore_errors=True)
        if os.path.exists(self.work):
            leftovers.append(f"{self.work} not removed")
        return leftovers


@contextlib.contextmanager
def ready(binary, *, fault=None, token="tok-1", console_tail=0, **kw):
    """A PID 1 booted in namespaces whose first init message was answered
    ready, with CONCH_FAULT=fault (a test seam) while it lives; closed
    afterwards, and nothing of it may be left (close() lists what is)."""
    s = Sandbox(binary, **kw)
    old = os.environ.get("CONCH_FAULT")
    if fault:
        os.environ["CONCH_FAULT"] = fault
    try:
        s.build()
        s.boot()
        s.init_until_ready(s.request())
        if token is not None:
            s.token = token
        yield s
    finally:
        if fault:
            if old is None:
                os.environ.pop("CONCH_FAULT", None)
            else:
                os.environ["CONCH_FAULT"] = old
        if console_tail:
            print("\n---- PID 1 console ----\n" + s.console()[-console_tail:])
        assert s.close() == []
