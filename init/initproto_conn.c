/* initproto_conn — one init protocol connection: a frame in (2 s receive
 * timeout), a frame out (2 s send timeout), close; see initproto_int.h. */
#include "init/initproto_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"

#define IP_RECV_TIMEOUT_MS 2000
#define IP_SEND_TIMEOUT_MS 2000

void ip_conn_maybe_free(ip_conn *c) {
  if (c->phase == PH_CLOSED && c->handles_open == 0 && !c->work_pending && !c->fs_pending) {
    free(c->body);
    free(c->resp);
    free(c->work_result);
    initmsg_plan_free(&c->plan);
    free(c);
  }
}

/* Both handles are closed after the phase became PH_CLOSED; a pool job or
 * a stat still out frees it in its callback. */
static void conn_handle_closed(uv_handle_t *h) {
  ip_conn *c = h->data;
  if (--c->handles_open > 0) return;
  ip_conn_maybe_free(c);
}

void ip_conn_finish(ip_conn *c) {
  if (c->phase == PH_CLOSED) return;
  c->phase = PH_CLOSED;
  uv_close((uv_handle_t *)&c->poll, conn_handle_closed); /* stops polling the fd first */
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
  close(c->fd);
  c->fd = -1;
  if (ips.active == c) ips.active = NULL;
  if (c->on_done) c->on_done();
}

void ip_conn_abort(ip_conn *c) {
  if (ips.active == c) ips.active = NULL;
  c->phase = PH_CLOSED;
  uv_close((uv_handle_t *)&c->poll, conn_handle_closed);
  uv_close((uv_handle_t *)&c->timer, conn_handle_closed);
  close(c->fd);
}

void ip_conn_reject(ip_conn *c, const char *why) {
  LOG_WARN("init message rejected without response: %s", why);
  ip_conn_finish(c);
}

static void conn_on_io(uv_poll_t *p, int status, int events);

static void conn_send_timeout(uv_timer_t *t) {
  ip_conn *c = t->data;
  LOG_WARN("init response not sent: send timeout after %d ms", IP_SEND_TIMEOUT_MS);
  ip_conn_finish(c);
}

static void conn_try_send(ip_conn *c) {
  while (c->sent < c->resp_len) {
    ssize_t w = send(c->fd, c->resp + c->sent, c->resp_len - c->sent, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        uv_poll_start(&c->poll, UV_WRITABLE, conn_on_io);
        return;
      }
      LOG_WARN("init response not sent: %s", strerror(errno));
      ip_conn_finish(c);
      return;
    }
    c->sent += (size_t)w;
  }
  ip_conn_finish(c);
}

void ip_conn_respond(ip_conn *c, const char *body, size_t len) {
  c->resp = malloc(len + 4);
  if (!c->resp) {
    LOG_ERROR("init response not sent: out of memory");
    ip_conn_finish(c);
    return;
  }
  c->resp[0] = (char)(len >> 24);
  c->resp[1] = (char)(len >> 16);
  c->resp[2] = (char)(len >> 8);
  c->resp[3] = (char)len;
  memcpy(c->resp + 4, body, len);
  c->resp_len = len + 4;
  c->sent = 0;
  c->phase = PH_SEND;
  uv_timer_stop(&c->timer);
  uv_timer_start(&c->timer, conn_send_timeout, IP_SEND_TIMEOUT_MS, 0);
  conn_try_send(c);
}

void ip_respond_simple(ip_conn *c, int ready, int retryable, const char *msg) {
  size_t len;
  char *body = initmsg_response(ready, retryable, msg, &len);
  if (!body) {
    LOG_ERROR("init response not sent: out of memory");
    ip_conn_finish(c);
    return;
  }
  ip_conn_respond(c, body, len);
  free(body);
}


static void conn_read(ip_conn *c) {
  for (;;) {
    char *dst;
    size_t want;
    if (c->phase == PH_HEADER) {
      dst = (char *)c->hdr + c->got;
      want = 4 - c->got;
    } else {
      dst = c->body + c->got;
      want = c->len - c->got;
    }
    ssize_t r = recv(c->fd, dst, want, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      char why[96];
      snprintf(why, sizeof why, "read error: %s", strerror(errno));
      ip_conn_reject(c, why);
      return;
    }
    if (r == 0) {
      char why[96];
      snprintf(why, sizeof why, "truncated frame (%s: got %zu of %u bytes)",
               c->phase == PH_HEADER ? "header" : "body", c->got,
               c->phase == PH_HEADER ? 4u : c->len);
      ip_conn_reject(c, why);
      return;
    }
    c->got += (size_t)r;
    if (c->phase == PH_HEADER && c->got == 4) {
      c->len = (uint32_t)c->hdr[0] << 24 | (uint32_t)c->hdr[1] << 16 | (uint32_t)c->hdr[2] << 8 | c->hdr[3];
      if (c->len < 1 || c->len > INITMSG_MAX_FRAME) {
        char why[96];
        snprintf(why, sizeof why, "frame size %u outside [1, %d]", c->len, INITMSG_MAX_FRAME);
        ip_conn_reject(c, why);
        return;
      }
      c->body = malloc(c->len);
      if (!c->body) {
        ip_conn_reject(c, "out of memory");
        return;
      }
      c->phase = PH_BODY;
      c->got = 0;
    } else if (c->phase == PH_BODY && c->got == c->len) {
      uv_timer_stop(&c->timer);
      uv_poll_stop(&c->poll);
      c->on_frame(c);
      return;
    }
  }
}

static void conn_on_io(uv_poll_t *p, int status, int events) {
  ip_conn *c = p->data;
  if (c->phase == PH_CLOSED) return;
  if (c->phase == PH_SEND) {
    if (status < 0) {
      LOG_WARN("init response not sent: %s", uv_strerror(status));
      ip_conn_finish(c);
      return;
    }
    conn_try_send(c);
    return;
  }
  if (c->phase == PH_HEADER || c->phase == PH_BODY) {
    if (status < 0) {
      ip_conn_reject(c, uv_strerror(status));
      return;
    }
    (void)events;
    conn_read(c);
  }
}

static void conn_recv_timeout(uv_timer_t *t) {
  ip_conn *c = t->data;
  char why[96];
  snprintf(why, sizeof why, "receive timeout after %d ms", IP_RECV_TIMEOUT_MS);
  ip_conn_reject(c, why);
}

void ip_conn_start(int fd, void (*on_frame)(ip_conn *c), void (*on_done)(void)) {
  ip_conn *c = calloc(1, sizeof *c);
  if (!c) {
    LOG_ERROR("init connection dropped: out of memory");
    close(fd);
    return;
  }
  c->fd = fd;
  c->phase = PH_HEADER;
  c->on_frame = on_frame;
  c->on_done = on_done;
  if (uv_poll_init_socket(conch.loop, &c->poll, fd) != 0) {
    LOG_ERROR("init connection dropped: cannot watch socket");
    close(fd);
    free(c);
    return;
  }
  uv_timer_init(conch.loop, &c->timer);
  c->poll.data = c->timer.data = c;
  c->handles_open = 2;
  ips.active = c;
  uv_timer_start(&c->timer, conn_recv_timeout, IP_RECV_TIMEOUT_MS, 0);
  uv_poll_start(&c->poll, UV_READABLE, conn_on_io);
}

