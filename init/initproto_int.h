/* init/initproto_int — internal to init/initproto*.c (the init protocol
 * server): the connection, listener and module state types, and the
 * functions the files give each other.  No other file includes it; the
 * rest of the program sees init/initproto.h only.
 *
 * Everything runs on conch.loop.  The only blocking work (rtnetlink and
 * the resolv.conf write) runs in the thread pool on a copy of the
 * validated message; the ready-file check is an async uv_fs_stat.  The
 * module's state is conch.initproto (the daemon context), allocated on
 * first use.
 *
 * Layers, each calling only those below it:
 *   initproto_handover.c  the state kept across an upgrade in place, the
 *                         freeze while one drains
 *   initproto_listen.c    the listeners (unix, vsock), one connection
 *                         accepted at a time; initproto_close
 *   initproto_apply.c     a received message checked and applied (the pool
 *                         work: network, workload keys, defaultUser; then
 *                         identity, restore, forwarding), the sticky
 *                         terminal state
 *   initproto_wait.c      waiting for readiness, answered ready or not_ready
 *   initproto_conn.c      one connection: a frame in, a frame out, close
 *   initproto.c           the module's state, configuration and getters
 * A connection reaches above it only through the two hooks ip_conn_start is
 * given (the frame handler and "closed: let the next one in").
 */
#ifndef CONCH_INIT_INITPROTO_INT_H
#define CONCH_INIT_INITPROTO_INT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <uv.h>

#include "init/initmsg.h"
#include "init/initproto.h"
#include "init/network.h"

#define IP_MAX_LISTENERS 4

typedef enum conn_phase { PH_HEADER, PH_BODY, PH_WORK, PH_WAIT, PH_SEND, PH_CLOSED } conn_phase;

typedef struct ip_conn ip_conn;
struct ip_conn {
  int fd;
  uv_poll_t poll;
  uv_timer_t timer;
  conn_phase phase;
  uint8_t hdr[4];
  size_t got;
  uint32_t len;
  char *body;
  char *resp;
  size_t resp_len, sent;
  void (*on_frame)(ip_conn *c); /* the body is complete (polling and timer stopped) */
  void (*on_done)(void);        /* closed by ip_conn_finish: let the next one in */
  /* thread-pool work (rpc_work_submit): apply or revalidate the network */
  int work_pending;
  int work_revalidate;
  network_cfg cfg;
  char *work_result;
  initmsg_plan plan;
  uint64_t t_recv; /* uv_hrtime() when the frame was complete: ages timestampMs */
  /* readiness wait */
  uint64_t deadline;
  uv_fs_t fsreq;
  int fs_pending;
  int handles_open;
};

typedef struct ip_listener {
  int fd;
  uv_poll_t poll; /* poll.data = this listener */
  int polling;
  char unix_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
} ip_listener;

struct initproto {
  initproto_opts opts;
  char resolv_path[256];
  char ready_path[256];
  initproto_state state;
  char *terminal;            /* the sticky response body */
  size_t terminal_len;
  int first_done;
  int sigusr1;
  char *sandbox_id;
  ip_listener *lst[IP_MAX_LISTENERS]; /* malloc'd: freed by their close callback */
  size_t nlst;
  ip_conn *active;
  uv_timer_t *backoff;                /* malloc'd on first use */
  int frozen;                         /* an upgrade is draining: accept nothing */
};

/* ---- initproto.c ---- */
/* The module's state (conch.initproto), allocated on first use; `ips`
 * names it in these files. */
struct initproto *initproto_self(void);
#define ips (*initproto_self())

/* ---- initproto_conn.c ---- */
/* Serve an accepted socket: read one frame, then on_frame(c); on_done()
 * when it is closed. */
void ip_conn_start(int fd, void (*on_frame)(ip_conn *c), void (*on_done)(void));
/* Queue the response: 4-byte length + body; the connection closes once it
 * is sent (or the send fails or times out). */
void ip_conn_respond(ip_conn *c, const char *body, size_t len);
/* The response of initmsg_response(ready, retryable, msg). */
void ip_respond_simple(ip_conn *c, int ready, int retryable, const char *msg);
/* Close without answering (logged as a rejection). */
void ip_conn_reject(ip_conn *c, const char *why);
/* Close the connection (with or without having answered), then on_done. */
void ip_conn_finish(ip_conn *c);
/* Free it once closed and no pool job or stat is out (their callbacks). */
void ip_conn_maybe_free(ip_conn *c);
/* initproto_close: close it without on_done. */
void ip_conn_abort(ip_conn *c);

/* ---- initproto_wait.c ---- */
/* Wait (up to IP_READY_WAIT_MS) for readiness, then answer. */
void ip_wait_start(ip_conn *c);

/* ---- initproto_apply.c ---- */
/* ip_conn_start's frame handler: check the message and act on it. */
void ip_apply_frame(ip_conn *c);

/* ---- initproto_listen.c ---- */
void ip_listeners_pause(void);
/* Watch the listeners again, unless a connection is open, an upgrade
 * froze them or an accept failure backs off. */
void ip_listeners_resume(void);

#endif
