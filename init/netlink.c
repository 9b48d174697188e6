/* netlink — raw rtnetlink requests; see netlink.h. */
#include "init/netlink.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#define NL_BUF 32768

const char *nl_strerror(int err, char *buf, size_t len) {
  char tmp[128];
  const char *s = strerror_r(err, tmp, sizeof tmp);
  snprintf(buf, len, "%s", s);
  if (buf[0]) buf[0] = (char)tolower((unsigned char)buf[0]);
  return buf;
}

int nl_open(nl_sock *nl) {
  nl->seq = 1;
  nl->fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
  if (nl->fd < 0) return -errno;
  struct timeval tv = {2, 0};
  setsockopt(nl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(nl->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
  if (bind(nl->fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    int e = errno;
    close(nl->fd);
    nl->fd = -1;
    return -e;
  }
  return 0;
}

void nl_close(nl_sock *nl) {
  if (nl->fd >= 0) close(nl->fd);
  nl->fd = -1;
}

/* A request under construction. */
typedef struct nl_req {
  struct nlmsghdr h;
  char body[512];
} nl_req;

static void *req_body(nl_req *r, size_t len) {
  r->h.nlmsg_len = NLMSG_LENGTH(len);
  return NLMSG_DATA(&r->h);
}

static int add_attr(nl_req *r, unsigned short type, const void *data, size_t len) {
  size_t off = NLMSG_ALIGN(r->h.nlmsg_len);
  size_t alen = RTA_LENGTH(len);
  if (off + RTA_ALIGN(alen) > sizeof *r) return -ENOBUFS;
  struct rtattr *a = (struct rtattr *)((char *)r + off);
  a->rta_type = type;
  a->rta_len = (unsigned short)alen;
  memcpy(RTA_DATA(a), data, len);
  r->h.nlmsg_len = (uint32_t)(off + RTA_ALIGN(alen));
  return 0;
}

typedef int (*nl_msg_cb)(const struct nlmsghdr *h, void *arg);

/* Send r and read replies until ACK/error (or DONE for dumps), handing
 * every data message to cb. */
static int nl_talk(nl_sock *nl, nl_req *r, nl_msg_cb cb, void *arg) {
  static __thread char buf[NL_BUF] __attribute__((aligned(NLMSG_ALIGNTO)));
  int dump = (r->h.nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  r->h.nlmsg_seq = ++nl->seq;
  /* dumps end with NLMSG_DONE; everything else asks for an ACK */
  r->h.nlmsg_flags |= NLM_F_REQUEST | (dump ? 0 : NLM_F_ACK);
  struct sockaddr_nl kern = {.nl_family = AF_NETLINK};
  ssize_t w;
  do w = sendto(nl->fd, r, r->h.nlmsg_len, 0, (struct sockaddr *)&kern, sizeof kern);
  while (w < 0 && errno == EINTR);
  if (w < 0) return -errno;
  int cb_rc = 0;
  for (;;) {
    struct sockaddr_nl from;
    socklen_t fl = sizeof from;
    ssize_t n = recvfrom(nl->fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno == EAGAIN ? -ETIMEDOUT : -errno;
    }
    if (from.nl_pid != 0) continue;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_seq != nl->seq) continue;
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr))) return -EPROTO;
        const struct nlmsgerr *e = NLMSG_DATA(h);
        if (e->error) return e->error;
        if (!dump) return cb_rc;
        continue;
      }
      if (h->nlmsg_type == NLMSG_DONE) return cb_rc;
      if (cb && cb_rc == 0) cb_rc = cb(h, arg);
    }
  }
}

/* ------------------------------------------------------------ links */

static int links_cb(const struct nlmsghdr *h, void *arg) {
  nl_links *out = arg;
  if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifinfomsg))) return 0;
  const struct ifinfomsg *ifi = NLMSG_DATA(h);
  if (ifi->ifi_index <= 0) return 0;
  if (ifi->ifi_flags & IFF_LOOPBACK) {
    if (!out->lo_index || ifi->ifi_index < out->lo_index) out->lo_index = ifi->ifi_index;
    return 0;
  }
  if (out->guest_index && ifi->ifi_index > out->guest_index) return 0;
  out->guest_index = ifi->ifi_index;
  out->guest_flags = ifi->ifi_flags;
  out->guest_name[0] = 0;
  int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *ifi));
  for (const struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
    if (a->rta_type == IFLA_IFNAME) {
      size_t l = RTA_PAYLOAD(a);
      if (l >= IF_NAMESIZE) l = IF_NAMESIZE - 1;
      memcpy(out->guest_name, RTA_DATA(a), l);
      out->guest_name[l] = 0;
      out->guest_name[strnlen(out->guest_name, l)] = 0;
    }
  }
  return 0;
}

