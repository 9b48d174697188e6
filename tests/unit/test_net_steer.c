/* net/steer.c on the real kernel, in a network namespace of its own: a
 * connection to <outward>:P is handed to the loopback listener in the map
 * (the server sees the client's address and <outward>:P) and nothing else
 * is — another address, another port, a port cleared, a listener that
 * closed: those reach whatever listens there by the kernel's own lookup
 * (the forwarder in the agent).  Listeners of another process are taken
 * with pidfd_getfd; a wrong family, no owner or a stale descriptor is
 * refused with its errno.  IPv4 and IPv6 outward addresses.  Root (make
 * unit runs as root); also run in the arm64 VM (ARM64_GUEST_TESTS). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/net.h"
#include "tests/unit/test.h"

/* words with bit 31 set (a 64-bit compare with a sign-extended immediate
 * would miss them), and IPv6 addresses that differ in the last word only */
#define OUT4 "10.239.0.201"
#define OTHER4 "10.239.0.203"
#define OUT6 "fd00:239::c9"
#define OTHER6 "fd00:239::cb"

/* struct in6_ifreq (linux/ipv6.h clashes with netinet/in.h) */
struct conch_in6_ifreq {
  struct in6_addr addr;
  uint32_t prefixlen;
  int ifindex;
};

static void sa_of(struct sockaddr_storage *sa, socklen_t *len, const char *addr, uint16_t port) {
  memset(sa, 0, sizeof *sa);
  struct sockaddr_in *s4 = (struct sockaddr_in *)sa;
  struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)sa;
  if (inet_pton(AF_INET, addr, &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(port);
    *len = sizeof *s4;
  } else {
    ASSERT_EQ(inet_pton(AF_INET6, addr, &s6->sin6_addr), 1);
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(port);
    *len = sizeof *s6;
  }
}

static int listen_at(const char *addr, uint16_t *port) {
  struct sockaddr_storage sa;
  socklen_t len;
  sa_of(&sa, &len, addr, *port);
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  ASSERT(fd >= 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (sa.ss_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, len), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  ASSERT_EQ(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  *port = ntohs(sa.ss_family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port
                                        : ((struct sockaddr_in6 *)&sa)->sin6_port);
  return fd;
}

static int dial(const char *addr, uint16_t port) {
  struct sockaddr_storage sa;
  socklen_t len;
  sa_of(&sa, &len, addr, port);
  int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT(fd >= 0);
  ASSERT_EQ(connect(fd, (struct sockaddr *)&sa, len), 0);
  return fd;
}

static uint32_t inode_of(int fd) {
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  return (uint32_t)st.st_ino;
}

static int readable(int fd) {
  struct pollfd p = {fd, POLLIN, 0};
  return poll(&p, 1, 500) == 1;
}

/* Which of the listeners accepts a connection to addr:port; the accepted
 * socket's local address into local (when given). */
static int who_accepts(const char *addr, uint16_t port, const int *lis, int n, char *local) {
  int c = dial(addr, port);
  int who = -1;
  for (int i = 0; i < n && who < 0; i++)
    if (readable(lis[i])) who = i;
  ASSERT(who >= 0);
  struct sockaddr_storage sa;
  socklen_t len = sizeof sa;
  int a = accept(lis[who], (struct sockaddr *)&sa, &len);
  ASSERT(a >= 0);
  if (local) {
    len = sizeof sa;
    ASSERT_EQ(getsockname(a, (struct sockaddr *)&sa, &len), 0);
    const void *ip = sa.ss_family == AF_INET ? (const void *)&((struct sockaddr_in *)&sa)->sin_addr
                                             : (const void *)&((struct sockaddr_in6 *)&sa)->sin6_addr;
    inet_ntop(sa.ss_family, ip, local, INET6_ADDRSTRLEN);
  }
  for (int i = 0; i < n; i++) ASSERT(!readable(lis[i]) || i == who); /* one connection, one listener */
  close(a);
  close(c);
  return who;
}

static void start(const char *out) {
  struct sockaddr_storage sa;
  socklen_t len;
  sa_of(&sa, &len, out, 0);
  ASSERT_EQ(net_steer_start(&sa), 0);
  ASSERT(net_steer_on());
}

TEST(handed_to_the_listener_and_nothing_else) {
  start(OUT4);
  uint16_t p = 0, q = 0;
  int lo = listen_at("127.0.0.1", &p);
  int fwd = listen_at(OUT4, &p); /* the agent's forwarder at the same port */
  int other = listen_at(OTHER4, &p);
  int lo2 = listen_at("127.0.0.1", &q), fwd2 = listen_at(OUT4, &q);
  int lis[] = {lo, fwd, other, lo2, fwd2};
  char local[INET6_ADDRSTRLEN];
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, NULL), 1); /* not in the map: the forwarder */
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lo, inode_of(lo)), 0);
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, local), 0);
  ASSERT_STR_EQ(local, OUT4); /* the server sees the outward address */
  ASSERT_EQ(who_accepts(OTHER4, p, lis, 5, NULL), 2); /* another address: its own listener */
  ASSERT_EQ(who_accepts("127.0.0.1", p, lis, 5, local), 0);
  ASSERT_STR_EQ(local, "127.0.0.1");
  ASSERT_EQ(who_accepts(OUT4, q, lis, 5, NULL), 4); /* another port */
  net_steer_clear(p);
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, NULL), 1);
  net_steer_clear(p); /* twice: nothing there, no harm */
  /* a listener that closes leaves the map by itself; a new one replaces it */
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lo, inode_of(lo)), 0);
  close(lo);
  lis[0] = lo = listen_at("127.0.0.1", &p);
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, NULL), 1);
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lo, inode_of(lo)), 0);
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, NULL), 0);
  /* stopped: the program is detached */
  net_steer_stop();
  ASSERT(!net_steer_on());
  ASSERT_EQ(who_accepts(OUT4, p, lis, 5, NULL), 1);
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lo, inode_of(lo)), -ENOTCONN);
  for (int i = 0; i < 5; i++) close(lis[i]);
}

