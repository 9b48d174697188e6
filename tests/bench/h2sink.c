/* h2sink — the least an h2c server can do with an upload: read the DATA
 * frames and drop them.  One connection at a time on 127.0.0.1:PORT,
 * prior knowledge, blocking I/O, nghttp2 with its automatic WINDOW_UPDATEs;
 * every request gets a 200 with no body once its stream ends, and a
 * header "x-received" with the body bytes seen.  The stream window is
 * the agent's (server/h2.h: 1 MiB, the connection 16 MiB) unless -w/-W
 * give powers of two.  Meant to show curl's own h2c upload ceiling; it
 * does not: blocking, one read and one flush at a time, it receives
 * slower than the agent, which also writes the file (profile.md,
 * PostFileStream).  Kept to reproduce that.
 *
 *   cc -O2 -o h2sink tests/bench/h2sink.c -lnghttp2
 *   ./h2sink [-w LOG2] [-W LOG2] PORT &
 *   curl -s --http2-prior-knowledge -o /dev/null -D - -T FILE http://127.0.0.1:PORT/
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct conn {
  int fd;
  unsigned long long received; /* body bytes of the current stream */
} conn;

static ssize_t on_send(nghttp2_session *s, const uint8_t *d, size_t n, int flags, void *u) {
  (void)s, (void)flags;
  conn *c = u;
  size_t off = 0;
  while (off < n) {
    ssize_t w = send(c->fd, d + off, n - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return NGHTTP2_ERR_CALLBACK_FAILURE;
    off += (size_t)w;
  }
  return (ssize_t)n;
}

static int on_data(nghttp2_session *s, uint8_t flags, int32_t id, const uint8_t *d, size_t n, void *u) {
  (void)s, (void)flags, (void)id, (void)d;
  ((conn *)u)->received += n;
  return 0;
}

static int on_frame(nghttp2_session *s, const nghttp2_frame *f, void *u) {
  conn *c = u;
  if ((f->hd.type == NGHTTP2_HEADERS || f->hd.type == NGHTTP2_DATA) && (f->hd.flags & NGHTTP2_FLAG_END_STREAM)) {
    char n[32];
    snprintf(n, sizeof n, "%llu", c->received);
    nghttp2_nv h[] = {{(uint8_t *)":status", (uint8_t *)"200", 7, 3, NGHTTP2_NV_FLAG_NONE},
                      {(uint8_t *)"x-received", (uint8_t *)n, 10, strlen(n), NGHTTP2_NV_FLAG_NONE}};
    nghttp2_submit_response(s, f->hd.stream_id, h, 2, NULL);
    c->received = 0;
  }
  return 0;
}

static void serve(int fd, int wlog, int Wlog) {
  conn c = {fd, 0};
  nghttp2_session_callbacks *cb;
  nghttp2_session_callbacks_new(&cb);
  nghttp2_session_callbacks_set_send_callback(cb, on_send);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, on_data);
  nghttp2_session_callbacks_set_on_frame_recv_callback(cb, on_frame);
  nghttp2_session *s;
  nghttp2_session_server_new(&s, cb, &c);
  nghttp2_session_callbacks_del(cb);
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, 100},
                                 {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (1u << wlog) - (wlog == 31)}};
  nghttp2_submit_settings(s, NGHTTP2_FLAG_NONE, iv, 2);
  nghttp2_session_set_local_window_size(s, NGHTTP2_FLAG_NONE, 0, (int32_t)((1u << Wlog) - (Wlog == 31)));
  static uint8_t buf[65536];
  while (nghttp2_session_want_read(s) || nghttp2_session_want_write(s)) {
    if (nghttp2_session_send(s) != 0) break;
    ssize_t r = recv(fd, buf, sizeof buf, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    if (nghttp2_session_mem_recv(s, buf, (size_t)r) < 0) break;
  }
  nghttp2_session_del(s);
}

int main(int argc, char **argv) {
  int wlog = 20, Wlog = 24, opt;
  while ((opt = getopt(argc, argv, "w:W:")) != -1) {
    if (opt == 'w') wlog = atoi(optarg);
    else if (opt == 'W') Wlog = atoi(optarg);
    else return 2;
  }
  if (optind + 1 != argc || wlog < 14 || wlog > 31 || Wlog < 16 || Wlog > 31) {
    fprintf(stderr, "usage: %s [-w LOG2 14..31] [-W LOG2 16..31] PORT\n", argv[0]);
    return 2;
  }
  int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[optind])),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 16) != 0) {
    perror("h2sink");
    return 1;
  }
  for (;;) {
    int fd = accept(ls, NULL, NULL);
    if (fd < 0) continue;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    serve(fd, wlog, Wlog);
    close(fd);
  }
}
