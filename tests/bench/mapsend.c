/* mapsend — is sendfile cheaper than writing mapped pages for a download?
 * (docs/internals/profile.md, GetFileStream.)  A bare HTTP/1.1 server on
 * 127.0.0.1:PORT that answers every request with FILE, one connection at a
 * time, in one of four ways, and prints its own CPU time per answer:
 *
 *   map     2 MiB windows mmap'd + MADV_POPULATE_READ, written whole,
 *           unmapped (the agent's former GetFileStream, in one thread)
 *   sf      sendfile, 1 MiB per call
 *   maph2   map, with a 9-byte header before every 16 KiB as HTTP/2 DATA
 *           frames have (64 iovecs per writev, as the agent's h2c)
 *   sfh2    the same framing with sendfile: a 9-byte send(MSG_MORE), then
 *           sendfile of 16 KiB
 *
 * The framed modes count the headers in Content-Length, so curl takes the
 * answer as HTTP/1.1: what is measured is the server's work per byte.
 *
 *   cc -O2 -o mapsend tests/bench/mapsend.c
 *   ./mapsend map FILE 4701 & curl -s -o /dev/null -w '%{time_total}\n' http://127.0.0.1:4701/
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#define WINDOW (2u << 20)
#define FRAME 16384u

static void die(const char *what) {
  perror(what);
  exit(1);
}

static void send_all(int s, const void *p, size_t n, int flags) {
  const char *c = p;
  while (n) {
    ssize_t r = send(s, c, n, flags);
    if (r < 0) die("send");
    c += r;
    n -= (size_t)r;
  }
}

static void writev_all(int s, struct iovec *iov, int n) {
  int i = 0;
  while (i < n) {
    ssize_t w = writev(s, iov + i, n - i > 64 ? 64 : n - i);
    if (w < 0) die("writev");
    while (w > 0) {
      if ((size_t)w >= iov[i].iov_len) {
        w -= (ssize_t)iov[i++].iov_len;
      } else {
        iov[i].iov_base = (char *)iov[i].iov_base + w;
        iov[i].iov_len -= (size_t)w;
        w = 0;
      }
    }
  }
}

static void send_mapped(int s, int fd, size_t size, int framed) {
  static unsigned char fh[9];
  static struct iovec iov[2 * (WINDOW / FRAME)];
  for (size_t off = 0; off < size; off += WINDOW) {
    size_t len = size - off < WINDOW ? size - off : WINDOW;
    unsigned char *m = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, (off_t)off);
    if (m == MAP_FAILED) die("mmap");
    madvise(m, len, MADV_POPULATE_READ);
    if (!framed) {
      send_all(s, m, len, 0);
    } else {
      int n = 0;
      for (size_t o = 0; o < len; o += FRAME) {
        iov[n++] = (struct iovec){fh, sizeof fh};
        iov[n++] = (struct iovec){m + o, len - o < FRAME ? len - o : FRAME};
      }
      writev_all(s, iov, n);
    }
    munmap(m, len);
  }
}

static void send_file(int s, int fd, size_t size, int framed) {
  static const unsigned char fh[9];
  off_t o = 0;
  while ((size_t)o < size) {
    size_t left = size - (size_t)o, step = framed ? FRAME : 1u << 20;
    if (left > step) left = step;
    if (framed) send_all(s, fh, sizeof fh, MSG_MORE);
    while (left) {
      ssize_t w = sendfile(s, fd, &o, left);
      if (w <= 0) die("sendfile");
      left -= (size_t)w;
    }
  }
}

static double cpu_ms(void) {
  struct rusage r;
  getrusage(RUSAGE_SELF, &r);
  return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3 + (r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e3;
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s map|sf|maph2|sfh2 FILE PORT\n", argv[0]);
    return 2;
  }
  const char *mode = argv[1];
  int framed = strstr(mode, "h2") != NULL, mapped = strncmp(mode, "map", 3) == 0;
  int fd = open(argv[2], O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) die(argv[2]);
  size_t size = (size_t)st.st_size;
  size_t total = size + (framed ? (size + FRAME - 1) / FRAME * 9 : 0);
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3])),
                          .sin_addr.s_addr = htonl(0x7f000001)};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 8) != 0) die("listen");
  for (;;) {
    int s = accept(ls, NULL, NULL);
    if (s < 0) continue;
    char req[4096];
    if (recv(s, req, sizeof req, 0) <= 0) {
      close(s);
      continue;
    }
    double c0 = cpu_ms();
    char hdr[128];
    int hl = snprintf(hdr, sizeof hdr, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", total);
    send_all(s, hdr, (size_t)hl, 0);
    if (mapped) send_mapped(s, fd, size, framed);
    else send_file(s, fd, size, framed);
    fprintf(stderr, "%s: %.1f ms CPU\n", mode, cpu_ms() - c0);
    close(s);
  }
}
