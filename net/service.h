/* net/service — NetworkService (api.md §9 "Ports"): ListPorts, WatchPorts
 * and the forwarding of loopback-only listeners to the outward address.
 *
 *   size_t n;
 *   const rpc_method *m = net_service_methods(loop, &n);   // n == 2
 *   net_set_owner_lookup(fn);   // which managed command holds a socket
 *   net_forward_set("10.0.0.2"); // forwarding on (NULL: off)
 *
 * The owner hook keeps net/ out of proc/ (tests/tools/check-layers.sh):
 * agent/main.c hands it proc's lookup, so net/ never sees a process
 * record.  fn(cgroup, pgid, &tag, &command_pid) runs on the loop with the
 * owner's cgroup path as /proc/PID/cgroup shows it and its process group;
 * 1 with *tag (valid during the call only) and *command_pid when a
 * managed command holds it, else 0.
 */
#ifndef CONCH_NET_SERVICE_H
#define CONCH_NET_SERVICE_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "server/rpc.h"

typedef int (*net_owner_fn)(const char *cgroup, int32_t pgid, const char **tag, int32_t *command_pid);

const rpc_method *net_service_methods(uv_loop_t *loop, size_t *n);
void net_set_owner_lookup(net_owner_fn fn);
/* Forward loopback-only listeners to addr (an IPv4 or IPv6 literal), or
 * stop (NULL); 0, or -1 when addr is no address literal. */
int net_forward_set(const char *addr);
/* The address forwarded to, or NULL when forwarding is off. */
const char *net_forward_get(void);
/* /metrics (api.md §9 "Operators"): ports forwarded now, connections
 * relayed and steered (handed over by the kernel) since start. */
void net_forward_counts(unsigned *ports, uint64_t *relayed, uint64_t *steered);
/* Loop: what every relayed connection's pipes hold (at most a quarter of
 * the memory budget), and the relays reset at that cap (/metrics). */
size_t net_relays_held(void);
unsigned long long net_relays_reset(void);

/* Upgrade in place (core/handover.h drives it, agent/parts.c registers
 * the part): the forwarding address, every forwarder's listening socket and
 * every relayed connection (two sockets, two pipes) are carried across the
 * exec in the state's `net` (proto/handover.proto; keep_fds names their
 * descriptors to the handover).  save points into live memory until save_free;
 * restore rebuilds them without starting anything (0, or -1 with err: a
 * rollback); resume starts them and the scans; abandon, see below. */
typedef struct Conch__Handover__State Conch__Handover__State;
int net_handover_save(Conch__Handover__State *st);
void net_handover_save_free(Conch__Handover__State *st);
int net_handover_restore(const Conch__Handover__State *st, char *err, size_t errn);
/* No rollback came after a restore that failed or never ran: close the
 * descriptors of the forwarders and relays the restore did not take. */
void net_handover_abandon(const Conch__Handover__State *st);
void net_handover_resume(void);
void net_handover_keep_fds(const Conch__Handover__State *st);

#endif
