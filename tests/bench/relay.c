/* relay — the floor under a command's stdout stream (docs/internals/profile.md,
 * stdout): what any agent that reads a child's pipe and sends it to a TCP
 * client costs, with no protocol beyond a 16-byte header per message.
 *
 * It reads its standard input (the pipe from `head -c`), sends each piece
 * as a 16-byte header and the bytes over a loopback TCP connection to a
 * receiver process it forks, which reads and discards them in 256 KiB reads
 * (as tests/bench/rtt.c, without its parsing).  Both sides read until
 * EAGAIN before they wait (as libuv does).  Three processes on the CPUs, as
 * with the agent: the command, the relay, the client.
 *
 *   -m rw      read(2) up to -s bytes into a buffer, one write(2) of header
 *              and bytes (the agent's copies: pipe → buffer → socket)
 *   -m splice  FIONREAD for what the pipe holds (up to -s), the header with
 *              send(MSG_MORE), then splice(2) of exactly those bytes from the
 *              pipe into the socket: no copy through user space (the pipe's
 *              pages are handed to the socket)
 *   -s BYTES   the most per message (default 32768, api.md's cap per event)
 *   -p BYTES   F_SETPIPE_SZ of the input pipe first (default: as it comes)
 *
 * Prints "bytes=N messages=M" (payload read from the pipe, messages sent);
 * exits 1 when the receiver did not count exactly those bytes and headers.
 *
 *   head -c 1G /dev/zero | relay -m splice
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define HDR 16

static void wait_for(int fd, short ev) {
  struct pollfd p = {fd, ev, 0};
  if (poll(&p, 1, -1) < 0 && errno != EINTR) { perror("relay: poll"); exit(1); }
}

/* All of b[0, n) into the non-blocking socket s; flags for send(2). */
static void send_all(int s, const char *b, size_t n, int flags) {
  while (n) {
    ssize_t w = send(s, b, n, flags);
    if (w > 0) { b += w; n -= (size_t)w; continue; }
    if (w < 0 && errno != EAGAIN && errno != EINTR) { perror("relay: send"); exit(1); }
    wait_for(s, POLLOUT);
  }
}

/* The receiver: count what arrives until EOF, report it through fd out. */
static int receive(const struct sockaddr_in *a, int out) {
  int c = socket(AF_INET, SOCK_STREAM, 0);
  if (c < 0 || connect(c, (const struct sockaddr *)a, sizeof *a) != 0) return 1;
  static char b[256 * 1024];
  long long total = 0;
  ssize_t n;
  while ((n = read(c, b, sizeof b)) > 0) total += n;
  return write(out, &total, sizeof total) == sizeof total && n == 0 ? 0 : 1;
}

int main(int argc, char **argv) {
  int use_splice = 0;
  size_t cap = 32768;
  long pipe_sz = 0;
  int opt;
  while ((opt = getopt(argc, argv, "m:s:p:")) != -1) {
    if (opt == 'm' && strcmp(optarg, "rw") == 0) use_splice = 0;
    else if (opt == 'm' && strcmp(optarg, "splice") == 0) use_splice = 1;
    else if (opt == 's' && atol(optarg) > 0) cap = (size_t)atol(optarg);
    else if (opt == 'p' && atol(optarg) > 0) pipe_sz = atol(optarg);
    else { fprintf(stderr, "usage: relay [-m rw|splice] [-s BYTES] [-p BYTES] <pipe\n"); return 2; }
  }
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
  socklen_t al = sizeof a;
  int ls = socket(AF_INET, SOCK_STREAM, 0), rp[2];
  if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 1) != 0 ||
      getsockname(ls, (struct sockaddr *)&a, &al) != 0 || pipe(rp) != 0) { perror("relay: setup"); return 1; }
  pid_t child = fork();
  if (child < 0) { perror("relay: fork"); return 1; }
  if (child == 0) { close(ls); close(rp[0]); _exit(receive(&a, rp[1])); }
  close(rp[1]);
  int s = accept(ls, NULL, NULL);
  if (s < 0) { perror("relay: accept"); return 1; }
  close(ls);
  if (fcntl(0, F_SETFL, O_NONBLOCK) != 0 || fcntl(s, F_SETFL, O_NONBLOCK) != 0) { perror("relay: fcntl"); return 1; }
  if (pipe_sz && fcntl(0, F_SETPIPE_SZ, pipe_sz) < 0) { perror("relay: F_SETPIPE_SZ"); return 1; }
  char *buf = malloc(HDR + cap);
  if (!buf) return 1;
  memset(buf, 'h', HDR);
  long long sent = 0, msgs = 0;
  for (;;) {
    size_t n;
    if (!use_splice) {
      ssize_t r = read(0, buf + HDR, cap);
      if (r == 0) break;
      if (r < 0) {
        if (errno != EAGAIN && errno != EINTR) { perror("relay: read"); return 1; }
        wait_for(0, POLLIN);
        continue;
      }
      n = (size_t)r;
      send_all(s, buf, HDR + n, 0);
    } else {
      int avail = 0;
      if (ioctl(0, FIONREAD, &avail) != 0) { perror("relay: FIONREAD"); return 1; }
      if (avail == 0) { /* empty: wait, unless the writer has gone */
        struct pollfd p = {0, POLLIN, 0};
        if (poll(&p, 1, -1) == 1 && (p.revents & POLLHUP) && ioctl(0, FIONREAD, &avail) == 0 && avail == 0) break;
        continue;
      }
      n = (size_t)avail < cap ? (size_t)avail : cap;
      send_all(s, buf, HDR, MSG_MORE);
      /* only we read the pipe: the n bytes stay there until spliced */
      for (size_t left = n; left;) {
        ssize_t w = splice(0, NULL, s, NULL, left, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
        if (w > 0) { left -= (size_t)w; continue; }
        if (w < 0 && errno != EAGAIN && errno != EINTR) { perror("relay: splice"); return 1; }
        wait_for(s, POLLOUT);
      }
    }
    sent += (long long)n;
    msgs++;
  }
  shutdown(s, SHUT_WR);
  long long got = -1;
  int st = 0;
  if (read(rp[0], &got, sizeof got) != sizeof got) got = -1;
  waitpid(child, &st, 0);
  printf("bytes=%lld messages=%lld\n", sent, msgs);
  if (got != sent + msgs * HDR || st != 0) {
    fprintf(stderr, "relay: the receiver counted %lld bytes, %lld were sent\n", got, sent + msgs * HDR);
    return 1;
  }
  return 0;
}
