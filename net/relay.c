/* net/relay — forwarders of loopback-only listeners (api.md §9 "Ports"). */
#include <stdlib.h>

#include "net/net.h"
#include "net/service.h"

static char *fwd_addr;

const char *net_fwd_addr(void) { return fwd_addr; }

int net_forward_set(const char *addr) {
  (void)addr;
  return -1;
}

void net_fwd_sync(const uint16_t *want, size_t n) {
  (void)want;
  (void)n;
}

const char *net_fwd_to(uint16_t port) {
  (void)port;
  return NULL;
}
