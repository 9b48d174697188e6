/* net/relay_int — internal to net/relay*.c: a relayed connection, a
 * forwarder and the state relay.c keeps of them, for relay_handover.c
 * (an upgrade in place: saved, restored, abandoned).  No other file
 * includes it. */
#ifndef CONCH_NET_RELAY_INT_H
#define CONCH_NET_RELAY_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <uv.h>

#include "core/list.h"
#include "net/net.h"

#define NET_RELAY_MAX 1024
#define NET_PIPE_CAP (64 * 1024)
#define NET_RETRY_MS 20
#define NET_PUMP_ROUNDS 16 /* splices per direction per wake-up: other connections get their turn */
#define NET_ACCEPTS 32     /* accepts per wake-up of a listener */
#define NET_RELAY_IDLE_MS (10u * 60 * 1000)
#define NET_RELAY_STALL_MS 1000

typedef struct relay_conn relay_conn;

typedef struct relay_dir {
  relay_conn *c;
  int src, dst;  /* socket descriptors */
  int pr, pw;    /* the pipe's ends */
  size_t held;   /* bytes in the pipe (counted in the budget) */
  int eof;       /* src said EOF */
  int shut;      /* dst shut down */
  list_node slink; /* waits for the budget: in `starved` (or in the retry's batch) */
} relay_dir;

struct relay_conn {
  list_node link;   /* in conns (the handover enumerates them) */
  uv_poll_t pa, pb; /* the client's socket, the loopback listener's */
  int a, b;
  relay_dir up, down; /* a→b, b→a */
  int connected;
  int handles;
  int closing;
  int cut_at_resume; /* restored, but the budget had no room for its pipes */
  uint64_t active;   /* uv_now of its last bytes moved (or its start) */
  unsigned ev_a, ev_b; /* the events each poll watches now */
};

typedef struct fwd {
  struct fwd *next;
  uint16_t port;
  int listening;
  int failed_logged;
  int fd;
  uv_poll_t *lis;
  struct sockaddr_storage target;
  char to[NET_ADDR_MAX + 8];
  uint32_t steered;     /* the listener's inode in steer.c's map, 0: none */
  uint32_t steer_fail;  /* the inode that could not be steered (not tried again) */
  uint32_t relooked;    /* the inode whose owner was looked up again after a stale try */
} fwd;

extern char *fwd_addr;
extern struct sockaddr_storage fwd_sa;
extern fwd *fwds;
extern list_node conns;  /* every relayed connection not closing, oldest activity first */
extern size_t relay_held; /* what every relay's pipes hold */

/* c's sockets and pipes are set: watch its sockets, count it, list it
 * (relay.c: 0, or -1/-2 as it says). */
int relay_link(relay_conn *c);
/* A new forwarder of port, first in fwds; NULL when out of memory. */
fwd *fwd_new(uint16_t port);
void fwd_target(fwd *f, int family, const uint8_t *raw);
int fwd_listen_on(fwd *f, int fd, uv_poll_t *p, int start);

#endif
