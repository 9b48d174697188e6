/* handover — the API server's part of an upgrade in place; see handover.h.
 *
 * The drain cuts no request: the listener stops accepting (its socket
 * stays open, new clients wait in its backlog for the next program);
 * streams that may last (RPC_F_DRAIN_END) end `unavailable` "agent is
 * upgrading; resume"; a connection with an exchange under way finishes
 * it (an upload in flight too) and closes — HTTP/1.1 with `Connection:
 * close` on the answer, HTTP/2 refusing new streams, GOAWAY once the open
 * ones ended; connections between requests keep reading (a request that
 * comes is answered the same way) and are carried to the next program,
 * which serves them: no request is in flight when the exec closes the
 * rest.  The drain waits (bounded, core/handover.c) while a connection is
 * not between requests. */
#include "server/handover.h"

#include <stdlib.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "proto/handover.pb-c.h"
#include "server/conn.h"
#include "server/connect.h"
#include "server/server.h"

#define SH_LISTENERS_MAX 4

#define SH_CONNS_MAX 4096

static struct {
  int32_t listen_fd; /* the old program: the API socket while no handle serves it */
  int32_t adopt[SH_LISTENERS_MAX]; /* the new program: the listeners to serve */
  size_t nadopt;
  int32_t *conns; /* the old program: connections carried; the new: to serve */
  size_t nconns;
} S = {.listen_fd = -1};

static void sh_drain(int on) {
  if (on) {
    int fd = server_detach();
    S.listen_fd = fd >= 0 ? fd : -1;
    connect_drain();
    conn_drain(1);
    return;
  }
  if (S.listen_fd >= 0 && server_adopt(S.listen_fd) == 0) S.listen_fd = -1;
  conn_drain(0);
}

static int sh_busy(void) { return conn_busy(); }

static int sh_save(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  if (S.listen_fd >= 0) {
    st->api_listeners = &S.listen_fd;
    st->n_api_listeners = 1;
  }
  free(S.conns);
  S.conns = malloc(SH_CONNS_MAX * sizeof *S.conns);
  S.nconns = S.conns ? conn_carry(S.conns, SH_CONNS_MAX) : 0; /* (none carried: they close with the exec) */
  st->api_conns = S.conns;
  st->n_api_conns = S.nconns;
  return 0;
}

static void sh_save_free(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  st->api_listeners = NULL;
  st->n_api_listeners = 0;
  st->api_conns = NULL;
  st->n_api_conns = 0; /* S.conns stays until the exec (or the next save) */
}

static void sh_keep_fds(const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners; i++) handover_keep_fd(st->api_listeners[i]);
  for (size_t i = 0; i < st->n_api_conns; i++) handover_keep_fd(st->api_conns[i]);
}

/* early: every program that restores serves the listeners, whichever part
 * fails later */
static int sh_restore_early(uv_loop_t *loop, const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners && S.nadopt < SH_LISTENERS_MAX; i++)
    S.adopt[S.nadopt++] = st->api_listeners[i];
  free(S.conns);
  S.conns = st->n_api_conns ? malloc(st->n_api_conns * sizeof *S.conns) : NULL;
  S.nconns = S.conns ? st->n_api_conns : 0;
  for (size_t i = 0; i < S.nconns; i++) S.conns[i] = st->api_conns[i];
  for (size_t i = S.nconns; i < st->n_api_conns; i++) close(st->api_conns[i]); /* out of memory: closed */
  return 0;
}

/* No rollback and the listeners not taken: closed (else the port stays
 * bound by nobody and a fresh listen fails). */
static void sh_abandon(const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners; i++)
    if (st->api_listeners[i] > 2) close(st->api_listeners[i]);
  for (size_t i = 0; i < st->n_api_conns; i++)
    if (st->api_conns[i] > 2) close(st->api_conns[i]);
  S.nadopt = S.nconns = 0;
}

static void sh_resume(void) {
  for (size_t i = 0; i < S.nadopt; i++)
    if (server_adopt(S.adopt[i]) != 0) LOG_ERROR("upgrade: the API listener is lost");
  S.nadopt = 0;
  for (size_t i = 0; i < S.nconns; i++) server_adopt_conn(S.conns[i]);
  if (S.nconns) LOG_INFO("upgrade: %zu API connections carried over", S.nconns);
  free(S.conns);
  S.conns = NULL;
  S.nconns = 0;
}

const handover_part server_handover_part = {
    .name = "server",
    .drain = sh_drain,
    .busy = sh_busy,
    .save = sh_save,
    .save_free = sh_save_free,
    .restore_early = sh_restore_early,
    .keep_fds = sh_keep_fds,
    .abandon = sh_abandon,
    .resume = sh_resume,
};
