/* keystroke — keystroke echo round trip through a PTY (tests/bench/keystroke.sh).
 *
 *   keystroke --bare [-n N] [-w W]
 *   keystroke --port P [--token T] [--stream] [-n N] [-w W]
 *
 * Both run the same child on a PTY, `sh -c 'stty raw -echo; printf R; exec
 * cat'` (cat echoes every byte at once), wait for its "R", then time N
 * round trips (after W untimed ones) of one byte in → the same byte out.
 *
 * --bare: openpty + fork here; a round trip is write(master) → read(master).
 * --port: through conch-init over HTTP/1.1 keep-alive, proto codec.  One
 *   connection carries the foreground StartProcess stream
 *   (`application/connect+proto`, pty {}, stdin_open), a second one the
 *   unary SendInput calls (`application/proto`); a round trip runs from
 *   writing SendInput{pid, pty: byte} to reading the data event that
 *   carries the byte (the SendInput answer is read afterwards, untimed).
 *   --stream: one StreamInput instead (HTTP/1.1 chunked, one envelope per
 *   key, no answer per key): writing the chunk → the echoed data event.
 *
 * Output: one stats line (stats.h) labelled "bare" or "conch".
 */
#include "stats.h"

#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILD "stty raw -echo; printf R; exec cat"

static void die(const char *m) {
  fprintf(stderr, "keystroke: %s%s%s\n", m, errno ? ": " : "", errno ? strerror(errno) : "");
  exit(1);
}

/* ---------------------------------------------------------------- bare */
static int run_bare(uint64_t *v, size_t n, size_t warm) {
  int m;
  pid_t pid = forkpty(&m, NULL, NULL, NULL);
  if (pid < 0) die("forkpty");
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", CHILD, (char *)NULL);
    _exit(127);
  }
  char c;
  do {
    if (read(m, &c, 1) != 1) die("read R");
  } while (c != 'R');
  for (size_t i = 0; i < warm + n; i++) {
    char b = (char)('a' + i % 26), r;
    uint64_t t0 = stats_now_ns();
    if (write(m, &b, 1) != 1) die("write");
    if (read(m, &r, 1) != 1) die("read");
    uint64_t t1 = stats_now_ns();
    if (r != b) die("echo mismatch");
    if (i >= warm) v[i - warm] = t1 - t0;
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  close(m);
  return 0;
}

/* ---------------------------------------------------------------- conch */
struct conn {
  int fd;
  uint8_t rb[1 << 16];
  size_t rlen, roff;
};

static int tcp(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) die("connect");
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static void put_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) die("write socket");
    c += w;
    n -= (size_t)w;
  }
}

static uint8_t getb(struct conn *c) {
  if (c->roff == c->rlen) {
    ssize_t r;
    do r = read(c->fd, c->rb, sizeof c->rb);
    while (r < 0 && errno == EINTR);
    if (r <= 0) die("connection closed");
    c->rlen = (size_t)r;
    c->roff = 0;
  }
  return c->rb[c->roff++];
}

static void getline_(struct conn *c, char *out, size_t cap) {
  size_t n = 0;
  for (;;) {
    uint8_t b = getb(c);
    if (b == '\n') break;
    if (b != '\r' && n + 1 < cap) out[n++] = (char)b;
  }
  out[n] = 0;
}

/* Response head; returns Content-Length or -1 (chunked). */
static long read_head(struct conn *c) {
  char line[1024];
  long clen = -2;
  getline_(c, line, sizeof line);
  if (strncmp(line, "HTTP/1.1 200", 12) != 0) {
    fprintf(stderr, "keystroke: status line: %s\n", line);
    exit(1);
  }
  for (;;) {
    getline_(c, line, sizeof line);
    if (!line[0]) break;
    if (strncasecmp(line, "content-length:", 15) == 0) clen = atol(line + 15);
    if (strncasecmp(line, "transfer-encoding:", 18) == 0) clen = -1;
  }
  if (clen == -2) die("no body framing");
  return clen;
}

/* Chunked body reader for the stream. */
struct chunked {
  struct conn *c;
  size_t left; /* bytes left in the current chunk */
};
static uint8_t body_byte(struct chunked *k) {
  char line[64];
  while (k->left == 0) {
    getline_(k->c, line, sizeof line);
    if (!line[0]) continue; /* CRLF after a chunk */
    k->left = strtoul(line, NULL, 16);
    if (k->left == 0) die("stream ended");
  }
  k->left--;
  return getb(k->c);
}

