/* handover — the API server's part of an upgrade in place; see handover.h.
 *
 * The drain freezes reading on every connection instead of closing them
 * one by one: no new request starts work, answers already queued still go
 * out, and the exec closes them all at once (clients reconnect).  Queued
 * output (the Upgrade's answer) gets HANDOVER_FLUSH_MS to reach the
 * kernel: a stream whose reader is slow must not hold the exec for the
 * whole drain. */
#include "server/handover.h"

#include "core/daemon.h"
#include "core/log.h"
#include "proto/handover.pb-c.h"
#include "server/conn.h"
#include "server/server.h"

#define HANDOVER_FLUSH_MS 50
#define SH_LISTENERS_MAX 4

static struct {
  int32_t listen_fd; /* the old program: the API socket while no handle serves it */
  uint64_t began;    /* uv_now at the drain */
  int32_t adopt[SH_LISTENERS_MAX]; /* the new program: the listeners to serve */
  size_t nadopt;
} S = {.listen_fd = -1};

static void sh_drain(int on) {
  if (on) {
    S.began = uv_now(conch.loop);
    conn_freeze(1);
    int fd = server_detach();
    S.listen_fd = fd >= 0 ? fd : -1;
    return;
  }
  if (S.listen_fd >= 0 && server_adopt(S.listen_fd) == 0) S.listen_fd = -1;
  conn_freeze(0);
}

static int sh_busy(void) { return uv_now(conch.loop) - S.began < HANDOVER_FLUSH_MS && conn_pending_output(); }

static int sh_save(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  if (S.listen_fd >= 0) {
    st->api_listeners = &S.listen_fd;
    st->n_api_listeners = 1;
  }
  return 0;
}

static void sh_save_free(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  st->api_listeners = NULL;
  st->n_api_listeners = 0;
}

static void sh_keep_fds(const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners; i++) handover_keep_fd(st->api_listeners[i]);
}

/* early: every program that restores serves the listeners, whichever part
 * fails later */
static int sh_restore_early(uv_loop_t *loop, const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners && S.nadopt < SH_LISTENERS_MAX; i++)
    S.adopt[S.nadopt++] = st->api_listeners[i];
  return 0;
}

/* No rollback and the listeners not taken: closed (else the port stays
 * bound by nobody and a fresh listen fails). */
static void sh_abandon(const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  for (size_t i = 0; i < st->n_api_listeners; i++)
    if (st->api_listeners[i] > 2) close(st->api_listeners[i]);
  S.nadopt = 0;
}

static void sh_resume(void) {
  for (size_t i = 0; i < S.nadopt; i++)
    if (server_adopt(S.adopt[i]) != 0) LOG_ERROR("upgrade: the API listener is lost");
  S.nadopt = 0;
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