TEST(refusals) {
  start(OUT4);
  uint16_t p = 0, p6 = 0;
  int lo = listen_at("127.0.0.1", &p), lo6 = listen_at("::1", &p6);
  ASSERT_EQ(net_steer_set(p6, AF_INET6, getpid(), lo6, inode_of(lo6)), -EAFNOSUPPORT);
  ASSERT_EQ(net_steer_set(p, AF_INET, 0, lo, inode_of(lo)), -ESRCH);     /* no visible owner */
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lo6, inode_of(lo)), -ESTALE); /* fd is another socket now */
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), fd, inode_of(fd)), -ESTALE); /* no socket */
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), 999, inode_of(lo)), -EBADF);
  /* a connected socket, a listener at another port: not the listener */
  int c = dial("127.0.0.1", p);
  int a = accept(lo, NULL, NULL);
  int fwd = listen_at(OUT4, &p);
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), a, inode_of(a)), -ESTALE);
  uint16_t q = 0;
  int lq = listen_at("127.0.0.1", &q);
  ASSERT_EQ(net_steer_set(p, AF_INET, getpid(), lq, inode_of(lq)), -ESTALE);
  close(lq);
  int lis[] = {lo, fwd};
  ASSERT_EQ(who_accepts(OUT4, p, lis, 2, NULL), 1);
  close(a);
  close(c);
  close(fwd);
  close(fd);
  close(lo);
  close(lo6);
  net_steer_stop();
}

