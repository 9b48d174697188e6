/* net/steer — forwarded connections handed to the loopback listener by the
 * kernel (BPF sk_lookup), so that no byte of them passes through us.
 *
 * A relayed connection is two TCP connections and a splice loop; on a host
 * whose CPUs the two ends already fill, the second connection's kernel work
 * holds a relay to 0.5–0.7× of a direct transfer (tests/bench/README.md,
 * ports.sh).  An sk_lookup program attached to our network namespace runs
 * when a SYN arrives, before the kernel's own listener lookup: for TCP to
 * <outward>:P it looks P up in a SOCKHASH of loopback listeners and, if
 * there is one, hands the connection to it.  The server accepts it as if it
 * had bound the outward address itself (it sees the client's address and
 * <outward>:P), at the speed of a direct connection.
 *
 * The forwarder still listens on <outward>:P (relay.c): it keeps the port
 * held as the contract says, and it takes every connection the program
 * passes on — a port not in the map, a listener that just closed (the
 * kernel drops a closing socket from the map itself), the window of an
 * upgrade (our descriptors close at the exec; the carried forwarder relays
 * until the new program's first scan steers again).  So steering is an
 * optimisation with the relay behind it: when the kernel has no sk_lookup,
 * or the owner's descriptor cannot be taken (pidfd_getfd), the port is
 * relayed as before.
 *
 * The program is 24 instructions (30 for IPv6) written here (no libbpf,
 * no compiler):
 *   if proto != TCP || family != F || local_ip != OUT: pass
 *   sk = lookup(map, local_port); if !sk: pass
 *   sk_assign(ctx, sk, 0); sk_release(sk); pass
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "net/net.h"

static struct {
  int map, prog, link; /* -1 when not made */
  int count;           /* an array of one u64: connections assigned (-1 when not made) */
  uint64_t counted;    /* what the counters of earlier programs had counted */
  int family;
} S = {-1, -1, -1, -1, 0, 0};

static int net_steer_make(const struct sockaddr_storage *out);

static long net_bpf(int cmd, union bpf_attr *a) { return syscall(SYS_bpf, cmd, a, sizeof *a); }

typedef struct {
  struct bpf_insn v[64];
  int n;
  int to_pass[12]; /* jumps to the `pass` exit, patched at the end */
  int npass;
} prog_buf;

static void emit(prog_buf *p, uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
  struct bpf_insn *i = &p->v[p->n++];
  memset(i, 0, sizeof *i);
  i->code = code;
  i->dst_reg = dst;
  i->src_reg = src;
  i->off = off;
  i->imm = imm;
}

/* if (u32)ctx->field != want: pass */
static void emit_field_ne_pass(prog_buf *p, size_t field, uint32_t want) {
  emit(p, BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_6, (int16_t)field, 0);
  p->to_pass[p->npass++] = p->n;
  emit(p, BPF_JMP32 | BPF_JNE | BPF_K, BPF_REG_2, 0, 0, (int32_t)want);
}

static int net_steer_load(const struct sockaddr_storage *out) {
  prog_buf p = {.n = 0};
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_6, BPF_REG_1, 0, 0);
  emit_field_ne_pass(&p, offsetof(struct bpf_sk_lookup, protocol), IPPROTO_TCP);
  emit_field_ne_pass(&p, offsetof(struct bpf_sk_lookup, family), (uint32_t)out->ss_family);
  uint32_t w[4];
  if (out->ss_family == AF_INET) {
    memcpy(w, &((const struct sockaddr_in *)out)->sin_addr, 4);
    emit_field_ne_pass(&p, offsetof(struct bpf_sk_lookup, local_ip4), w[0]);
  } else {
    memcpy(w, &((const struct sockaddr_in6 *)out)->sin6_addr, 16);
    for (int k = 0; k < 4; k++)
      emit_field_ne_pass(&p, offsetof(struct bpf_sk_lookup, local_ip6) + 4 * (size_t)k, w[k]);
  }
  /* key = local_port, on the stack */
  emit(&p, BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_6, offsetof(struct bpf_sk_lookup, local_port), 0);
  emit(&p, BPF_STX | BPF_MEM | BPF_W, BPF_REG_10, BPF_REG_2, -4, 0);
  emit(&p, BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, S.map);
  emit(&p, 0, 0, 0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0);
  emit(&p, BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -4);
  emit(&p, BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
  p.to_pass[p.npass++] = p.n;
  emit(&p, BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_7, BPF_REG_0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_1, BPF_REG_6, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_7, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_3, 0, 0, 0);
  emit(&p, BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_assign);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_8, BPF_REG_0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_1, BPF_REG_7, 0, 0);
  emit(&p, BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_sk_release);
  /* assigned: count[0] += 1 (atomic; /metrics reads it) */
  p.to_pass[p.npass++] = p.n;
  emit(&p, BPF_JMP | BPF_JNE | BPF_K, BPF_REG_8, 0, 0, 0);
  emit(&p, BPF_ST | BPF_MEM | BPF_W, BPF_REG_10, 0, -8, 0);
  emit(&p, BPF_LD | BPF_DW | BPF_IMM, BPF_REG_1, BPF_PSEUDO_MAP_FD, 0, S.count);
  emit(&p, 0, 0, 0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_2, BPF_REG_10, 0, 0);
  emit(&p, BPF_ALU64 | BPF_ADD | BPF_K, BPF_REG_2, 0, 0, -8);
  emit(&p, BPF_JMP | BPF_CALL, 0, 0, 0, BPF_FUNC_map_lookup_elem);
  p.to_pass[p.npass++] = p.n;
  emit(&p, BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, 0, 0);
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_1, 0, 0, 1);
  emit(&p, BPF_STX | BPF_DW | BPF_ATOMIC, BPF_REG_0, BPF_REG_1, 0, BPF_ADD);
  int pass = p.n; /* an assign that failed passes too: the forwarder relays it */
  emit(&p, BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, SK_PASS);
  emit(&p, BPF_JMP | BPF_EXIT, 0, 0, 0, 0);
  for (int k = 0; k < p.npass; k++) p.v[p.to_pass[k]].off = (int16_t)(pass - p.to_pass[k] - 1);

  union bpf_attr a;
  memset(&a, 0, sizeof a);
  a.prog_type = BPF_PROG_TYPE_SK_LOOKUP;
  a.expected_attach_type = BPF_SK_LOOKUP;
  a.insns = (uintptr_t)p.v;
  a.insn_cnt = (uint32_t)p.n;
  a.license = (uintptr_t) "Proprietary"; /* no GPL-only helper is called */
  return (int)net_bpf(BPF_PROG_LOAD, &a);
}