static uint64_t varint(const uint8_t *p, size_t n, size_t *off) {
  uint64_t v = 0;
  for (int s = 0; *off < n && s < 64; s += 7) {
    uint8_t b = p[(*off)++];
    v |= (uint64_t)(b & 0x7f) << s;
    if (!(b & 0x80)) break;
  }
  return v;
}

/* Next stream message: returns the start pid (>0), or 0 with the pty bytes
 * of a data event in out/olen (olen 0 for other events). */
static long next_event(struct chunked *k, uint8_t *out, size_t *olen) {
  uint8_t h[5], msg[1 << 15];
  for (int i = 0; i < 5; i++) h[i] = body_byte(k);
  size_t n = (size_t)h[1] << 24 | (size_t)h[2] << 16 | (size_t)h[3] << 8 | h[4];
  if (h[0] & 2) die("end of stream");
  if (n > sizeof msg) die("message too large");
  for (size_t i = 0; i < n; i++) msg[i] = body_byte(k);
  *olen = 0;
  size_t off = 0;
  if (n < 2) return 0;
  uint8_t tag = msg[off++];
  size_t len = (size_t)varint(msg, n, &off);
  if (tag == 0x0a) { /* start */
    if (len && msg[off] == 0x08) {
      off++;
      return (long)varint(msg, n, &off);
    }
    return 0;
  }
  if (tag == 0x12) { /* data { offset (0x20, absent when 0), pty (0x1a) } */
    size_t end = off + len < n ? off + len : n;
    if (off < end && msg[off] == 0x20) { /* the offset goes first (fanout.c) */
      off++;
      varint(msg, end, &off);
    }
    if (off < end && msg[off] == 0x1a) {
      off++;
      size_t l = (size_t)varint(msg, end, &off);
      if (l > end - off) die("bad data event");
      memcpy(out, msg + off, l);
      *olen = l;
    }
  }
  return 0;
}

static void chunk_out(int fd, const uint8_t *m, size_t p) {
  uint8_t buf[64];
  int l = snprintf((char *)buf, sizeof buf, "%zx\r\n", p + 5);
  memset(buf + l, 0, 4);
  buf[l + 4] = (uint8_t)p;
  memcpy(buf + l + 5, m, p);
  memcpy(buf + l + 5 + p, "\r\n", 2);
  put_all(fd, buf, (size_t)l + 5 + p + 2);
}

