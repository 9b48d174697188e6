/* handover — the init protocol's part of an upgrade in place
 * (core/handover.h): the init listeners (kept open across the exec, so an
 * init message sent meanwhile waits in their backlog and the new program
 * answers it) and the protocol's state (its sticky terminal answer, the
 * sandbox id, what the mode applies).  (The forwarding address is the
 * ports' part: net/service.h.)  Registered in both modes (serve --init-listen has the
 * same state); PID 1 never boots again after a handover (pid1.h). */
#include "init/handover.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/daemon.h"
#include "core/handover.h"
#include "core/log.h"
#include "init/initproto.h"
#include "proto/handover.pb-c.h"

static void ih_drain(int on) { initproto_freeze(on); }

static int ih_busy(void) { return initproto_busy(); }

static int ih_save(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  st->init = calloc(1, sizeof *st->init);
  if (!st->init) return -1;
  conch__handover__init__init(st->init);
  if (initproto_handover_save(st->init) != 0) return -1;
  st->init->pid1 = conch.is_pid1;
  return 0;
}

static void ih_save_free(ProtobufCMessage *m) {
  Conch__Handover__State *st = (Conch__Handover__State *)m;
  if (st->init) initproto_handover_save_free(st->init);
  free(st->init);
  st->init = NULL;
}

static void ih_keep_fds(const ProtobufCMessage *m) {
  const Conch__Handover__State *st = (const Conch__Handover__State *)m;
  if (!st->init) return;
  for (size_t i = 0; i < st->init->n_listeners; i++) handover_keep_fd(st->init->listeners[i]->fd);
}

static int ih_restore(const ProtobufCMessage *m, uint64_t now_mono, char *err, size_t errn) {
  if (initproto_handover_restore(((const Conch__Handover__State *)m)->init) != 0) {
    snprintf(err, errn, "out of memory");
    return -1;
  }
  return 0;
}

static void ih_resume(void) { initproto_handover_resume(); }

static void ih_abandon(const ProtobufCMessage *m) {
  initproto_handover_abandon(((const Conch__Handover__State *)m)->init);
}

static const handover_part init_part = {
    .name = "init",
    .drain = ih_drain,
    .busy = ih_busy,
    .save = ih_save,
    .save_free = ih_save_free,
    .restore = ih_restore,
    .keep_fds = ih_keep_fds,
    .abandon = ih_abandon,
    .resume = ih_resume,
};

void init_handover_register(void) { handover_add_part(&init_part); }
