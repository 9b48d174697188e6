/* proc_rtt — latency samples for tests/bench/process.sh.
 *
 *   proc_rtt spawn N             posix_spawn("/bin/true") + waitpid, N times
 *   proc_rtt h1 PORT TOKEN N     StartProcess{cmd:"/bin/true"} (Connect
 *                                streaming, proto) over one HTTP/1.1
 *                                keep-alive connection, N times
 * Prints "p50_us p99_us mean_us".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void report(double *s, int n) {
  double sum = 0;
  for (int i = 0; i < n; i++) sum += s[i];
  qsort(s, (size_t)n, sizeof *s, cmp);
  printf("%.0f %.0f %.0f\n", s[n / 2], s[(int)(n * 0.99)], sum / n);
}

/* Read one HTTP/1.1 chunked response fully; 0 or -1. */
static char rbuf[1 << 16];
static size_t rlen;
static int read_response(int fd) {
  size_t off = 0;
  for (;;) {
    /* done when the body's last chunk "0\r\n\r\n" arrived after the headers */
    char *hdr_end = memmem(rbuf, rlen, "\r\n\r\n", 4);
    if (hdr_end && memmem(hdr_end + 4, rlen - (size_t)(hdr_end + 4 - rbuf), "\r\n0\r\n\r\n", 7)) {
      rlen = 0;
      return 0;
    }
    if (rlen == sizeof rbuf) return -1;
    ssize_t k = read(fd, rbuf + rlen, sizeof rbuf - rlen);
    if (k <= 0) return -1;
    rlen += (size_t)k;
    off++;
  }
}

int main(int argc, char **argv) {
  if (argc >= 3 && strcmp(argv[1], "spawn") == 0) {
    int n = atoi(argv[2]);
    double *s = calloc((size_t)n, sizeof *s);
    char *av[] = {"/bin/true", NULL};
    for (int i = 0; i < n; i++) {
      double t0 = now_us();
      pid_t pid;
      if (posix_spawn(&pid, "/bin/true", NULL, NULL, av, environ) != 0) return 1;
      waitpid(pid, NULL, 0);
      s[i] = now_us() - t0;
    }
    report(s, n);
    return 0;
  }
  if (argc >= 5 && strcmp(argv[1], "h1") == 0) {
    int port = atoi(argv[2]), n = atoi(argv[4]);
    const char *tok = argv[3];
    /* StartProcessRequest{cmd (field 1) = "/bin/true"} in an envelope */
    unsigned char body[64];
    const char *cmd = "/bin/true";
    size_t cl = strlen(cmd);
    body[0] = 0;
    body[1] = body[2] = body[3] = 0;
    body[4] = (unsigned char)(cl + 2);
    body[5] = 0x0a;
    body[6] = (unsigned char)cl;
    memcpy(body + 7, cmd, cl);
    size_t blen = 7 + cl;
    char req[1024];
    int hl = snprintf(req, sizeof req,
                      "POST /pb.ProcessService/StartProcess HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      "Content-Type: application/connect+proto\r\nconch-init-token: %s\r\n"
                      "Content-Length: %zu\r\n\r\n",
                      tok, blen);
    memcpy(req + hl, body, blen);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) return 1;
    double *s = calloc((size_t)n, sizeof *s);
    for (int i = 0; i < n; i++) {
      double t0 = now_us();
      if (write(fd, req, (size_t)hl + blen) != (ssize_t)(hl + blen)) return 1;
      if (read_response(fd) != 0) return 1;
      s[i] = now_us() - t0;
    }
    report(s, n);
    return 0;
  }
  fprintf(stderr, "usage: proc_rtt spawn N | h1 PORT TOKEN N\n");
  return 2;
}