int nl_get_links(nl_sock *nl, nl_links *out) {
  memset(out, 0, sizeof *out);
  nl_req r = {0};
  struct ifinfomsg *ifi = req_body(&r, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  r.h.nlmsg_type = RTM_GETLINK;
  r.h.nlmsg_flags = NLM_F_DUMP;
  return nl_talk(nl, &r, links_cb, out);
}

int nl_link_up(nl_sock *nl, int ifindex) {
  nl_req r = {0};
  struct ifinfomsg *ifi = req_body(&r, sizeof *ifi);
  ifi->ifi_family = AF_UNSPEC;
  ifi->ifi_index = ifindex;
  ifi->ifi_flags = IFF_UP;
  ifi->ifi_change = IFF_UP;
  r.h.nlmsg_type = RTM_NEWLINK;
  return nl_talk(nl, &r, NULL, NULL);
}

/* ------------------------------------------------------------ addresses */

struct addr_q {
  int ifindex;
  uint32_t ip; /* network order */
  unsigned prefix;
  int found;
};

static int addr_cb(const struct nlmsghdr *h, void *arg) {
  struct addr_q *q = arg;
  if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifaddrmsg))) return 0;
  const struct ifaddrmsg *ifa = NLMSG_DATA(h);
  if (ifa->ifa_family != AF_INET || (int)ifa->ifa_index != q->ifindex || ifa->ifa_prefixlen != q->prefix)
    return 0;
  int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *ifa));
  uint32_t local = 0, address = 0;
  int have_local = 0, have_address = 0;
  for (const struct rtattr *a = IFA_RTA(ifa); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
    if (RTA_PAYLOAD(a) != 4) continue;
    if (a->rta_type == IFA_LOCAL) {
      memcpy(&local, RTA_DATA(a), 4);
      have_local = 1;
    } else if (a->rta_type == IFA_ADDRESS) {
      memcpy(&address, RTA_DATA(a), 4);
      have_address = 1;
    }
  }
  uint32_t mine = have_local ? local : address;
  if ((have_local || have_address) && mine == q->ip) q->found = 1;
  return 0;
}

int nl_addr_present(nl_sock *nl, int ifindex, uint32_t ip, unsigned prefix) {
  nl_req r = {0};
  struct ifaddrmsg *ifa = req_body(&r, sizeof *ifa);
  ifa->ifa_family = AF_INET;
  r.h.nlmsg_type = RTM_GETADDR;
  r.h.nlmsg_flags = NLM_F_DUMP;
  struct addr_q q = {ifindex, htonl(ip), prefix, 0};
  int rc = nl_talk(nl, &r, addr_cb, &q);
  return rc < 0 ? rc : q.found;
}

int nl_addr_add(nl_sock *nl, int ifindex, uint32_t ip, unsigned prefix) {
  nl_req r = {0};
  struct ifaddrmsg *ifa = req_body(&r, sizeof *ifa);
  ifa->ifa_family = AF_INET;
  ifa->ifa_prefixlen = (unsigned char)prefix;
  ifa->ifa_scope = RT_SCOPE_UNIVERSE;
  ifa->ifa_index = (unsigned)ifindex;
  r.h.nlmsg_type = RTM_NEWADDR;
  r.h.nlmsg_flags = NLM_F_CREATE | NLM_F_EXCL;
  uint32_t a = htonl(ip);
  int rc = add_attr(&r, IFA_LOCAL, &a, 4);
  if (!rc) rc = add_attr(&r, IFA_ADDRESS, &a, 4);
  if (!rc && prefix <= 30) {
    uint32_t brd = htonl(ip | (0xffffffffu >> prefix));
    rc = add_attr(&r, IFA_BROADCAST, &brd, 4);
  }
  return rc ? rc : nl_talk(nl, &r, NULL, NULL);
}

/* ------------------------------------------------------------ routes */

struct route_q {
  int ifindex;
  uint32_t gw; /* network order */
  int found;
};

static int route_cb(const struct nlmsghdr *h, void *arg) {
  struct route_q *q = arg;
  if (h->nlmsg_type != RTM_NEWROUTE || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct rtmsg))) return 0;
  const struct rtmsg *rt = NLMSG_DATA(h);
  if (rt->rtm_family != AF_INET || rt->rtm_dst_len != 0 || rt->rtm_type != RTN_UNICAST) return 0;
  unsigned table = rt->rtm_table;
  uint32_t gw = 0;
  int oif = 0, have_gw = 0;
  int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof *rt));
  for (const struct rtattr *a = RTM_RTA(rt); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
    if (a->rta_type == RTA_TABLE && RTA_PAYLOAD(a) == 4) memcpy(&table, RTA_DATA(a), 4);
    if (a->rta_type == RTA_GATEWAY && RTA_PAYLOAD(a) == 4) {
      memcpy(&gw, RTA_DATA(a), 4);
      have_gw = 1;
    }
    if (a->rta_type == RTA_OIF && RTA_PAYLOAD(a) == 4) memcpy(&oif, RTA_DATA(a), 4);
  }
  if (table == RT_TABLE_MAIN && have_gw && gw == q->gw && oif == q->ifindex) q->found = 1;
  return 0;
}

int nl_default_route_present(nl_sock *nl, int ifindex, uint32_t gw) {
  nl_req r = {0};
  struct rtmsg *rt = req_body(&r, sizeof *rt);
  rt->rtm_family = AF_INET;
  r.h.nlmsg_type = RTM_GETROUTE;
  r.h.nlmsg_flags = NLM_F_DUMP;
  struct route_q q = {ifindex, htonl(gw), 0};
  int rc = nl_talk(nl, &r, route_cb, &q);
  return rc < 0 ? rc : q.found;
}

int nl_default_route_add(nl_sock *nl, int ifindex, uint32_t gw) {
  nl_req r = {0};
  struct rtmsg *rt = req_body(&r, sizeof *rt);
  rt->rtm_family = AF_INET;
  rt->rtm_dst_len = 0;
  rt->rtm_table = RT_TABLE_MAIN;
  rt->rtm_protocol = RTPROT_BOOT;
  rt->rtm_scope = RT_SCOPE_UNIVERSE;
  rt->rtm_type = RTN_UNICAST;
  r.h.nlmsg_type = RTM_NEWROUTE;
  r.h.nlmsg_flags = NLM_F_CREATE;
  uint32_t g = htonl(gw);
  int rc = add_attr(&r, RTA_GATEWAY, &g, 4);
  if (!rc) rc = add_attr(&r, RTA_OIF, &ifindex, 4);
  return rc ? rc : nl_talk(nl, &r, NULL, NULL);
}
