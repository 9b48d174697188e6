"""A conch-init microVM under qemu, for the VM tests and the boot benchmark.

Boots Debian's stock cloud kernel with the image of `make vm-image`
(build/vm: vmlinuz, initramfs.cpio.gz, rootfs.erofs, top.erofs) plus a
test-only initramfs overlay whose /init is tests/vm/vmbridge.c: it forks a
serial→AF_VSOCK bridge and execs /sbin/conch-init, so conch-init is PID 1
with the kernel's argv.  Host side of the bridge: the second serial port,
a unix socket here.  The API is reached through qemu user networking with
`hostfwd` on 127.0.0.1 only; `restrict=on` keeps the guest from reaching
anything else.

Layouts:
  pmem  q35, layers on virtio-pmem (top = pmem0, rootfs = pmem1), RAM upper
  blk   q35, ext4 writable disk /dev/vda, layers /dev/vdb,/dev/vdc named by
        conch.layers= on the kernel command line

arm64 (arch="aarch64"): the image of `make vm-image-arm64` (build/vm-arm64)
under qemu-system-aarch64, `virt` machine, TCG always; blk layout only; the
console on the PL011 UART and the bridge on a virtio-serial port (vmbridge.c).

Acceleration: KVM only when a probe boot on it gets the kernel running
(this machine's /dev/kvm cannot run a stock kernel: "failed to set MSR
0x10a"), else TCG.
"""
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from conch import free_port  # noqa: E402
IMAGES = os.environ.get("CONCH_VM_IMAGES", os.path.join(ROOT, "build", "vm"))
IMAGES_ARM64 = os.environ.get("CONCH_VM_IMAGES_ARM64", os.path.join(ROOT, "build", "vm-arm64"))
QEMU = "qemu-system-x86_64"
QEMU_ARM64 = "qemu-system-aarch64"
ARM64_CC = ["aarch64-linux-gnu-gcc", "--sysroot=" + os.path.join(ROOT, "build", "sysroot-arm64")]
GUEST_IP, GATEWAY, DNS = "10.0.2.15", "10.0.2.2", "10.0.2.3"
_accel = None


