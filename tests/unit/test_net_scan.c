/* net/scan.c: one discovery on the real kernel — sock_diag dumps of both
 * families, addresses as bound, owners by inode (this process's own
 * sockets marked `own`, a child's found with its cgroup and group), known
 * owners kept without a walk, vanished ones dropped. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "net/net.h"
#include "tests/unit/test.h"

static int listen_on(int family, const char *addr, uint16_t *port) {
  int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
  ASSERT(fd >= 0);
  struct sockaddr_storage sa = {0};
  socklen_t len;
  if (family == AF_INET) {
    struct sockaddr_in *s = (struct sockaddr_in *)&sa;
    s->sin_family = AF_INET;
    inet_pton(AF_INET, addr, &s->sin_addr);
    len = sizeof *s;
  } else {
    struct sockaddr_in6 *s = (struct sockaddr_in6 *)&sa;
    s->sin6_family = AF_INET6;
    inet_pton(AF_INET6, addr, &s->sin6_addr);
    setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    len = sizeof *s;
  }
  ASSERT_EQ(bind(fd, (struct sockaddr *)&sa, len), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  ASSERT_EQ(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
  *port = ntohs(family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port : ((struct sockaddr_in6 *)&sa)->sin6_port);
  return fd;
}

static uint32_t inode_of(int fd) {
  struct stat st;
  ASSERT_EQ(fstat(fd, &st), 0);
  return (uint32_t)st.st_ino;
}

static const net_sock *find(const net_scan *s, uint32_t inode) {
  for (size_t i = 0; i < s->nsocks; i++)
    if (s->socks[i].inode == inode) return &s->socks[i];
  return NULL;
}

TEST(both_families_and_own_sockets) {
  net_scan s = {0};
  uint16_t p4, p6;
  int a = listen_on(AF_INET, "127.0.0.1", &p4), b = listen_on(AF_INET6, "::1", &p6);
  net_scan_run(&s);
  ASSERT_EQ(s.err, 0);
  const net_sock *k = find(&s, inode_of(a));
  ASSERT(k);
  ASSERT_STR_EQ(k->addr, "127.0.0.1");
  ASSERT_EQ(k->port, p4);
  ASSERT_EQ(k->family, AF_INET);
  k = find(&s, inode_of(b));
  ASSERT(k);
  ASSERT_STR_EQ(k->addr, "::1");
  ASSERT_EQ(k->port, p6);
  /* this process holds them: own (the agent's sockets are never listed) */
  const net_owner *o = net_owner_find(&s, inode_of(a));
  ASSERT(o && o->own);
  ASSERT(s.walked > 0);
  /* a later scan knows them: no walk of /proc. Other listeners may come
   * and go meanwhile (in the guest the agent binds a forwarder for each of
   * ours, which is new and walked once): a quiet scan must come within a
   * few tries, and it never would if known owners were looked up again. */
  int quiet = 0;
  for (int i = 0; i < 50 && !quiet; i++) {
    net_scan_run(&s);
    quiet = s.walked == 0;
    if (!quiet) usleep(100 * 1000);
  }
  ASSERT(quiet);
  ASSERT(find(&s, inode_of(a)) && net_owner_find(&s, inode_of(a))->own);
  uint32_t ia = inode_of(a), ib = inode_of(b);
  close(a);
  net_scan_run(&s); /* a closed listener leaves the dump and the owner table */
  ASSERT(!find(&s, ia));
  ASSERT(!net_owner_find(&s, ia));
  ASSERT(find(&s, ib) && net_owner_find(&s, ib));
  close(b);
  free(s.socks);
  free(s.owners);
}

TEST(a_child_owner) {
  net_scan s = {0};
  uint16_t port;
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t pid = fork();
  if (pid == 0) { /* its own listener, in a group of its own */
    setpgid(0, 0);
    int fd = listen_on(AF_INET, "127.0.0.1", &port);
    uint32_t ino = inode_of(fd);
    if (write(fds[1], &ino, sizeof ino) != sizeof ino) _exit(1);
    pause();
    _exit(0);
  }
  uint32_t ino = 0;
  ASSERT_EQ(read(fds[0], &ino, sizeof ino), (ssize_t)sizeof ino);
  net_scan_run(&s);
  const net_owner *o = net_owner_find(&s, ino);
  ASSERT(o);
  ASSERT_EQ(o->own, 0);
  ASSERT_EQ(o->pid, pid);
  ASSERT_EQ(o->pgid, pid);
  ASSERT(o->cgroup[0] == '/' || o->cgroup[0] == 0); /* the v2 line, when there is one */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  net_scan_run(&s); /* gone: its owner is dropped */
  ASSERT(!net_owner_find(&s, ino));
  close(fds[0]);
  close(fds[1]);
  free(s.socks);
  free(s.owners);
}

int main(void) {
  RUN(both_families_and_own_sockets);
  RUN(a_child_owner);
  return test_summary();
}