/* Kernels before 5.11 charge BPF maps and programs to RLIMIT_MEMLOCK (64
 * KiB by default for PID 1), where making them fails EPERM.  Lifting the
 * agent's own limit for that moment would hand it to any command cloned
 * meanwhile on a pool thread, so a short-lived child of its own lifts its
 * limit, makes the objects and passes their descriptors back; the agent's
 * limit never changes.  The reaper reaps the child as an orphan. */
static int net_steer_make_in_child(const struct sockaddr_storage *out) {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return -errno;
  pid_t pid = fork();
  if (pid < 0) {
    int err = errno;
    close(sv[0]);
    close(sv[1]);
    return -err;
  }
  if (pid == 0) {
    struct rlimit inf = {RLIM_INFINITY, RLIM_INFINITY}, now;
    if (setrlimit(RLIMIT_MEMLOCK, &inf) != 0 && getrlimit(RLIMIT_MEMLOCK, &now) == 0) {
      now.rlim_cur = now.rlim_max; /* no CAP_SYS_RESOURCE: as far as the hard limit goes */
      setrlimit(RLIMIT_MEMLOCK, &now);
    }
    int r = net_steer_make(out);
    int fds[3] = {S.map, S.prog, S.link};
    char cbuf[CMSG_SPACE(sizeof fds)];
    memset(cbuf, 0, sizeof cbuf);
    struct iovec iov = {&r, sizeof r};
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (r == 0) {
      m.msg_control = cbuf;
      m.msg_controllen = sizeof cbuf;
      struct cmsghdr *c = CMSG_FIRSTHDR(&m);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof fds);
      memcpy(CMSG_DATA(c), fds, sizeof fds);
    }
    _exit(sendmsg(sv[1], &m, 0) < 0);
  }
  close(sv[1]);
  int r = -EIO, fds[3];
  char cbuf[CMSG_SPACE(sizeof fds)];
  struct iovec iov = {&r, sizeof r};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof cbuf};
  /* a few system calls of the child's: waited for, as the objects themselves are */
  ssize_t n = recvmsg(sv[0], &m, MSG_CMSG_CLOEXEC);
  close(sv[0]);
  struct cmsghdr *c = n == (ssize_t)sizeof r ? CMSG_FIRSTHDR(&m) : NULL;
  if (r == 0 && c && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof fds)) {
    memcpy(fds, CMSG_DATA(c), sizeof fds);
    S.map = fds[0];
    S.prog = fds[1];
    S.link = fds[2];
    S.family = out->ss_family;
    return 0;
  }
  return r ? r : -EIO;
}

int net_steer_start(const struct sockaddr_storage *out) {
  net_steer_stop();
  int r = net_steer_make(out); /* 5.11 and later: charged to the memory cgroup, no limit involved */
#ifndef CONCH_STATIC /* test seam: behave as a kernel before 5.11 (tests/integration/test_ports.py) */
  const char *fault = getenv("CONCH_FAULT");
  if (r == 0 && fault && strcmp(fault, "steer_memlock") == 0) {
    net_steer_stop();
    r = -EPERM;
  }
#endif
  if (r == -EPERM) r = net_steer_make_in_child(out);
  return r;
}

