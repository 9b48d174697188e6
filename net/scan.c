/* net/scan — one discovery of listening TCP sockets, in the pool.
 *
 * sock_diag (NETLINK_SOCK_DIAG, inet_diag_req_v2) dumps TCP LISTEN sockets
 * of both families in this network namespace: no text parsing, and the
 * kernel filters by state.  Owners are found by socket inode in
 * /proc/<pid>/fd, and only for inodes not seen by an earlier scan: a walk
 * of every process's descriptors costs a readlink per descriptor, so a
 * stable set of listeners costs two dumps a second and nothing else.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "net/net.h"

static int net_inode_cmp(const void *a, const void *b) {
  uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
  return x < y ? -1 : x > y;
}

const net_owner *net_owner_find(const net_scan *s, uint32_t inode) {
  if (!s->nowners) return NULL;
  return bsearch(&inode, s->owners, s->nowners, sizeof *s->owners, net_inode_cmp);
}

void net_owner_forget(net_scan *s, uint32_t inode) {
  const net_owner *o = net_owner_find(s, inode);
  if (!o) return;
  size_t i = (size_t)(o - s->owners);
  memmove(&s->owners[i], &s->owners[i + 1], (s->nowners - i - 1) * sizeof *s->owners);
  s->nowners--;
}

/* Append the family's listeners; 0 or -errno. */
static int net_dump(int fd, int family, net_scan *s, size_t *cap) {
  struct {
    struct nlmsghdr nlh;
    struct inet_diag_req_v2 r;
  } req;
  memset(&req, 0, sizeof req);
  req.nlh.nlmsg_len = sizeof req;
  req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  req.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  req.r.sdiag_family = (uint8_t)family;
  req.r.sdiag_protocol = IPPROTO_TCP;
  req.r.idiag_states = 1u << TCP_LISTEN;
  struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
  if (sendto(fd, &req, sizeof req, 0, (struct sockaddr *)&nl, sizeof nl) < 0) return -errno;
  static __thread char buf[32768] __attribute__((aligned(8)));
  for (;;) {
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (n == 0) return -EIO;
    for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n); h = NLMSG_NEXT(h, n)) {
      if (h->nlmsg_type == NLMSG_DONE) return 0;
      if (h->nlmsg_type == NLMSG_ERROR) {
        struct nlmsgerr *e = NLMSG_DATA(h);
        return e->error ? e->error : -EIO;
      }
      if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
      struct inet_diag_msg *m = NLMSG_DATA(h);
      if (m->idiag_state != TCP_LISTEN || m->idiag_inode == 0) continue;
      if (s->nsocks == NET_SOCKS_MAX) continue;
      if (s->nsocks == *cap) {
        size_t nc = *cap ? *cap * 2 : 64;
        net_sock *ns = realloc(s->socks, nc * sizeof *ns);
        if (!ns) return -ENOMEM;
        s->socks = ns;
        *cap = nc;
      }
      net_sock *k = &s->socks[s->nsocks++];
      memset(k, 0, sizeof *k);
      k->inode = m->idiag_inode;
      k->port = ntohs(m->id.idiag_sport);
      k->family = m->idiag_family;
      memcpy(k->raw, m->id.idiag_src, k->family == AF_INET ? 4 : 16);
      inet_ntop(k->family, k->raw, k->addr, sizeof k->addr);
    }
  }
}

/* inode of "socket:[N]", or 0 */
static uint32_t net_link_inode(int dfd, const char *name) {
  char l[64];
  ssize_t n = readlinkat(dfd, name, l, sizeof l - 1);
  if (n < 9 || memcmp(l, "socket:[", 8) != 0) return 0;
  l[n] = 0;
  return (uint32_t)strtoul(l + 8, NULL, 10);
}

/* For each inode of want (sorted) that pid holds: call found(idx). */
static void net_walk_fds(net_scan *s, const char *pid, uint32_t *want, size_t nwant, net_owner *out,
                         int own) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%s/fd", pid);
  int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return;
  DIR *d = fdopendir(dfd);
  if (!d) {
    close(dfd);
    return;
  }
  s->walked++;
  struct dirent *e;
  int32_t p = own ? (int32_t)getpid() : (int32_t)atoi(pid);
  while ((e = readdir(d))) {
    if (e->d_name[0] == '.') continue;
    uint32_t ino = net_link_inode(dirfd(d), e->d_name);
    if (!ino) continue;
    uint32_t *hit = nwant == 0 ? NULL : bsearch(&ino, want, nwant, sizeof *want, net_inode_cmp);
    if (!hit) continue;
    net_owner *o = &out[hit - want];
    if (own) o->own = 1;
    else if (o->pid == 0 || p < o->pid) {
      o->pid = p;
      o->fd = atoi(e->d_name);
    }
  }
  closedir(d);
}

