/* net/relay_handover — the forwarders and relayed connections across an
 * upgrade in place (net/service.h); relay.c keeps them. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/budget.h"
#include "core/handover.h"
#include "core/list.h"
#include "core/log.h"
#include "net/relay_int.h"
#include "net/service.h"
#include "proto/handover.pb-c.h"

/* ---- upgrade in place (net/service.h) ----
 * A forwarder is its listening socket; a relayed connection is its two
 * sockets and two pipes, whose bytes stay in the kernel across the exec:
 * the state names their descriptors (net_handover_keep_fds: the
 * handover clears their close-on-exec) and the counts that say what each pipe holds. */

static struct {
  Conch__Handover__Net net;
  Conch__Handover__Forwarder **fp, *fa;
  Conch__Handover__Relay **rp, *ra;
  Conch__Handover__RelayDir *da;
} ho;

static void ho_save_dir(const relay_dir *d, Conch__Handover__RelayDir *m) {
  conch__handover__relay_dir__init(m);
  m->pipe_r = d->pr;
  m->pipe_w = d->pw;
  m->held = d->held;
  m->eof = d->eof;
  m->shut = d->shut;
}

int net_handover_save(Conch__Handover__State *st) {
  conch__handover__net__init(&ho.net);
  st->net = &ho.net;
  ho.net.forward_addr = fwd_addr ? fwd_addr : "";
  size_t nf = 0, nr = 0;
  for (fwd *f = fwds; f; f = f->next) nf += f->listening;
  relay_conn *c;
  list_each(c, &conns, link) nr++;
  ho.fp = calloc(nf + 1, sizeof *ho.fp);
  ho.fa = calloc(nf + 1, sizeof *ho.fa);
  ho.rp = calloc(nr + 1, sizeof *ho.rp);
  ho.ra = calloc(nr + 1, sizeof *ho.ra);
  ho.da = calloc(2 * nr + 1, sizeof *ho.da);
  if (!ho.fp || !ho.fa || !ho.rp || !ho.ra || !ho.da) return -1;
  for (fwd *f = fwds; f; f = f->next) {
    if (!f->listening) continue; /* not bound: the next program's scan tries again */
    Conch__Handover__Forwarder *m = &ho.fa[ho.net.n_forwarders];
    conch__handover__forwarder__init(m);
    m->port = f->port;
    m->fd = f->fd;
    m->family = f->target.ss_family;
    if (f->target.ss_family == AF_INET) {
      m->target.data = (uint8_t *)&((struct sockaddr_in *)&f->target)->sin_addr;
      m->target.len = 4;
    } else {
      m->target.data = (uint8_t *)&((struct sockaddr_in6 *)&f->target)->sin6_addr;
      m->target.len = 16;
    }
    ho.fp[ho.net.n_forwarders++] = m;
  }
  ho.net.forwarders = ho.fp;
  list_each(c, &conns, link) {
    size_t i = ho.net.n_relays;
    Conch__Handover__Relay *m = &ho.ra[i];
    conch__handover__relay__init(m);
    m->client_fd = c->a;
    m->backend_fd = c->b;
    m->connected = c->connected;
    ho_save_dir(&c->up, &ho.da[2 * i]);
    ho_save_dir(&c->down, &ho.da[2 * i + 1]);
    m->up = &ho.da[2 * i];
    m->down = &ho.da[2 * i + 1];
    ho.rp[ho.net.n_relays++] = m;
  }
  ho.net.relays = ho.rp;
  return 0;
}

void net_handover_save_free(Conch__Handover__State *st) {
  free(ho.fp);
  free(ho.fa);
  free(ho.rp);
  free(ho.ra);
  free(ho.da);
  memset(&ho, 0, sizeof ho);
  st->net = NULL;
}

