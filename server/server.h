/* server — the API listener(s) on the loop. */
#ifndef CONCH_SERVER_H
#define CONCH_SERVER_H

/* Listen for the API on addr: "HOST:PORT", "[V6]:PORT" or ":PORT" (all
 * IPv4 addresses).  Serves from the next loop turn; sets conch.api_serving.
 * Returns 0 or a negative libuv/errno code (logged). */
int server_listen(const char *addr);
/* The port actually bound by the last server_listen (for ":0"). */
int server_port(void);
/* Upgrade in place: stop accepting but keep the socket listening (clients
 * wait in its backlog): the handle is closed, a descriptor (close-on-exec)
 * of the socket returned, or -errno.  server_adopt serves on such a
 * descriptor (the next program's, or the same after a failed exec). */
int server_detach(void);
int server_adopt(int fd);
/* An API connection carried over by an upgrade (conn.h conn_carry). */
void server_adopt_conn(int fd);

#endif