static int net_steer_make(const struct sockaddr_storage *out) {
  union bpf_attr a;
  memset(&a, 0, sizeof a);
  a.map_type = BPF_MAP_TYPE_SOCKHASH;
  a.key_size = 4;   /* the port, host order (sk_lookup's local_port) */
  a.value_size = 8; /* a socket descriptor on update, its cookie on lookup */
  a.max_entries = NET_STEER_MAX;
  int err = 0;
  S.map = (int)net_bpf(BPF_MAP_CREATE, &a);
  if (S.map < 0) goto fail;
  memset(&a, 0, sizeof a);
  a.map_type = BPF_MAP_TYPE_ARRAY;
  a.key_size = 4;
  a.value_size = 8;
  a.max_entries = 1;
  S.count = (int)net_bpf(BPF_MAP_CREATE, &a);
  if (S.count < 0) goto fail;
  S.prog = net_steer_load(out);
  if (S.prog < 0) goto fail;
  int ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
  if (ns < 0) goto fail;
  memset(&a, 0, sizeof a);
  a.link_create.prog_fd = (uint32_t)S.prog;
  a.link_create.target_fd = (uint32_t)ns;
  a.link_create.attach_type = BPF_SK_LOOKUP;
  S.link = (int)net_bpf(BPF_LINK_CREATE, &a);
  err = errno;
  close(ns);
  errno = err;
  if (S.link < 0) goto fail;
  S.family = out->ss_family;
  return 0;
fail:
  err = errno;
  net_steer_stop();
  return -err;
}

/* Connections the program assigned, this one and the earlier ones. */
uint64_t net_steer_count(void) {
  uint64_t v = 0;
  if (S.count >= 0) {
    uint32_t key = 0;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = (uint32_t)S.count;
    a.key = (uintptr_t)&key;
    a.value = (uintptr_t)&v;
    if (net_bpf(BPF_MAP_LOOKUP_ELEM, &a) != 0) v = 0;
  }
  return S.counted + v;
}

void net_steer_stop(void) {
  S.counted = net_steer_count();
  int *fds[] = {&S.link, &S.prog, &S.map, &S.count};
  for (size_t i = 0; i < sizeof fds / sizeof *fds; i++) {
    if (*fds[i] >= 0) close(*fds[i]);
    *fds[i] = -1;
  }
  S.family = 0;
}

int net_steer_on(void) { return S.link >= 0; }

int net_steer_set(uint16_t port, int family, int32_t pid, int32_t fd, uint32_t inode) {
  if (S.link < 0) return -ENOTCONN;
  if (family != S.family) return -EAFNOSUPPORT; /* a v4 connection to a v6 listener: relayed */
  if (pid <= 0 || fd < 0) return -ESRCH;
  int pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
  if (pfd < 0) return -errno;
  int sfd = (int)syscall(SYS_pidfd_getfd, pfd, fd, 0);
  int err = errno;
  close(pfd);
  if (sfd < 0) return -err;
  struct stat st;
  struct sockaddr_storage sa;
  socklen_t len = sizeof sa;
  int r = 0, listening = 0;
  socklen_t il = sizeof listening;
  if (fstat(sfd, &st) != 0 || !S_ISSOCK(st.st_mode) || st.st_ino != inode ||
      getsockopt(sfd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &il) != 0 || !listening ||
      getsockname(sfd, (struct sockaddr *)&sa, &len) != 0 || sa.ss_family != family ||
      ntohs(family == AF_INET ? ((struct sockaddr_in *)&sa)->sin_port : ((struct sockaddr_in6 *)&sa)->sin6_port) != port) {
    r = -ESTALE; /* the descriptor is not that listener (any more): the caller may look its owner up again */
  } else {
    uint32_t key = port;
    uint64_t val = (uint64_t)sfd;
    union bpf_attr a;
    memset(&a, 0, sizeof a);
    a.map_fd = (uint32_t)S.map;
    a.key = (uintptr_t)&key;
    a.value = (uintptr_t)&val;
    a.flags = BPF_ANY;
    if (net_bpf(BPF_MAP_UPDATE_ELEM, &a) != 0) r = -errno;
  }
  close(sfd); /* the map holds the socket, never the file: the owner's close still closes it */
  return r;
}

void net_steer_clear(uint16_t port) {
  if (S.map < 0) return;
  uint32_t key = port;
  union bpf_attr a;
  memset(&a, 0, sizeof a);
  a.map_fd = (uint32_t)S.map;
  a.key = (uintptr_t)&key;
  net_bpf(BPF_MAP_DELETE_ELEM, &a); /* ENOENT: the kernel dropped a closed listener already */
}