void net_handover_keep_fds(const Conch__Handover__State *st) {
  if (!st->net) return;
  for (size_t i = 0; i < st->net->n_forwarders; i++) handover_keep_fd(st->net->forwarders[i]->fd);
  for (size_t i = 0; i < st->net->n_relays; i++) {
    const Conch__Handover__Relay *r = st->net->relays[i];
    const Conch__Handover__RelayDir *dirs[] = {r->up, r->down};
    handover_keep_fd(r->client_fd);
    handover_keep_fd(r->backend_fd);
    for (int d = 0; d < 2; d++)
      if (dirs[d]) {
        handover_keep_fd(dirs[d]->pipe_r);
        handover_keep_fd(dirs[d]->pipe_w);
      }
  }
}

/* Restore's progress: the state's first ho_taken_f forwarders and
 * ho_taken_r relays are this program's; net_handover_abandon closes the
 * descriptors of the rest. */
static size_t ho_taken_f, ho_taken_r;

static int ho_is(int fd, int want_socket) {
  struct stat sb;
  int type = 0;
  socklen_t len = sizeof type;
  if (fd <= 2 || fstat(fd, &sb) != 0) return 0;
  if (!want_socket) return S_ISFIFO(sb.st_mode);
  return S_ISSOCK(sb.st_mode) && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
}

static int ho_dir_ok(const Conch__Handover__RelayDir *m) {
  return m && ho_is(m->pipe_r, 0) && ho_is(m->pipe_w, 0) && m->held <= NET_PIPE_CAP;
}

static void ho_restore_dir(relay_dir *d, relay_conn *c, const Conch__Handover__RelayDir *m) {
  *d = (relay_dir){.c = c, .pr = m->pipe_r, .pw = m->pipe_w, .held = (size_t)m->held, .eof = m->eof,
                   .shut = m->shut};
}

/* A saved relay's six descriptors (-1 for a direction the state lacks). */
static void ho_relay_fds(const Conch__Handover__Relay *m, int fds[6]) {
  fds[0] = m->client_fd;
  fds[1] = m->backend_fd;
  fds[2] = m->up ? m->up->pipe_r : -1;
  fds[3] = m->up ? m->up->pipe_w : -1;
  fds[4] = m->down ? m->down->pipe_r : -1;
  fds[5] = m->down ? m->down->pipe_w : -1;
}

static int ho_int_cmp(const void *a, const void *b) {
  int x = *(const int *)a, y = *(const int *)b;
  return (x > y) - (x < y);
}

/* Every forwarder and relay of n is one this program can take: sockets
 * and pipes where the state says, no descriptor twice.  0, or -1 with err. */
static int ho_check(const Conch__Handover__Net *n, char *err, size_t errn) {
  for (size_t i = 0; i < n->n_forwarders; i++) {
    const Conch__Handover__Forwarder *m = n->forwarders[i];
    size_t want = m->family == AF_INET ? 4 : m->family == AF_INET6 ? 16 : 0;
    if (!fwd_addr || !want || m->target.len != want || !m->port || m->port > 65535 || !ho_is(m->fd, 1)) {
      snprintf(err, errn, "forwarder %zu of %zu is not one this program can take", i + 1, n->n_forwarders);
      return -1;
    }
  }
  for (size_t i = 0; i < n->n_relays; i++) {
    const Conch__Handover__Relay *m = n->relays[i];
    if (!ho_is(m->client_fd, 1) || !ho_is(m->backend_fd, 1) || !ho_dir_ok(m->up) || !ho_dir_ok(m->down)) {
      snprintf(err, errn, "relayed connection %zu of %zu is not one this program can take", i + 1, n->n_relays);
      return -1;
    }
  }
  size_t nfds = n->n_forwarders + 6 * n->n_relays, k = 0;
  int *fds = malloc((nfds ? nfds : 1) * sizeof *fds);
  if (!fds) {
    snprintf(err, errn, "out of memory");
    return -1;
  }
  for (size_t i = 0; i < n->n_forwarders; i++) fds[k++] = n->forwarders[i]->fd;
  for (size_t i = 0; i < n->n_relays; i++, k += 6) ho_relay_fds(n->relays[i], fds + k);
  qsort(fds, nfds, sizeof *fds, ho_int_cmp);
  int dup = 0;
  for (size_t i = 1; i < nfds && !dup; i++) dup = fds[i] == fds[i - 1];
  free(fds);
  if (dup) {
    snprintf(err, errn, "a descriptor is named twice");
    return -1;
  }
  return 0;
}

