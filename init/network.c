/* network — cold apply and revalidation over rtnetlink; see network.h. */
#include "init/network.h"

#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "init/initstr.h"
#include "init/netlink.h"

static char *text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *text(const char *fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  char *p = strdup(buf);
  return p ? p : strdup("out of memory");
}

static char *errtext(const char *prefix, int neg_errno) {
  char e[128];
  return text("%s: %s", prefix, nl_strerror(-neg_errno, e, sizeof e));
}

int network_write_resolv(const char *path, const char *data, size_t len) {
  if (unlink(path) != 0 && errno != ENOENT) return -errno;
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  int rc = 0;
  if (fchmod(fd, 0644) != 0) rc = -errno;
  size_t off = 0;
  while (rc == 0 && off < len) {
    ssize_t w = write(fd, data + off, len - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      rc = -errno;
    } else {
      off += (size_t)w;
    }
  }
  if (close(fd) != 0 && rc == 0) rc = -errno;
  return rc;
}

static char *write_resolv(const network_cfg *c) {
  int rc = network_write_resolv(c->resolv_path, c->resolv, c->resolv_len);
  return rc ? errtext("install resolver config", rc) : NULL;
}

char *network_apply(const network_cfg *c) {
  if (!c->do_links) return write_resolv(c);
  nl_sock nl;
  int rc = nl_open(&nl);
  if (rc) return errtext("list network interfaces", rc);
  char *res = NULL;
  nl_links l;
  if ((rc = nl_get_links(&nl, &l)) != 0) {
    res = errtext("list network interfaces", rc);
  } else if (!l.guest_index) {
    res = text("no non-loopback network interface found");
  } else if (!l.lo_index) {
    res = errtext("bring loopback up", -ENODEV);
  } else if ((rc = nl_link_up(&nl, l.lo_index)) != 0) {
    res = errtext("bring loopback up", rc);
  } else if ((rc = nl_addr_present(&nl, l.guest_index, c->ip, c->prefix)) < 0 ||
             (rc == 0 && (rc = nl_addr_add(&nl, l.guest_index, c->ip, c->prefix)) != 0)) {
    res = errtext("assign guest address", rc);
  } else if ((rc = nl_link_up(&nl, l.guest_index)) != 0) {
    res = errtext("bring guest interface up", rc);
  } else if ((rc = nl_default_route_present(&nl, l.guest_index, c->gw)) < 0 ||
             (rc == 0 && (rc = nl_default_route_add(&nl, l.guest_index, c->gw)) != 0)) {
    res = errtext("set default route", rc);
  }
  nl_close(&nl);
  return res ? res : write_resolv(c);
}

char *network_revalidate(const network_cfg *c) {
  if (!c->do_links) return write_resolv(c);
  nl_sock nl;
  int rc = nl_open(&nl);
  if (rc) return errtext("list network interfaces", rc);
  char *res = NULL;
  nl_links l;
  char ip[16], gw[16];
  initstr_ipv4_fmt(c->ip, ip);
  initstr_ipv4_fmt(c->gw, gw);
  if ((rc = nl_get_links(&nl, &l)) != 0) {
    res = errtext("list network interfaces", rc);
  } else if (!l.guest_index) {
    res = text("no non-loopback network interface found");
  } else if (!(l.guest_flags & IFF_UP)) {
    res = text("guest interface is not up");
  } else if ((rc = nl_addr_present(&nl, l.guest_index, c->ip, c->prefix)) <= 0) {
    res = rc < 0 ? errtext("list guest addresses", rc)
                 : text("guest interface does not have required address %s/%u", ip, c->prefix);
  } else if ((rc = nl_default_route_present(&nl, l.guest_index, c->gw)) <= 0) {
    res = rc < 0 ? errtext("list routes", rc)
                 : text("guest interface does not have required default gateway %s", gw);
  }
  nl_close(&nl);
  return res ? res : write_resolv(c);
}