TEST(another_process_listener) {
  start(OUT4);
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  pid_t pid = fork();
  if (pid == 0) { /* holds a listener and accepts one connection, answering with its local address */
    uint16_t p = 0;
    int l = listen_at("127.0.0.1", &p);
    int32_t msg[2] = {l, p};
    if (write(pfd[1], msg, sizeof msg) != sizeof msg) _exit(1);
    int a = accept(l, NULL, NULL);
    if (a < 0) _exit(1);
    struct sockaddr_in sa;
    socklen_t len = sizeof sa;
    getsockname(a, (struct sockaddr *)&sa, &len);
    if (write(a, &sa.sin_addr, 4) != 4) _exit(1);
    pause();
    _exit(0);
  }
  int32_t msg[2];
  ASSERT_EQ(read(pfd[0], msg, sizeof msg), (ssize_t)sizeof msg);
  uint16_t p = (uint16_t)msg[1];
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, (int)msg[0]);
  struct stat st;
  ASSERT_EQ(stat(path, &st), 0);
  ASSERT_EQ(net_steer_set(p, AF_INET, pid, msg[0], (uint32_t)st.st_ino), 0);
  int c = dial(OUT4, p); /* nothing of ours listens on OUT4:p: only the child's socket can take it */
  struct in_addr got;
  ASSERT_EQ(read(c, &got, 4), 4);
  char s[INET_ADDRSTRLEN];
  ASSERT_STR_EQ(inet_ntop(AF_INET, &got, s, sizeof s), OUT4);
  close(c);
  /* the owner dies: its socket leaves the map, our copy never kept it open */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  struct sockaddr_storage sa;
  socklen_t len;
  sa_of(&sa, &len, OUT4, p);
  c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_EQ(connect(c, (struct sockaddr *)&sa, len), -1);
  ASSERT_EQ(errno, ECONNREFUSED);
  close(c);
  close(pfd[0]);
  close(pfd[1]);
  net_steer_stop();
}

TEST(ipv6_outward_address) {
  start(OUT6);
  uint16_t p = 0;
  int lo = listen_at("::1", &p), fwd = listen_at(OUT6, &p), other = listen_at(OTHER6, &p);
  int lis[] = {lo, fwd, other};
  char local[INET6_ADDRSTRLEN];
  ASSERT_EQ(who_accepts(OUT6, p, lis, 3, NULL), 1);
  ASSERT_EQ(net_steer_set(p, AF_INET6, getpid(), lo, inode_of(lo)), 0);
  ASSERT_EQ(who_accepts(OUT6, p, lis, 3, local), 0);
  ASSERT_STR_EQ(local, OUT6);
  ASSERT_EQ(who_accepts(OTHER6, p, lis, 3, NULL), 2); /* the last word differs: not steered */
  close(lo);
  close(fwd);
  close(other);
  net_steer_stop();
}

/* lo up, with OUT4 and OTHER4 (labels lo:1, lo:2), OUT6 and OTHER6, by ioctl: no ip(8) in the guest test */
static int net_setup(void) {
  if (unshare(CLONE_NEWNET) != 0) return -1;
  int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct ifreq r;
  memset(&r, 0, sizeof r);
  snprintf(r.ifr_name, sizeof r.ifr_name, "lo");
  if (ioctl(s, SIOCGIFFLAGS, &r) != 0) return -1;
  r.ifr_flags |= IFF_UP;
  if (ioctl(s, SIOCSIFFLAGS, &r) != 0) return -1;
  const char *v4[] = {OUT4, OTHER4};
  for (int i = 0; i < 2; i++) {
    memset(&r, 0, sizeof r);
    snprintf(r.ifr_name, sizeof r.ifr_name, "lo:%d", i + 1);
    struct sockaddr_in *a = (struct sockaddr_in *)&r.ifr_addr;
    a->sin_family = AF_INET;
    inet_pton(AF_INET, v4[i], &a->sin_addr);
    if (ioctl(s, SIOCSIFADDR, &r) != 0) return -1;
  }
  close(s);
  s = socket(AF_INET6, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  const char *v6[] = {OUT6, OTHER6};
  for (int i = 0; i < 2; i++) {
    struct conch_in6_ifreq r6 = {.prefixlen = 128, .ifindex = (int)if_nametoindex("lo")};
    inet_pton(AF_INET6, v6[i], &r6.addr);
    if (s < 0 || ioctl(s, SIOCSIFADDR, &r6) != 0) return -1;
  }
  close(s);
  usleep(100 * 1000); /* an IPv6 address on lo needs no DAD, but give it a moment */
  return 0;
}

int main(void) {
  if (geteuid() != 0 || net_setup() != 0) { /* make unit runs as root */
    fprintf(stderr, "  FAILED: needs root and a network namespace of its own with lo up: %s\n", strerror(errno));
    test_failed_++;
    return test_summary();
  }
  RUN(handed_to_the_listener_and_nothing_else);
  RUN(refusals);
  RUN(another_process_listener);
  RUN(ipv6_outward_address);
  return test_summary();
}
