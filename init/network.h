/* network — applying and re-checking the guest network (boot.md §4).
 *
 * Blocking (rtnetlink requests and one small file write): run it in the
 * thread pool.  Each function returns NULL on success or the malloc'd
 * terminal text ("assign guest address: file exists", …).
 *
 * Cold apply: first non-loopback link (lowest ifindex), lo up, address with
 * broadcast unless exactly present, link up, main-table default route via
 * gateway on that link unless present, then resolv.conf.  Idempotent: a
 * second apply on a configured interface changes nothing.  A failed link
 * dump reads "list network interfaces: <err>" (the spec names no text).
 * Revalidate: link up, address present, default route present, then rewrite
 * resolv.conf.  Either step can be asked to skip the netlink part (do_links
 * = 0) and only write resolv.conf (standalone tests of the file bytes).
 */
#ifndef CONCH_INIT_NETWORK_H
#define CONCH_INIT_NETWORK_H

#include <stddef.h>
#include <stdint.h>

typedef struct network_cfg {
  uint32_t ip, gw; /* host byte order */
  unsigned prefix;
  const char *resolv;      /* exact bytes */
  size_t resolv_len;
  const char *resolv_path; /* "/etc/resolv.conf" */
  int do_links;
} network_cfg;

char *network_apply(const network_cfg *c);
char *network_revalidate(const network_cfg *c);

/* Unlink path (also a dangling symlink), then create it 0644 with exactly
 * these bytes.  Returns 0 or -errno. */
int network_write_resolv(const char *path, const char *data, size_t len);

#endif
