/* initproto_listen — the init protocol's listeners ("unix:PATH",
 * "vsock:PORT"): one connection accepted at a time, in accept order; see
 * initproto.h and initproto_int.h. */
#include "init/initproto_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h> /* before vm_sockets.h: older uapi headers (arm64 cross) need it */
#include <linux/vm_sockets.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"

#define IP_ACCEPT_BACKOFF_MS 100

void ip_listeners_pause(void) {
  for (size_t i = 0; i < ips.nlst; i++)
    if (ips.lst[i]->polling) {
      uv_poll_stop(&ips.lst[i]->poll);
      ips.lst[i]->polling = 0;
    }
}

static void on_accept(uv_poll_t *p, int status, int events);

void ip_listeners_resume(void) {
  if (ips.active || ips.frozen) return;
  if (ips.backoff && uv_is_active((uv_handle_t *)ips.backoff)) return;
  for (size_t i = 0; i < ips.nlst; i++)
    if (!ips.lst[i]->polling) {
      uv_poll_start(&ips.lst[i]->poll, UV_READABLE, on_accept);
      ips.lst[i]->polling = 1;
    }
}

static void backoff_done(uv_timer_t *t) {
  (void)t;
  ip_listeners_resume();
}

static void on_accept(uv_poll_t *p, int status, int events) {
  ip_listener *l = p->data;
  (void)events;
  if (ips.active) {
    ip_listeners_pause();
    return;
  }
  if (status < 0) {
    LOG_WARN("init listener error: %s", uv_strerror(status));
    return;
  }
  int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
    LOG_WARN("init listener accept failed: %s (pausing %d ms)", strerror(errno), IP_ACCEPT_BACKOFF_MS);
    ip_listeners_pause();
    if (!ips.backoff && (ips.backoff = malloc(sizeof *ips.backoff)) != NULL)
      uv_timer_init(conch.loop, ips.backoff);
    if (ips.backoff)
      uv_timer_start(ips.backoff, backoff_done, IP_ACCEPT_BACKOFF_MS, 0);
    else
      ip_listeners_resume();
    return;
  }
  ip_listeners_pause();
  ip_conn_start(fd, ip_apply_frame, ip_listeners_resume);
}

static int listen_unix(const char *path, ip_listener *l) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t pl = strlen(path);
  if (pl == 0 || pl >= sizeof sa.sun_path) return -ENAMETOOLONG;
  memcpy(sa.sun_path, path, pl + 1);
  struct stat st;
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return -EEXIST;
    if (unlink(path) != 0) return -errno;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  snprintf(l->unix_path, sizeof l->unix_path, "%s", path);
  return fd;
}

static int listen_vsock(const char *port_s) {
  char *end;
  errno = 0;
  unsigned long port = strtoul(port_s, &end, 10);
  if (errno || end == port_s || *end || port > 0xffffffffUL || port_s[0] == '-') return -EINVAL;
  int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -errno;
  struct sockaddr_vm sa = {.svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY, .svm_port = (unsigned)port};
  if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 16) != 0) {
    int e = errno;
    close(fd);
    return -e;
  }
  return fd;
}

int initproto_listen(const char *spec) {
  if (!conch.loop) return -EINVAL;
  if (ips.nlst == IP_MAX_LISTENERS) return -EMFILE;
  if (!ips.resolv_path[0]) {
    initproto_opts zero = {0};
    initproto_configure(&zero);
  }
  ip_listener *l = calloc(1, sizeof *l);
  if (!l) return -ENOMEM;
  int fd;
  if (strncmp(spec, "unix:", 5) == 0)
    fd = listen_unix(spec + 5, l);
  else if (strncmp(spec, "vsock:", 6) == 0)
    fd = listen_vsock(spec + 6);
  else
    fd = -EINVAL;
  if (fd < 0) {
    free(l);
    return fd;
  }
  l->fd = fd;
  int rc = uv_poll_init_socket(conch.loop, &l->poll, fd);
  if (rc != 0) {
    close(fd);
    if (l->unix_path[0]) unlink(l->unix_path);
    free(l);
    return rc;
  }
  l->poll.data = l;
  ips.lst[ips.nlst++] = l;
  LOG_INFO("listening for init messages on %s", spec);
  ip_listeners_resume();
  return 0;
}

/* Close callback for handles that are the first member of a malloc'd
 * block (ip_listener.poll is not: it uses data). */
static void free_handle_owner(uv_handle_t *h) {
  if (h->type == UV_POLL)
    free(h->data);
  else
    free(h);
}

void initproto_close(void) {
  for (size_t i = 0; i < ips.nlst; i++) {
    ip_listener *l = ips.lst[i];
    uv_close((uv_handle_t *)&l->poll, free_handle_owner);
    close(l->fd);  /* after uv_close: the poll watcher is already stopped */
    l->fd = -1;
    if (l->unix_path[0]) unlink(l->unix_path);
  }
  ips.nlst = 0;
  if (ips.backoff) uv_close((uv_handle_t *)ips.backoff, free_handle_owner);
  if (ips.active) {
    ip_conn_abort(ips.active);
  }
  free(ips.terminal);
  free(ips.sandbox_id);
  memset(&ips, 0, sizeof ips);
  ips.state = INITPROTO_AWAITING_NETWORK;
}

