/* h2null — the cheapest h2c receiver there is, to measure what curl itself
 * can upload over h2c on this machine.  No HTTP/2 library: it opens the
 * flow-control windows to 2^31-1 at once (so the client never waits for
 * a WINDOW_UPDATE), then only reads the socket in 1 MiB reads and walks
 * the 9-byte frame headers.  It acknowledges SETTINGS and PING, and when
 * a stream ends answers ":status: 200" (one HPACK byte, 0x88) with no
 * body.  One connection at a time on 127.0.0.1:PORT, prior knowledge.
 * Its only work per byte is the kernel's copy out of the socket; compare
 * h2sink.c (nghttp2) and the agent (profile.md, PostFileStream).  With
 * -s it spins on a non-blocking read while a connection is open, taking
 * a core of its own so that the sender never pays for waking it.
 *
 *   cc -O2 -o h2null tests/bench/h2null.c
 *   ./h2null [-s] PORT &
 *   curl -s --http2-prior-knowledge -o /dev/null -w '%{http_code} %{size_upload}\n' -T FILE http://127.0.0.1:PORT/
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int put(int fd, const uint8_t *d, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, d, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -1;
    d += w, n -= (size_t)w;
  }
  return 0;
}

static void frame(uint8_t *o, uint32_t len, uint8_t type, uint8_t flags, uint32_t sid) {
  o[0] = (uint8_t)(len >> 16), o[1] = (uint8_t)(len >> 8), o[2] = (uint8_t)len;
  o[3] = type, o[4] = flags;
  o[5] = (uint8_t)(sid >> 24), o[6] = (uint8_t)(sid >> 16), o[7] = (uint8_t)(sid >> 8), o[8] = (uint8_t)sid;
}

/* Serves one connection until the peer closes it or breaks the framing. */
static void serve(int fd, uint8_t *buf, size_t cap, int spin) {
  uint8_t out[64];
  /* our SETTINGS: INITIAL_WINDOW_SIZE = 2^31-1; the connection window to 2^31-1 */
  frame(out, 6, 4, 0, 0);
  memcpy(out + 9, "\x00\x04\x7f\xff\xff\xff", 6);
  frame(out + 15, 4, 8, 0, 0);
  uint32_t inc = 0x7fffffffu - 65535u;
  out[24] = (uint8_t)(inc >> 24), out[25] = (uint8_t)(inc >> 16), out[26] = (uint8_t)(inc >> 8), out[27] = (uint8_t)inc;
  if (put(fd, out, 28) < 0) return;

  size_t preface = 24; /* "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", skipped unread */
  uint8_t hd[9];
  size_t hdn = 0;           /* bytes of the current frame header seen */
  size_t skip = 0;          /* payload bytes of the current frame still to pass */
  uint8_t ping[8], pingn = 0, want_ping = 0;
  for (;;) {
    ssize_t r = recv(fd, buf, cap, spin ? MSG_DONTWAIT : 0);
    if (r < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (r <= 0) return;
    size_t i = 0, n = (size_t)r;
    while (i < n) {
      if (preface > 0) {
        size_t k = n - i < preface ? n - i : preface;
        preface -= k, i += k;
        continue;
      }
      if (skip > 0) {
        size_t k = n - i < skip ? n - i : skip;
        if (want_ping)
          for (size_t j = 0; j < k && pingn < 8; j++) ping[pingn++] = buf[i + j];
        skip -= k, i += k;
        if (skip == 0 && want_ping) {
          frame(out, 8, 6, 1, 0);
          memcpy(out + 9, ping, 8);
          if (put(fd, out, 17) < 0) return;
          want_ping = 0;
        }
        continue;
      }
      hd[hdn++] = buf[i++];
      if (hdn < 9) continue;
      hdn = 0;
      size_t len = (size_t)hd[0] << 16 | (size_t)hd[1] << 8 | hd[2];
      uint8_t type = hd[3], flags = hd[4];
      uint32_t sid = ((uint32_t)hd[5] << 24 | (uint32_t)hd[6] << 16 | (uint32_t)hd[7] << 8 | hd[8]) & 0x7fffffffu;
      skip = len;
      if (type == 4 && !(flags & 1)) { /* SETTINGS: acknowledge */
        frame(out, 0, 4, 1, 0);
        if (put(fd, out, 9) < 0) return;
      } else if (type == 6 && !(flags & 1) && len == 8) { /* PING: echo once read */
        want_ping = 1, pingn = 0;
      } else if ((type == 0 || type == 1) && (flags & 1)) { /* END_STREAM: 200, no body */
        frame(out, 1, 1, 0x5, sid);
        out[9] = 0x88;
        if (put(fd, out, 10) < 0) return;
      }
    }
  }
}

int main(int argc, char **argv) {
  int spin = argc == 3 && strcmp(argv[1], "-s") == 0;
  if (argc != 2 + spin) {
    fprintf(stderr, "usage: h2null [-s] PORT\n");
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1 + spin]))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) < 0 || listen(ls, 16) < 0) {
    perror("h2null");
    return 1;
  }
  size_t cap = 1 << 20;
  uint8_t *buf = malloc(cap);
  if (!buf) return 1;
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    serve(fd, buf, cap, spin);
    close(fd);
  }
}
