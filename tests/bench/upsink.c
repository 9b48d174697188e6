/* upsink — the floor under an HTTP/1.1 upload (docs/internals/profile.md,
 * PostFileStream): accept one connection at a time on 127.0.0.1:PORT, skip
 * the request head, write the Content-Length bytes of the body to FILE
 * (created afresh each time, as an upload's temp file) with 64 KiB reads
 * and writes, answer "200", go on.  No parsing beyond that, no copies
 * beyond the two a receiver cannot avoid (socket → buffer → file), so
 * `curl -T` against it times what the kernel and the client cost.
 * With -s the body goes socket → pipe → file by splice(2) (1 MiB pipe), no
 * copy through user space: the floor of a receiver that could splice.
 *
 *   upsink [-s] PORT FILE &   curl -s -T big http://127.0.0.1:PORT/
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* splice, F_SETPIPE_SZ */
#endif
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <fcntl.h>
#include <unistd.h>

#define BUF (64 * 1024)

static int use_splice;

/* Body bytes [0, left) from socket c into fd; what is left over. */
static long long sink(int c, int fd, long long left, char *b) {
  if (use_splice) {
    int pp[2];
    if (pipe(pp) != 0) return left;
    fcntl(pp[0], F_SETPIPE_SZ, 1 << 20);
    while (left > 0) {
      ssize_t n = splice(c, NULL, pp[1], NULL, left < (1 << 20) ? (size_t)left : (1 << 20), SPLICE_F_MOVE);
      if (n <= 0) break;
      for (ssize_t k = n; k > 0;) {
        ssize_t m = splice(pp[0], NULL, fd, NULL, (size_t)k, SPLICE_F_MOVE);
        if (m <= 0) { close(pp[0]); close(pp[1]); return left; }
        k -= m;
      }
      left -= n;
    }
    close(pp[0]);
    close(pp[1]);
    return left;
  }
  while (left > 0) {
    ssize_t n = read(c, b, left < BUF ? (size_t)left : BUF);
    if (n <= 0 || write(fd, b, (size_t)n) != n) break;
    left -= n;
  }
  return left;
}

static int serve(int c, const char *path, char *b) {
  size_t have = 0;
  char *end = NULL;
  while (!end) { /* the head, in what fits the buffer */
    ssize_t n = read(c, b + have, BUF - 1 - have);
    if (n <= 0) return -1;
    have += (size_t)n;
    b[have] = 0;
    end = strstr(b, "\r\n\r\n");
    if (!end && have == BUF - 1) return -1;
  }
  long long left = -1;
  int cont = 0;
  for (char *p = b; p < end; p = strstr(p, "\r\n") + 2) {
    if (strncasecmp(p, "content-length:", 15) == 0) left = atoll(p + 15);
    if (strncasecmp(p, "expect: 100-continue", 20) == 0) cont = 1; /* curl's, above 1 MiB */
  }
  if (left < 0) return -1;
  static const char go[] = "HTTP/1.1 100 Continue\r\n\r\n";
  if (cont && write(c, go, sizeof go - 1) != (ssize_t)(sizeof go - 1)) return -1;
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  size_t body = have - (size_t)(end + 4 - b);
  if (body && write(fd, end + 4, body) != (ssize_t)body) return -1;
  left -= (long long)body;
  left = sink(c, fd, left, b);
  close(fd);
  static const char ok[] = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";
  return write(c, ok, sizeof ok - 1) == (ssize_t)(sizeof ok - 1) && left == 0 ? 0 : -1;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "-s") == 0) {
    use_splice = 1;
    argv++;
    argc--;
  }
  if (argc != 3) {
    fprintf(stderr, "usage: upsink [-s] PORT FILE\n");
    return 2;
  }
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(argv[1])),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 8) != 0) {
    perror("upsink");
    return 1;
  }
  char *b = malloc(BUF);
  for (;;) {
    int c = accept(s, NULL, NULL);
    if (c < 0) continue;
    if (serve(c, argv[2], b) != 0) fprintf(stderr, "upsink: a short or bad upload\n");
    close(c);
  }
}
