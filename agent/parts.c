/* parts — this program's upgrade in place; see parts.h.  The parts
 * of the services keep typed hooks (proc/service.h, net/service.h); the
 * adapters here hand them the state message the framework holds. */
#include "agent/parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/handover.h"
#include "core/log.h"
#include "core/senv.h"
#include "init/handover.h"
#include "net/service.h"
#include "proc/service.h"
#include "proto/handover.pb-c.h"
#include "server/handover.h"

typedef Conch__Handover__State hstate;

static hstate *ah_st(ProtobufCMessage *m) { return (hstate *)m; }
static const hstate *ah_cst(const ProtobufCMessage *m) { return (const hstate *)m; }

/* ---- the daemon's settings (core/daemon.h's conch) ---- */

static int ah_daemon_save(ProtobufCMessage *m) {
  Conch__Handover__Daemon *d = calloc(1, sizeof *d);
  ProtobufCBinaryData *senv = calloc(conch.senv_len + 1, sizeof *senv);
  if (!d || !senv) {
    free(d);
    free(senv);
    return -1;
  }
  conch__handover__daemon__init(d);
  d->token_set = conch.token_set;
  d->token.data = (uint8_t *)conch.token;
  d->token.len = conch.token_len;
  d->token_gen = conch.token_gen;
  d->sandbox_id = conch.sandbox_id;
  d->default_user = conch.default_user;
  d->log_level = conch.log_level;
  d->no_upgrade = conch.no_upgrade;
  d->init_no_upgrade = conch.init_no_upgrade;
  d->conns_refused = conch.conns_refused;
  d->unauth_closed = conch.unauth_closed;
  d->n_senv = conch.senv_len;
  d->senv = senv;
  for (size_t i = 0; i < conch.senv_len; i++) {
    senv[i].data = (uint8_t *)conch.senv[i];
    senv[i].len = strlen(conch.senv[i]);
  }
  d->log_fd = log_file_fd();
  d->log_path = conch.log_path;
  ah_st(m)->daemon = d;
  return 0;
}

static void ah_daemon_save_free(ProtobufCMessage *m) {
  hstate *st = ah_st(m);
  if (st->daemon) free(st->daemon->senv);
  free(st->daemon);
  st->daemon = NULL;
}

static int ah_daemon_restore(uv_loop_t *loop, const ProtobufCMessage *m) {
  const Conch__Handover__Daemon *d = ah_cst(m)->daemon;
  if (!d) return 0;
  if (d->token_set && d->token.len <= CONCH_TOKEN_MAX) daemon_set_token((const char *)d->token.data, d->token.len);
  if (d->token.len) explicit_bzero(d->token.data, d->token.len); /* the unpacked copy (freed by the framework) */
  snprintf(conch.sandbox_id, sizeof conch.sandbox_id, "%s", d->sandbox_id);
  snprintf(conch.default_user, sizeof conch.default_user, "%s", d->default_user);
  log_set_level((log_level)d->log_level);
  conch.init_no_upgrade = d->init_no_upgrade; /* (--no-upgrade comes with the arguments again) */
  conch.conns_refused = d->conns_refused;
  conch.unauth_closed = d->unauth_closed;
  for (size_t i = 0; i < d->n_senv; i++) {
    char *kv = strndup((const char *)d->senv[i].data, d->senv[i].len);
    char *eq = kv ? strchr(kv, '=') : NULL;
    if (eq) {
      *eq = 0;
      senv_set(kv, eq + 1);
    }
    free(kv);
  }
  int e;
  if (d->log_fd > 0 && (e = log_adopt_file(d->log_fd, d->log_path)) != 0)
    LOG_WARN("handed-over log file not kept: %s", strerror(-e));
  return 0;
}

static void ah_daemon_keep_fds(const ProtobufCMessage *m) {
  const Conch__Handover__Daemon *d = ah_cst(m)->daemon;
  if (d && d->log_fd > 0) handover_keep_fd(d->log_fd);
}

