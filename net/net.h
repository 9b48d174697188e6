/* net/net — internal to the net/ files: the scan's data (scan.c, in the pool), the
 * port table and its watchers (ports.c, on the loop), the forwarders
 * (relay.c, on the loop).  ports.c calls down into scan.c and relay.c;
 * relay.c never calls ports.c.
 */
#ifndef CONCH_NET_NET_H
#define CONCH_NET_NET_H

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define NET_ADDR_MAX 46     /* INET6_ADDRSTRLEN */
#define NET_CGROUP_MAX 512
#define NET_SCAN_MS 500     /* rescan period while someone needs it: a change shows within 1 s */
#define NET_SOCKS_MAX 65536 /* listeners one scan keeps; more are ignored (logged) */

/* A listening socket as one dump saw it. */
typedef struct net_sock {
  uint32_t inode;
  uint16_t port;
  uint8_t family;
  uint8_t raw[16]; /* the bound address, network order */
  char addr[NET_ADDR_MAX];
} net_sock;

/* Who holds a socket inode: found once, kept while the inode listens. */
typedef struct net_owner {
  uint32_t inode;
  int32_t pid;  /* lowest holder, 0 when none is visible */
  int32_t fd;   /* its descriptor of the socket */
  int32_t pgid;
  int own;      /* conch-init itself holds it */
  char cgroup[NET_CGROUP_MAX];
} net_owner;

/* One scan: run in the pool, touching only this.  owners is sorted by
 * inode; run() drops those no longer listening and adds the new ones. */
typedef struct net_scan {
  net_sock *socks;
  size_t nsocks;
  net_owner *owners;
  size_t nowners;
  int err;        /* errno of a failed dump (socks then empty) */
  size_t walked;  /* /proc/<pid>/fd directories read (tests, logs) */
} net_scan;

void net_scan_run(net_scan *s);
const net_owner *net_owner_find(const net_scan *s, uint32_t inode);
/* Drop inode's owner: the next run looks it up again (on the loop, while no run is out). */
void net_owner_forget(net_scan *s, uint32_t inode);

/* ---- steer.c: connections handed to the listener by the kernel ---- */
#define NET_STEER_MAX 4096 /* ports steered at once; past it they are relayed */
/* Attach the sk_lookup program for TCP to out (this network namespace);
 * 0 or -errno (no BPF, no sk_lookup, no privilege: the relay stays). */
int net_steer_start(const struct sockaddr_storage *out);
void net_steer_stop(void);
int net_steer_on(void);
/* Connections steered since start (/metrics). */
uint64_t net_steer_count(void);
/* Connections to <outward>:port go to the listener that pid holds as fd
 * (it must still be socket inode); 0 or -errno (then it is relayed). */
int net_steer_set(uint16_t port, int family, int32_t pid, int32_t fd, uint32_t inode);
void net_steer_clear(uint16_t port);

/* ---- relay.c: forwarders ---- */
extern uv_loop_t *net_loop;
/* net_forward_set's work: the outward address (NULL: off); 0, or -1 when
 * addr is no address literal. */
int net_fwd_config(const char *addr);
/* The outward address set by net_forward_set, or NULL (off). */
const char *net_fwd_addr(void);
/* A loopback-only listener port to forward, and where it listens. */
typedef struct net_fwd_want {
  uint16_t port;
  uint8_t family;
  uint8_t raw[16];
  uint32_t inode;  /* the listener's socket, */
  int32_t pid, fd; /* held by pid as fd (0, -1: unknown): to steer it */
  int relook;      /* set by net_fwd_sync: pid/fd are stale, look the owner up again */
} net_fwd_want;
/* After each scan: keep a forwarder for each of want[0..n) (sorted by
 * port) and stop the others (their listener closes at once; the
 * connections it relays go on). */
void net_fwd_sync(net_fwd_want *want, size_t n);
/* The outward address's family, 0 when forwarding is off. */
int net_fwd_family(void);
/* 1 when a listener on raw (family) takes the outward address's port:
 * the outward address itself or a wildcard of its family. */
int net_fwd_covers(int family, const uint8_t *raw);
/* "<outward>:port" while port is forwarded, else NULL. */
const char *net_fwd_to(uint16_t port);
/* After an upgrade's restore (net_handover_restore): the carried
 * forwarders accept again and the carried connections relay again. */
void net_fwd_resume(void);

#endif
