/* vmbridge — TEST ONLY: the /init of the VM tests' initramfs overlay.
 *
 * This machine has no vhost-vsock, so the host cannot reach the guest's
 * AF_VSOCK directly.  This wrapper forks a bridge and then execs
 * /sbin/conch-init with its own argv, so conch-init is PID 1 exactly as in
 * production.  The bridge carries byte exchanges from the host, over the
 * second serial port (/dev/ttyS1, a unix socket on the host), to
 * conch-init's init listener over the guest's real AF_VSOCK, through the
 * vsock_loopback transport (CID 1):
 *
 *   host → ttyS1: u32 BE n, n bytes      written to a new vsock connection
 *   ttyS1 → host: u32 BE m, m bytes      everything read until EOF (5 s)
 *                 or u32 0xffffffff, u32 BE errno when no connection could
 *                 be made within 30 s (module not loaded, nothing listening)
 *
 * On arm64 (qemu's virt machine has one UART, the console) the bridge port is
 * a virtio-serial port named conch.bridge: the bridge loads virtio_console
 * from /vmbridge/virtio_console.ko once conch-init has loaded virtio_pci (the
 * product image does not carry it), and finds the port's device in sysfs.
 *
 * Never part of the product (the image builder does not include it).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#define TTY_NODE "/vmbridge-ttyS1"
#define MAX_XFER (1u << 20)

static int full_read(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static int full_write(int fd, const void *buf, size_t n) {
  const char *p = buf;
  while (n) {
    ssize_t r = write(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    p += r;
    n -= (size_t)r;
  }
  return 0;
}

static void put32(unsigned char *b, uint32_t v) {
  b[0] = v >> 24, b[1] = v >> 16, b[2] = v >> 8, b[3] = v;
}

static int vsock_connect(unsigned port, int *err) {
  struct timespec t0, t;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
      struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_LOCAL, .svm_port = port};
      if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
      *err = errno;
      close(fd);
    } else {
      *err = errno;
    }
    clock_gettime(CLOCK_MONOTONIC, &t);
    if (t.tv_sec - t0.tv_sec > 30) return -1;
    usleep(20000);
  }
}

#ifdef __aarch64__
/* The dev_t of the virtio port named conch.bridge, or 0 while there is none. */
static dev_t port_dev(void) {
  char path[128], buf[64];
  for (int i = 0; i < 16; i++) {
    snprintf(path, sizeof path, "/vmbridge-sys/class/virtio-ports/vport%dp1/name", i);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0 || strncmp(buf, "conch.bridge", 12) != 0) continue;
    snprintf(path, sizeof path, "/vmbridge-sys/class/virtio-ports/vport%dp1/dev", i);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    n = read(fd, buf, sizeof buf - 1);
    close(fd);
    unsigned maj, min;
    buf[n > 0 ? n : 0] = 0;
    if (sscanf(buf, "%u:%u", &maj, &min) == 2) return makedev(maj, min);
  }
  return 0;
}

static int open_port(void) {
  mkdir("/vmbridge-sys", 0755);
  while (mount("sysfs", "/vmbridge-sys", "sysfs", 0, NULL) != 0 && errno != EBUSY) usleep(20000);
  int ko = open("/vmbridge/virtio_console.ko", O_RDONLY | O_CLOEXEC);
  /* fails with ENOENT (unknown symbols) until conch-init loaded virtio */
  while (ko >= 0 && syscall(SYS_finit_module, ko, "", 0) != 0 && errno != EEXIST) usleep(50000);
  dev_t d;
  while ((d = port_dev()) == 0) usleep(20000);
  mknod(TTY_NODE, S_IFCHR | 0600, d);
  return open(TTY_NODE, O_RDWR | O_NOCTTY | O_CLOEXEC);
}
#else
static int open_port(void) {
  int tty;
  for (;;) { /* the node appears once conch-init mounted devtmpfs; make our own */
    mknod(TTY_NODE, S_IFCHR | 0600, makedev(4, 65));
    tty = open(TTY_NODE, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (tty >= 0) return tty;
    usleep(20000);
  }
}
#endif

static void bridge(void) {
  int tty = open_port();
  struct termios tio;
  if (tcgetattr(tty, &tio) == 0) {
    cfmakeraw(&tio);
    cfsetspeed(&tio, B115200);
    tcsetattr(tty, TCSANOW, &tio);
  }
  static char in[MAX_XFER], out[MAX_XFER];
  for (;;) {
    unsigned char h[8];
    if (full_read(tty, h, 4) != 0) {
      usleep(100000);
      continue;
    }
    uint32_t n = (uint32_t)h[0] << 24 | h[1] << 16 | h[2] << 8 | h[3];
    if (n > MAX_XFER) { /* test misuse: skip the bytes, keep the stream in step */
      for (uint32_t left = n; left;) {
        uint32_t k = left < MAX_XFER ? left : MAX_XFER;
        if (full_read(tty, in, k) != 0) break;
        left -= k;
      }
      continue;
    }
    if (full_read(tty, in, n) != 0) continue;
    int err = 0;
    int fd = vsock_connect(4065, &err);
    if (fd < 0) {
      put32(h, 0xffffffffu);
      put32(h + 4, (uint32_t)err);
      full_write(tty, h, 8);
      continue;
    }
    size_t m = 0;
    if (full_write(fd, in, n) == 0) {
      struct pollfd p = {.fd = fd, .events = POLLIN};
      while (m < sizeof out && poll(&p, 1, 5000) == 1) {
        ssize_t r = read(fd, out + m, sizeof out - m);
        if (r <= 0) break;
        m += (size_t)r;
      }
    }
    close(fd);
    put32(h, (uint32_t)m);
    full_write(tty, h, 4);
    full_write(tty, out, m);
  }
}

int main(int argc, char **argv) {
  (void)argc;
  pid_t pid = fork();
  if (pid == 0) {
    bridge();
    _exit(0);
  }
  execv("/sbin/conch-init", argv);
  perror("vmbridge: exec /sbin/conch-init");
  for (;;) pause();
}