int net_handover_restore(const Conch__Handover__State *st, char *err, size_t errn) {
  const Conch__Handover__Net *n = st->net;
  ho_taken_f = ho_taken_r = 0;
  if (!n) return 0;
  /* the old program's address (an init message may have changed the one of
   * the command line, or turned forwarding off) */
  if (net_fwd_config(n->forward_addr && n->forward_addr[0] ? n->forward_addr : NULL) != 0) {
    snprintf(err, errn, "forwarding address %s", n->forward_addr);
    return -1;
  }
  if (ho_check(n, err, errn) != 0) return -1;
  for (size_t i = 0; i < n->n_forwarders; i++, ho_taken_f++) {
    const Conch__Handover__Forwarder *m = n->forwarders[i];
    uv_poll_t *p = malloc(sizeof *p);
    fwd *f = p ? fwd_new((uint16_t)m->port) : NULL;
    if (f) fwd_target(f, (int)m->family, m->target.data);
    if (!f || fwd_listen_on(f, m->fd, p, 0) != 0) {
      if (f) { /* fwd_new put it first */
        fwds = f->next;
        free(f);
      }
      free(p);
      snprintf(err, errn, "cannot take forwarder %zu of %zu", i + 1, n->n_forwarders);
      return -1;
    }
  }
  for (size_t i = 0; i < n->n_relays; i++, ho_taken_r++) {
    const Conch__Handover__Relay *m = n->relays[i];
    relay_conn *c = calloc(1, sizeof *c);
    if (c) {
      c->a = m->client_fd;
      c->b = m->backend_fd;
      c->connected = m->connected;
      ho_restore_dir(&c->up, c, m->up);
      ho_restore_dir(&c->down, c, m->down);
    }
    int linked = c ? relay_link(c) : -1;
    if (linked != 0) {
      if (linked == -1) free(c);
      snprintf(err, errn, "cannot take relayed connection %zu of %zu", i + 1, n->n_relays);
      return -1;
    }
    if (budget_take(c->up.held + c->down.held) != 0) { /* (the same budget as before: should not be) */
      c->up.held = c->down.held = 0;
      c->cut_at_resume = 1;
    }
    relay_held += c->up.held + c->down.held;
  }
  if (n->n_forwarders || n->n_relays) {
    size_t held = 0;
    for (size_t i = 0; i < n->n_relays; i++) held += n->relays[i]->up->held + n->relays[i]->down->held;
    LOG_INFO("upgrade: %zu forwarded ports and %zu relayed connections carried (%zu bytes in their pipes)",
             n->n_forwarders, n->n_relays, held);
  }
  return 0;
}

void net_handover_abandon(const Conch__Handover__State *st) {
  const Conch__Handover__Net *n = st->net;
  if (!n) return;
  size_t closed = 0;
  for (size_t i = ho_taken_f; i < n->n_forwarders; i++, closed++)
    if (n->forwarders[i]->fd > 2) close(n->forwarders[i]->fd);
  for (size_t i = ho_taken_r; i < n->n_relays; i++, closed++) {
    int fds[6];
    ho_relay_fds(n->relays[i], fds);
    for (int j = 0; j < 6; j++)
      if (fds[j] > 2) close(fds[j]);
  }
  if (closed) LOG_WARN("upgrade: %zu forwarders and relayed connections not taken: closed", closed);
}

