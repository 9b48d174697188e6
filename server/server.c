/* server — see server.h. */
#include "server/server.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "server/conn.h"
#include "core/daemon.h"
#include "server/h2.h"
#include "server/http1.h"
#include "core/log.h"
#include "server/router.h"

struct server {
  uv_tcp_t tcp;
  int port;
};

/* What an API connection speaks: the protocol cores, the router. */
static const hserve server_api = {router_dispatch, http1_conn_init, h2_conn_init, h2_settings_valid};

static void server_on_conn(uv_stream_t *s, int status) {
  if (status < 0) {
    LOG_WARN("accept failed err=%s", uv_strerror(status));
    return;
  }
  conn_accept(s, &server_api);
}

static int server_parse(const char *addr, struct sockaddr_storage *ss) {
  char host[128];
  const char *colon = strrchr(addr, ':');
  if (!colon) return UV_EINVAL;
  size_t hl = (size_t)(colon - addr);
  if (hl >= sizeof host) return UV_EINVAL;
  memcpy(host, addr, hl);
  host[hl] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535 || colon[1] == 0) return UV_EINVAL;
  if (hl >= 2 && host[0] == '[' && host[hl - 1] == ']') {
    host[hl - 1] = 0;
    return uv_ip6_addr(host + 1, (int)port, (struct sockaddr_in6 *)ss);
  }
  return uv_ip4_addr(hl ? host : "0.0.0.0", (int)port, (struct sockaddr_in *)ss);
}

/* s listens: it is the API server from now on (its port for ":0"). */
static void server_serving(struct server *s) {
  struct sockaddr_storage bound;
  int bl = sizeof bound;
  uv_tcp_getsockname(&s->tcp, (struct sockaddr *)&bound, &bl);
  s->port = ntohs(bound.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&bound)->sin6_port
                                              : ((struct sockaddr_in *)&bound)->sin_port);
  conch.server = s;
  conch.api_serving = 1;
}

int server_listen(const char *addr) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  int r = server_parse(addr, &ss);
  if (r) {
    LOG_ERROR("invalid listen address addr=%s", addr);
    return r;
  }
  struct server *s = calloc(1, sizeof *s);
  if (!s) return UV_ENOMEM;
  uv_tcp_init(conch.loop, &s->tcp);
  if ((r = uv_tcp_bind(&s->tcp, (struct sockaddr *)&ss, 0)) != 0 ||
      (r = uv_listen((uv_stream_t *)&s->tcp, 1024, server_on_conn)) != 0) {
    LOG_ERROR("listen failed addr=%s err=%s", addr, uv_strerror(r));
    uv_close((uv_handle_t *)&s->tcp, (uv_close_cb)free);
    return r;
  }
  server_serving(s);
  LOG_INFO("serving agent API addr=%s port=%d", addr, s->port);
  return 0;
}

int server_port(void) { return conch.server ? conch.server->port : 0; }

void server_adopt_conn(int fd) { conn_adopt(fd, &server_api); }

int server_detach(void) {
  struct server *s = conch.server;
  if (!s) return -ENOENT;
  uv_os_fd_t fd;
  if (uv_fileno((uv_handle_t *)&s->tcp, &fd) != 0) return -EBADF;
  int keep = fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (keep < 0) return -errno;
  conch.server = NULL;
  uv_close((uv_handle_t *)&s->tcp, (uv_close_cb)free);
  return keep;
}

int server_adopt(int fd) {
  struct server *s = calloc(1, sizeof *s);
  if (!s) return UV_ENOMEM;
  uv_tcp_init(conch.loop, &s->tcp);
  int r = uv_tcp_open(&s->tcp, fd);
  if (r == 0) r = uv_listen((uv_stream_t *)&s->tcp, 1024, server_on_conn);
  if (r != 0) {
    LOG_ERROR("cannot serve on the inherited listener fd=%d: %s", fd, uv_strerror(r));
    uv_close((uv_handle_t *)&s->tcp, (uv_close_cb)free); /* closes fd */
    return r;
  }
  server_serving(s);
  return 0;
}
