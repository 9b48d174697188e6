/* upsink — the floor under an HTTP/1.1 upload (docs/internals/profile.md,
 * PostFileStream): accept one connection at a time on 127.0.0.1:PORT, skip
 * the request head, write the Content-Length bytes of the body to FILE
 * (created afresh each time, as an upload's temp file) with 64 KiB reads
 * and writes, answer "200", go on.  No parsing beyond that, no copies
 * beyond the two a receiver cannot avoid (socket → buffer → file), so
 * `curl -T` against it times what the kernel and the client cost.
 * With -s the body goes socket → pipe → file by splice(2) (1 MiB pipe), no
 * copy through user space: the floor of a receiver that could splice.
 * With -t the file side runs in a second thread, as the agent's loop and
 * pool: the reading thread hands 1 MiB buffers (three in turn) to the
 * writing thread, or, with -s too, splices the socket into the pipe that
 * the writing thread splices into the file.
 *
 *   upsink [-s] [-t] PORT FILE &   curl -s -T big http://127.0.0.1:PORT/
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
#include <pthread.h>
#include <unistd.h>

#define BUF (64 * 1024)

static int use_splice, use_thread;

/* The writing thread of -t: what it writes from, and how it is told. */
#define TBUF (1u << 20)
#define NBUF 3
static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int fd, pipe_r;                  /* the file; the pipe's read end (-s) */
  char *buf[NBUF];
  size_t len[NBUF];                /* bytes in buf[i], 0: free */
  unsigned head, tail;             /* buffers handed over, written */
  long long splice_left;           /* -s: bytes still to move pipe → file */
  int done, failed;
} w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void *writer(void *arg) {
  (void)arg;
  if (use_splice) {
    while (w.splice_left > 0) {
      ssize_t m = splice(w.pipe_r, NULL, w.fd, NULL, w.splice_left < TBUF ? (size_t)w.splice_left : TBUF, SPLICE_F_MOVE);
      if (m <= 0) { w.failed = 1; break; }
      w.splice_left -= m;
    }
    return NULL;
  }
  pthread_mutex_lock(&w.mu);
  for (;;) {
    while (w.tail == w.head && !w.done) pthread_cond_wait(&w.cv, &w.mu);
    if (w.tail == w.head) break;
    unsigned i = w.tail % NBUF;
    pthread_mutex_unlock(&w.mu);
    if (write(w.fd, w.buf[i], w.len[i]) != (ssize_t)w.len[i]) w.failed = 1;
    pthread_mutex_lock(&w.mu);
    w.tail++;
    pthread_cond_broadcast(&w.cv);
  }
  pthread_mutex_unlock(&w.mu);
  return NULL;
}

/* -t: the body through the writing thread; what is left over. */
static long long sink_threaded(int c, int fd, long long left) {
  int pp[2] = {-1, -1};
  pthread_t t;
  w.fd = fd;
  w.head = w.tail = 0;
  w.done = w.failed = 0;
  if (use_splice) {
    if (pipe(pp) != 0) return left;
    fcntl(pp[0], F_SETPIPE_SZ, 1 << 20);
    w.pipe_r = pp[0];
    w.splice_left = left;
  }
  if (pthread_create(&t, NULL, writer, NULL) != 0) return left;
  while (left > 0) {
    if (use_splice) {
      ssize_t n = splice(c, NULL, pp[1], NULL, left < TBUF ? (size_t)left : TBUF, SPLICE_F_MOVE);
      if (n <= 0) break;
      left -= n;
      continue;
    }
    pthread_mutex_lock(&w.mu);
    while (w.head - w.tail == NBUF) pthread_cond_wait(&w.cv, &w.mu);
    unsigned i = w.head % NBUF;
    pthread_mutex_unlock(&w.mu);
    size_t have = 0; /* a full buffer, or the rest */
    size_t want = left < (long long)TBUF ? (size_t)left : TBUF;
    while (have < want) {
      ssize_t n = read(c, w.buf[i] + have, want - have);
      if (n <= 0) break;
      have += (size_t)n;
    }
    if (!have) break;
    pthread_mutex_lock(&w.mu);
    w.len[i] = have;
    w.head++;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    left -= (long long)have;
  }
  pthread_mutex_lock(&w.mu);
  w.done = 1;
  pthread_cond_broadcast(&w.cv);
  pthread_mutex_unlock(&w.mu);
  if (use_splice) close(pp[1]); /* what is in the pipe stays readable; a short body ends in EOF */
  pthread_join(t, NULL);
  if (use_splice) close(pp[0]);
  return w.failed ? (left ? left : 1) : left;
}

/* Body bytes [0, left) from socket c into fd; what is left over. */
static long long sink(int c, int fd, long long left, char *b) {
  if (use_thread) return sink_threaded(c, fd, left);
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
  for (; argc > 3 && argv[1][0] == '-'; argv++, argc--) {
    if (strcmp(argv[1], "-s") == 0) use_splice = 1;
    else if (strcmp(argv[1], "-t") == 0) use_thread = 1;
    else break;
  }
  for (int i = 0; use_thread && i < NBUF; i++)
    if (!(w.buf[i] = malloc(TBUF))) return 1;
  if (argc != 3) {
    fprintf(stderr, "usage: upsink [-s] [-t] PORT FILE\n");
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