static int run_conch(int port, const char *token, int stream, uint64_t *v, size_t n, size_t warm) {
  struct conn *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
  a->fd = tcp(port);
  b->fd = tcp(port);
  /* StartProcessRequest{cmd "sh", args ["-c", CHILD], pty {}, stdin_open true} */
  uint8_t req[256];
  size_t q = 0;
  req[q++] = 0x0a, req[q++] = 2, memcpy(req + q, "sh", 2), q += 2;
  req[q++] = 0x12, req[q++] = 2, memcpy(req + q, "-c", 2), q += 2;
  req[q++] = 0x12, req[q++] = (uint8_t)strlen(CHILD), memcpy(req + q, CHILD, strlen(CHILD)), q += strlen(CHILD);
  req[q++] = 0x42, req[q++] = 0;
  req[q++] = 0x50, req[q++] = 1;
  char head[512];
  int hl = snprintf(head, sizeof head,
                    "POST /pb.ProcessService/StartProcess HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    "Content-Type: application/connect+proto\r\nconch-init-token: %s\r\n"
                    "Content-Length: %zu\r\n\r\n", token, q + 5);
  uint8_t env[5] = {0, 0, 0, 0, (uint8_t)q};
  put_all(a->fd, head, (size_t)hl);
  put_all(a->fd, env, 5);
  put_all(a->fd, req, q);
  if (read_head(a) != -1) die("stream not chunked");
  struct chunked k = {a, 0};
  uint8_t out[1 << 15];
  size_t olen;
  long pid = 0;
  while (pid <= 0) pid = next_event(&k, out, &olen);
  for (int seen = 0; !seen;) {
    next_event(&k, out, &olen);
    seen = olen && memchr(out, 'R', olen);
  }
  size_t sel = 0;
  uint8_t s[8];
  s[sel++] = 0x08; /* pid */
  for (uint64_t x = (uint64_t)pid; ; x >>= 7) {
    s[sel++] = (uint8_t)((x & 0x7f) | (x > 0x7f ? 0x80 : 0));
    if (x <= 0x7f) break;
  }
  if (stream) { /* StreamInput: one chunked request, one envelope per key */
    char sh[512];
    int sl = snprintf(sh, sizeof sh,
                      "POST /pb.ProcessService/StreamInput HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/connect+proto\r\nconch-init-token: %s\r\n"
                      "Transfer-Encoding: chunked\r\n\r\n", token);
    put_all(b->fd, sh, (size_t)sl);
    uint8_t st[16];
    size_t p = 0;
    st[p++] = 0x0a, st[p++] = (uint8_t)(sel + 2), st[p++] = 0x0a, st[p++] = (uint8_t)sel; /* start{process{pid}} */
    memcpy(st + p, s, sel), p += sel;
    chunk_out(b->fd, st, p);
  }
  for (size_t i = 0; i < warm + n; i++) {
    uint8_t ch = (uint8_t)('a' + i % 26), m[32];
    size_t p = 0;
    if (stream) {
      m[p++] = 0x12, m[p++] = 5, m[p++] = 0x0a, m[p++] = 3, m[p++] = 0x12, m[p++] = 1, m[p++] = ch;
      uint64_t t0 = stats_now_ns();
      chunk_out(b->fd, m, p);
      for (int got = 0; !got;) {
        next_event(&k, out, &olen);
        got = olen && memchr(out, ch, olen);
      }
      if (i >= warm) v[i - warm] = stats_now_ns() - t0;
      continue;
    }
    m[p++] = 0x0a, m[p++] = (uint8_t)sel, memcpy(m + p, s, sel), p += sel;
    m[p++] = 0x12, m[p++] = 3, m[p++] = 0x12, m[p++] = 1, m[p++] = ch; /* input { pty: ch } */
    char h2[512];
    int l2 = snprintf(h2, sizeof h2,
                      "POST /pb.ProcessService/SendInput HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/proto\r\nConnect-Protocol-Version: 1\r\nconch-init-token: %s\r\n"
                      "Content-Length: %zu\r\n\r\n", token, p);
    memcpy(h2 + l2, m, p);
    uint64_t t0 = stats_now_ns();
    put_all(b->fd, h2, (size_t)l2 + p);
    for (int got = 0; !got;) {
      next_event(&k, out, &olen);
      got = olen && memchr(out, ch, olen);
    }
    uint64_t t1 = stats_now_ns();
    long cl = read_head(b);
    for (long j = 0; j < cl; j++) getb(b);
    if (i >= warm) v[i - warm] = t1 - t0;
  }
  close(a->fd); /* foreground client gone: the server kills the child */
  close(b->fd);
  free(a);
  free(b);
  return 0;
}

int main(int argc, char **argv) {
  uint64_t n = 2000, warm = 100;
  int bare = 0, port = 0, stream = 0;
  const char *token = getenv("CONCH_INIT_TOKEN");
  static const struct option lo[] = {{"bare", no_argument, 0, 'b'}, {"port", required_argument, 0, 'p'},
                                     {"token", required_argument, 0, 't'}, {"stream", no_argument, 0, 's'},
                                     {0, 0, 0, 0}};
  int o;
  while ((o = getopt_long(argc, argv, "n:w:", lo, NULL)) != -1) {
    if (o == 'b') bare = 1;
    else if (o == 'p') port = atoi(optarg);
    else if (o == 't') token = optarg;
    else if (o == 's') stream = 1;
    else if (o == 'n') { if (stats_parse_count(optarg, 10000000, &n)) die("bad -n"); }
    else if (o == 'w') { if (stats_parse_count(optarg, 10000000, &warm) && strcmp(optarg, "0")) die("bad -w"); }
    else return 2;
  }
  if (!bare && (!port || !token)) {
    fprintf(stderr, "usage: keystroke --bare | --port P --token T [-n N] [-w W]\n");
    return 2;
  }
  uint64_t *v = calloc(n, sizeof *v);
  if (bare) run_bare(v, n, warm);
  else run_conch(port, token, stream, v, n, warm);
  stats_print(stdout, bare ? "bare" : stream ? "stream" : "conch", v, n);
  free(v);
  return 0;
}
