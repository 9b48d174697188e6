/* netlink — the few rtnetlink requests conch-init needs (boot.md §4), over a
 * raw NETLINK_ROUTE socket (no libnl, no `ip`).  IPv4 only.
 *
 * Blocking request/response on a local kernel socket with a 2 s receive
 * timeout; callers run it in the thread pool (network.c).  Every function
 * returns 0 (or 1 for "present"), or -errno.
 */
#ifndef CONCH_INIT_NETLINK_H
#define CONCH_INIT_NETLINK_H

#include <net/if.h>
#include <stdint.h>

typedef struct nl_sock {
  int fd;
  uint32_t seq;
} nl_sock;

typedef struct nl_links {
  int lo_index;       /* first link with IFF_LOOPBACK, 0 if none */
  int guest_index;    /* lowest ifindex without IFF_LOOPBACK, 0 if none */
  unsigned guest_flags;
  char guest_name[IF_NAMESIZE];
} nl_links;

int nl_open(nl_sock *nl);
void nl_close(nl_sock *nl);

int nl_get_links(nl_sock *nl, nl_links *out);
int nl_link_up(nl_sock *nl, int ifindex);
/* Addresses and routes; ip/gw in host byte order. */
int nl_addr_present(nl_sock *nl, int ifindex, uint32_t ip, unsigned prefix);
int nl_addr_add(nl_sock *nl, int ifindex, uint32_t ip, unsigned prefix);
/* A main-table IPv4 default route via gw out of ifindex. */
int nl_default_route_present(nl_sock *nl, int ifindex, uint32_t gw);
int nl_default_route_add(nl_sock *nl, int ifindex, uint32_t gw);

/* Go-style error text ("file exists") for a positive errno. */
const char *nl_strerror(int err, char *buf, size_t len);

#endif