def accel():
    """'kvm' if a stock kernel really boots under KVM here, else 'tcg'."""
    global _accel
    if _accel:
        return _accel
    _accel = "tcg"
    if os.environ.get("CONCH_VM_ACCEL") in ("kvm", "tcg"):
        _accel = os.environ["CONCH_VM_ACCEL"]
        return _accel
    try:
        fd = os.open("/dev/kvm", os.O_RDWR)
        os.close(fd)
    except OSError:
        return _accel
    with tempfile.TemporaryDirectory() as d:
        log = os.path.join(d, "con")
        p = subprocess.Popen([QEMU, "-accel", "kvm", "-cpu", "host", "-m", "256", "-nodefaults",
                              "-display", "none", "-no-reboot", "-kernel", os.path.join(IMAGES, "vmlinuz"),
                              "-append", "console=ttyS0 panic=-1", "-serial", "file:" + log],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.time() + 30
        ok = False
        while time.time() < deadline and p.poll() is None:
            if os.path.exists(log) and b"Linux version" in open(log, "rb").read():
                ok = True
                break
            time.sleep(0.1)
        if p.poll() is None:
            p.kill()
        p.wait()
        if ok:
            _accel = "kvm"
    return _accel


def overlay_initrd(workdir, arch="x86_64"):
    """The product initramfs with the test-only /init (vmbridge) appended:
    the kernel unpacks concatenated archives in order, later files win.
    arm64's adds the virtio_console module the bridge loads."""
    images = IMAGES_ARM64 if arch == "aarch64" else IMAGES
    out = os.path.join(images, "test-initrd")
    br = os.path.join(images, "vmbridge")
    src = os.path.join(ROOT, "tests", "vm", "vmbridge.c")
    base = os.path.join(images, "initramfs.cpio.gz")
    if (not os.path.exists(br) or os.path.getmtime(br) < os.path.getmtime(src)):
        cc = ARM64_CC if arch == "aarch64" else ["cc"]
        subprocess.run(cc + ["-static", "-O2", "-Wall", "-Werror", "-o", br, src], check=True)
    if (os.path.exists(out) and os.path.getmtime(out) > os.path.getmtime(br)
            and os.path.getmtime(out) > os.path.getmtime(base)):
        return out
    d = tempfile.mkdtemp(dir=workdir)
    shutil.copy(br, os.path.join(d, "init"))
    names = "init"
    if arch == "aarch64":
        ko = subprocess.run(f"ls {images}/kernel-*/root/lib/modules/*/kernel/drivers/char/virtio_console.ko",
                            shell=True, check=True, capture_output=True, text=True).stdout.split()[0]
        os.mkdir(os.path.join(d, "vmbridge"))
        shutil.copy(ko, os.path.join(d, "vmbridge", "virtio_console.ko"))
        names = "init\nvmbridge\nvmbridge/virtio_console.ko"
    ov = subprocess.run(f"printf '{names}\\n' | cpio -o -H newc --quiet -R 0:0 | gzip", shell=True, cwd=d,
                        check=True, capture_output=True).stdout
    tmp = f"{out}.{os.getpid()}.tmp"  # the tests and the benchmark may race here
    with open(tmp, "wb") as f:
        f.write(open(base, "rb").read())
        f.write(ov)
    os.rename(tmp, out)
    shutil.rmtree(d)
    return out


class VM:
    def __init__(self, layout="pmem", workdir=None, name="vm", mem="512M", sandbox_id="vm-test", smp=1,
                 init_env=None, arch="x86_64", fwd_ports=(), console_level="info", cmdline=(), console_sock=False):
        self.layout, self.name, self.mem, self.sandbox_id, self.smp = layout, name, mem, sandbox_id, smp
        # conch.* words for PID 1: the console keeps info lines after ready
        # (the suite reads them there) unless console_level is None
        self.conch_words = " ".join(([f"conch.console_level={console_level}"] if console_level else []) + list(cmdline))
        # console_sock: the serial console on a unix socket this object reads
        # (pause_console() stops reading it: a console nobody drains)
        self.console_sock = None
        self._con_thread = None
        self._con_paused = None
        self.arch = arch
        assert arch == "x86_64" or layout == "blk", "arm64 guests: blk layout only"
        # KEY=VALUE words the kernel hands to PID 1 as its environment
        self.init_env = " ".join(f"{k}={v}" for k, v in (init_env or {}).items())
        self.workdir = workdir or tempfile.mkdtemp(prefix="conch-vm-")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # guest port → a host port on 127.0.0.1 forwarded to the guest IP (x86-64)
        self.fwd = {p: free_port() for p in fwd_ports}
        self.console = os.path.join(self.workdir, f"{name}-console.log")
        if console_sock:
            self.console_sock = os.path.join(self.workdir, f"{name}-console.sock")
        self.bridge_path = os.path.join(self.workdir, f"{name}-bridge.sock")
        self.qmp_path = os.path.join(self.workdir, f"{name}-qmp.sock")
        self.proc = None
        self._bridge = None
        self._qmp = None
        self.disk = None
        if layout == "blk":
            self.disk = os.path.join(self.workdir, f"{name}-disk.ext4")
            if not os.path.exists(self.disk):
                subprocess.run(["truncate", "-s", "64M", self.disk], check=True)
                subprocess.run(["mkfs.ext4", "-q", "-F", self.disk], check=True)

    def args(self, incoming=None):
        if self.arch == "aarch64":
            return self.args_arm64()
        img = lambda n: os.path.join(IMAGES, n)  # noqa: E731
        a = [QEMU, "-machine", "q35", "-accel", accel(), "-m", f"{self.mem},slots=4,maxmem=4G",
             "-smp", str(self.smp), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
             "-kernel", img("vmlinuz"), "-initrd", overlay_initrd(self.workdir),
             "-serial", (f"unix:{self.console_sock},server=on,wait=on" if self.console_sock else "file:" + self.console),
             "-serial", f"unix:{self.bridge_path},server=on,wait=off",
             "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
             "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-{GUEST_IP}:4064" +
             "".join(f",hostfwd=tcp:127.0.0.1:{h}-{GUEST_IP}:{p}" for p, h in self.fwd.items()),
             "-device", "virtio-net-pci,netdev=n0"]
        if accel() == "kvm":
            a += ["-cpu", "host"]
        if self.layout == "pmem":
            for i, n in enumerate(["top.erofs", "rootfs.erofs"]):
                a += ["-object", f"memory-backend-file,id=pm{i},share=off,mem-path={img(n)},"
                                 f"size={os.path.getsize(img(n))}",
                      "-device", f"virtio-pmem-pci,memdev=pm{i},id=pmem{i}"]
            append = f"console=ttyS0 panic=-1 {self.init_env} -- conch.sandbox_id={self.sandbox_id} {self.conch_words}"
        else:
            a += ["-drive", f"file={self.disk},if=none,id=d0,format=raw", "-device", "virtio-blk-pci,drive=d0"]
            for i, n in enumerate(["top.erofs", "rootfs.erofs"]):
                a += ["-drive", f"file={img(n)},if=none,id=l{i},format=raw,readonly=on",
                      "-device", f"virtio-blk-pci,drive=l{i}"]
            append = (f"console=ttyS0 panic=-1 {self.init_env} conch.sandbox_id={self.sandbox_id} "
                      f"conch.layers=/dev/vdb,/dev/vdc {self.conch_words}")
        a += ["-append", append]
        if incoming:
            a += ["-incoming", f"exec:cat {incoming}"]
        return a

    def args_arm64(self):
        img = lambda n: os.path.join(IMAGES_ARM64, n)  # noqa: E731
        a = [QEMU_ARM64, "-machine", "virt", "-cpu", "cortex-a72", "-accel", "tcg", "-m", self.mem,
             "-smp", str(self.smp), "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
             "-kernel", img("vmlinuz"), "-initrd", overlay_initrd(self.workdir, "aarch64"),
             "-serial", "file:" + self.console,
             "-device", "virtio-serial-pci",
             "-chardev", f"socket,id=br,path={self.bridge_path},server=on,wait=off",
             "-device", "virtserialport,chardev=br,name=conch.bridge",
             "-qmp", f"unix:{self.qmp_path},server=on,wait=off",
             "-netdev", f"user,id=n0,restrict=on,hostfwd=tcp:127.0.0.1:{self.port}-{GUEST_IP}:4064",
             "-device", "virtio-net-pci,netdev=n0",
             "-drive", f"file={self.disk},if=none,id=d0,format=raw", "-device", "virtio-blk-pci,drive=d0"]
        for i, n in enumerate(["top.erofs", "rootfs.erofs"]):
            a += ["-drive", f"file={img(n)},if=none,id=l{i},format=raw,readonly=on",
                  "-device", f"virtio-blk-pci,drive=l{i}"]
        a += ["-append", f"console=ttyAMA0 panic=-1 {self.init_env} conch.sandbox_id={self.sandbox_id} "
                         f"conch.layers=/dev/vdb,/dev/vdc {self.conch_words}"]
        return a

    def start(self, incoming=None):
        for p in (self.console, self.bridge_path, self.qmp_path, self.console_sock):
            if p and os.path.exists(p):
                os.unlink(p)
        self.t_start = time.time()
        self.qemu_log = os.path.join(self.workdir, f"{self.name}-qemu.log")
        self.proc = subprocess.Popen(self.args(incoming), stdin=subprocess.DEVNULL,
                                     stdout=open(self.qemu_log, "wb"), stderr=subprocess.STDOUT)
        if self.console_sock:
            self._console_reader()
        deadline = time.time() + 30
        while not (os.path.exists(self.bridge_path) and os.path.exists(self.qmp_path)):
            if self.proc.poll() is not None:
                raise RuntimeError("qemu exited: " + open(self.qemu_log, errors="replace").read())
            if time.time() > deadline:
                raise RuntimeError("qemu did not create its sockets")
            time.sleep(0.05)
        return self

    # ------------------------------------------------------------ console
    def _console_reader(self):
        """Connect to the console socket (qemu waits for it) and copy what
        comes to self.console, except while paused."""
        import threading
        deadline = time.time() + 30
        while not os.path.exists(self.console_sock):
            if self.proc.poll() is not None or time.time() > deadline:
                raise RuntimeError("qemu did not create its console socket")
            time.sleep(0.05)
        s = socket.socket(socket.AF_UNIX)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(self.console_sock)
        self._con_paused = threading.Event()

        def loop():
            with open(self.console, "ab") as f:
                while True:
                    if self._con_paused.is_set():
                        time.sleep(0.05)
                        continue
                    try:
                        b = s.recv(65536)
                    except OSError:
                        return
                    if not b:
                        return
                    f.write(b)
                    f.flush()
        self._con_sock = s
        self._con_thread = threading.Thread(target=loop, daemon=True)
        self._con_thread.start()

    def pause_console(self, paused=True):
        if paused:
            self._con_paused.set()
        else:
            self._con_paused.clear()

    def log(self):
        try:
            return open(self.console, "rb").read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_log(self, text, timeout=120, start=0):
        deadline = time.time() + timeout
        while time.time() < deadline:
            lg = self.log()
            i = lg.find(text, start)
            if i >= 0:
                return lg, i
            if self.proc.poll() is not None:
                raise AssertionError(f"qemu exited waiting for {text!r}; console:\n{lg[-4000:]}")
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} on the console within {timeout} s:\n{self.log()[-4000:]}")

    # ------------------------------------------------------------ bridge
    def exchange(self, data, timeout=60):
        """Send bytes to the guest's vsock:4065 through the bridge; returns
        the bytes read back until EOF, or raises when no vsock connection
        could be made (the errno)."""
        if self._bridge is None:
            self._bridge = socket.socket(socket.AF_UNIX)
            self._bridge.connect(self.bridge_path)
        s = self._bridge
        s.settimeout(timeout)
        s.sendall(struct.pack(">I", len(data)) + data)
        n, = struct.unpack(">I", self._recv(s, 4))
        if n == 0xffffffff:
            err, = struct.unpack(">I", self._recv(s, 4))
            raise ConnectionError(f"bridge: no AF_VSOCK connection to port 4065: {os.strerror(err)}")
        return self._recv(s, n)

    @staticmethod
    def _recv(s, n):
        b = b""
        while len(b) < n:
            c = s.recv(n - len(b))
            if not c:
                raise ConnectionError("bridge socket closed")
            b += c
        return b

    def init_message(self, token, timeout=60, **extra):
        """One init message (boot.md §3) with qemu user networking's
        addresses; returns the decoded response (or None: no response)."""
        msg = {"version": 1, "sandboxID": self.sandbox_id, "agentToken": token,
               "network": {"guestIP": GUEST_IP, "prefixLength": 24, "gateway": GATEWAY,
                           "dns": {"nameservers": [DNS]}}}
        msg.update(extra)
        body = json.dumps(msg).encode()
        out = self.exchange(struct.pack(">I", len(body)) + body, timeout=timeout)
        if not out:
            return None
        n, = struct.unpack(">I", out[:4])
        return json.loads(out[4:4 + n])

    def ready(self, token, timeout=120, **extra):
        """Send init messages until `ready` (the host's retry loop)."""
        deadline = time.time() + timeout
        while True:
            r = self.init_message(token, **extra)
            if r and r["status"] == "ready":
                return r
            if time.time() > deadline:
                raise AssertionError(f"not ready: {r}\n{self.log()[-4000:]}")
            time.sleep(0.05)

    # ------------------------------------------------------------ qmp
    def qmp(self, cmd, **args):
        if self._qmp is None:
            s = socket.socket(socket.AF_UNIX)
            s.connect(self.qmp_path)
            self._qmp = s.makefile("rwb")
            json.loads(self._qmp.readline())  # greeting
            self._qmp_cmd("qmp_capabilities")
        return self._qmp_cmd(cmd, **args)

    def _qmp_cmd(self, cmd, **args):
        self._qmp.write(json.dumps({"execute": cmd, "arguments": args}).encode() + b"\n")
        self._qmp.flush()
        while True:
            r = json.loads(self._qmp.readline())
            if "return" in r:
                return r["return"]
            if "error" in r:
                raise RuntimeError(f"qmp {cmd}: {r['error']}")

    def snapshot(self, path, timeout=300):
        """Stop the guest and save its whole state to path (migration)."""
        self.qmp("stop")
        self.qmp("migrate", uri=f"exec:cat > {path}")
        deadline = time.time() + timeout
        while True:
            st = self.qmp("query-migrate").get("status")
            if st == "completed":
                return
            if st == "failed" or time.time() > deadline:
                raise AssertionError(f"migration {st}")
            time.sleep(0.2)

    def wait_incoming(self, timeout=300):
        deadline = time.time() + timeout
        while True:
            st = self.qmp("query-status")["status"]
            if st == "running":
                return
            if st in ("paused", "postmigrate", "prelaunch") and self.qmp("query-migrate").get("status") != "active":
                try:
                    self.qmp("cont")
                except RuntimeError:
                    pass
            if time.time() > deadline:
                raise AssertionError(f"restore: status {st}")
            time.sleep(0.2)

    def wait_exit(self, timeout=60):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def close(self):
        for s in (self._bridge, self._qmp):
            try:
                s and s.close()
            except OSError:
                pass
        self._bridge = self._qmp = None
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self._con_thread:
            self._con_paused.clear()
            self._con_sock.close()
            self._con_thread.join(timeout=10)