/* (its restore_early cannot fail: nothing to abandon but the log file) */
static void ah_daemon_abandon(const ProtobufCMessage *m) {
  const Conch__Handover__Daemon *d = ah_cst(m)->daemon;
  if (d && d->log_fd > 2 && log_file_fd() < 0) close(d->log_fd);
}

static const handover_part ah_daemon_part = {
    .name = "daemon",
    .abandon = ah_daemon_abandon,
    .save = ah_daemon_save,
    .save_free = ah_daemon_save_free,
    .restore_early = ah_daemon_restore,
    .keep_fds = ah_daemon_keep_fds,
};

/* ---- the process table (proc/handover.c) ---- */

static int ah_proc_save(ProtobufCMessage *m) { return proc_handover_save(ah_st(m)); }
static void ah_proc_save_free(ProtobufCMessage *m) { proc_handover_save_free(ah_st(m)); }
static int ah_proc_restore_early(uv_loop_t *loop, const ProtobufCMessage *m) {
  return proc_handover_restore_cgroups(loop, ah_cst(m));
}
static int ah_proc_restore(const ProtobufCMessage *m, uint64_t now_mono, char *err, size_t errn) {
  return proc_handover_restore(ah_cst(m), now_mono, err, errn);
}
static void ah_proc_keep_fds(const ProtobufCMessage *m) { proc_handover_keep_fds(ah_cst(m)); }
static void ah_proc_abandon(const ProtobufCMessage *m) { proc_handover_abandon(ah_cst(m)); }

static const handover_part ah_proc_part = {
    .name = "processes",
    .busy = proc_handover_busy,
    .save = ah_proc_save,
    .save_free = ah_proc_save_free,
    .restore_early = ah_proc_restore_early,
    .restore = ah_proc_restore,
    .keep_fds = ah_proc_keep_fds,
    .abandon = ah_proc_abandon,
    .resume = proc_handover_resume,
};

/* ---- the ports: forwarders and relayed connections (net/relay.c) ---- */

static int ah_net_save(ProtobufCMessage *m) {
  hstate *st = ah_st(m);
  int r = net_handover_save(st);
#ifndef CONCH_STATIC /* test seam: as a format-1 writer, no net descriptors (tests/integration/test_upgrade_state.py) */
  const char *fault = getenv("CONCH_FAULT");
  if (r == 0 && st->net && fault && strcmp(fault, "handover_format_1") == 0) st->net->n_forwarders = st->net->n_relays = 0;
#endif
  return r;
}
static void ah_net_save_free(ProtobufCMessage *m) { net_handover_save_free(ah_st(m)); }
static int ah_net_restore(const ProtobufCMessage *m, uint64_t now_mono, char *err, size_t errn) {
#ifndef CONCH_STATIC /* test seam: the ports part fails, in the rollback too (tests/integration/test_upgrade_state.py) */
  const char *fault = getenv("CONCH_FAULT");
  if (fault && strcmp(fault, "handover_ports") == 0) {
    snprintf(err, errn, "CONCH_FAULT=handover_ports");
    return -1;
  }
#endif
  return net_handover_restore(ah_cst(m), err, errn);
}
static void ah_net_keep_fds(const ProtobufCMessage *m) { net_handover_keep_fds(ah_cst(m)); }
static void ah_net_abandon(const ProtobufCMessage *m) { net_handover_abandon(ah_cst(m)); }

static const handover_part ah_net_part = {
    .name = "ports",
    .save = ah_net_save,
    .save_free = ah_net_save_free,
    .restore = ah_net_restore,
    .keep_fds = ah_net_keep_fds,
    .abandon = ah_net_abandon,
    .resume = net_handover_resume,
};

void agent_handover_setup(int argc, char **argv) {
  static const handover_schema schema = {
      .desc = &conch__handover__state__descriptor,
      .format = HANDOVER_FORMAT,
      .format_min = HANDOVER_FORMAT_MIN,
  };
  handover_init(&schema, argc, argv);
  handover_add_part(&ah_daemon_part);
  handover_add_part(&server_handover_part);
  handover_add_part(&ah_proc_part);
  handover_add_part(&ah_net_part);
  init_handover_register();
}