/* The owner's cgroup (the v2 line "0::PATH") and process group. */
static void net_owner_info(net_owner *o) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/cgroup", (int)o->pid);
  FILE *f = fopen(path, "re");
  if (f) {
    while (fgets(buf, sizeof buf, f))
      if (strncmp(buf, "0::", 3) == 0) {
        buf[strcspn(buf, "\n")] = 0;
        size_t l = strlen(buf + 3);
        if (l < sizeof o->cgroup) memcpy(o->cgroup, buf + 3, l + 1); /* longer: no match, no tag */
        break;
      }
    fclose(f);
  }
  snprintf(path, sizeof path, "/proc/%d/stat", (int)o->pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return;
  buf[n] = 0;
  char *r = strrchr(buf, ')'); /* comm may hold spaces and parentheses */
  int pgid = 0;
  if (r && sscanf(r + 1, " %*c %*d %d", &pgid) == 1) o->pgid = pgid;
}

/* Owners of the inodes in want (sorted, n of them), into out[i]. */
static void net_find_owners(net_scan *s, uint32_t *want, size_t n, net_owner *out) {
  for (size_t i = 0; i < n; i++) {
    memset(&out[i], 0, sizeof out[i]);
    out[i].inode = want[i];
  }
  net_walk_fds(s, "self", want, n, out, 1);
  DIR *d = opendir("/proc");
  if (!d) return;
  char self[16];
  snprintf(self, sizeof self, "%d", (int)getpid());
  struct dirent *e;
  while ((e = readdir(d))) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || strcmp(e->d_name, self) == 0) continue;
    net_walk_fds(s, e->d_name, want, n, out, 0);
  }
  closedir(d);
  for (size_t i = 0; i < n; i++)
    if (!out[i].own && out[i].pid) net_owner_info(&out[i]);
}

void net_scan_run(net_scan *s) {
  s->nsocks = 0;
  s->err = 0;
  s->walked = 0;
  size_t cap = 0;
  free(s->socks);
  s->socks = NULL;
  int fd = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
  if (fd < 0) {
    s->err = errno;
    return;
  }
  int r = net_dump(fd, AF_INET, s, &cap);
  if (r == 0) r = net_dump(fd, AF_INET6, s, &cap);
  close(fd);
  if (r < 0) {
    s->err = -r;
    s->nsocks = 0;
    return;
  }
  /* owners: keep the known ones still listening, find the new ones */
  uint32_t *inos = malloc((s->nsocks + 1) * sizeof *inos);
  net_owner *own = malloc((s->nsocks + 1) * sizeof *own);
  if (!inos || !own) {
    free(inos);
    free(own);
    s->err = ENOMEM;
    s->nsocks = 0;
    return;
  }
  for (size_t i = 0; i < s->nsocks; i++) inos[i] = s->socks[i].inode;
  qsort(inos, s->nsocks, sizeof *inos, net_inode_cmp);
  size_t nu = 0, nnew = 0;
  for (size_t i = 0; i < s->nsocks; i++)
    if (nu == 0 || inos[nu - 1] != inos[i]) inos[nu++] = inos[i];
  uint32_t *fresh = malloc((nu + 1) * sizeof *fresh);
  if (!fresh) {
    free(inos);
    free(own);
    s->err = ENOMEM;
    s->nsocks = 0;
    return;
  }
  size_t nown = 0;
  for (size_t i = 0; i < nu; i++) {
    const net_owner *o = net_owner_find(s, inos[i]);
    if (o) own[nown++] = *o;
    else fresh[nnew++] = inos[i];
  }
  if (nnew) {
    net_owner *found = malloc(nnew * sizeof *found);
    if (found) {
      net_find_owners(s, fresh, nnew, found);
      for (size_t i = 0; i < nnew; i++) own[nown++] = found[i];
      free(found);
    }
  }
  qsort(own, nown, sizeof *own, net_inode_cmp);
  free(s->owners);
  s->owners = own;
  s->nowners = nown;
  free(inos);
  free(fresh);
}
