/* initproto_handover — the init protocol's state across an upgrade in
 * place (init/handover.c); see initproto.h. */
#include "init/initproto_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "proto/handover.pb-c.h"

int initproto_listening(void) { return conch.initproto && ips.nlst > 0; }

void initproto_freeze(int on) {
  ips.frozen = on;
  if (on) ip_listeners_pause();
  else ip_listeners_resume();
}

int initproto_busy(void) { return conch.initproto && ips.active != NULL; }

int initproto_handover_save(Conch__Handover__Init *m) {
  if (!conch.initproto) return 0;
  m->present = 1;
  m->state = (uint32_t)ips.state;
  m->terminal.data = (uint8_t *)ips.terminal;
  m->terminal.len = ips.terminal ? ips.terminal_len : 0;
  m->first_done = ips.first_done;
  m->services_ready = ips.sigusr1;
  m->sandbox_id = ips.sandbox_id;
  m->apply_network = ips.opts.apply_network;
  m->apply_restore = ips.opts.apply_restore;
  m->merge_missing = ips.opts.merge_missing;
  m->services_required = ips.opts.services_required;
  m->resolv_path = ips.resolv_path;
  m->ready_path = ips.ready_path;
  m->pid1_logs = ips.opts.pid1_logs != 0;
  m->console_level = ips.opts.console_level;
  m->log_cid = ips.opts.log_cid;
  m->log_port = ips.opts.log_port;
  if (!ips.nlst) return 0;
  Conch__Handover__InitListener *l = calloc(ips.nlst, sizeof *l);
  m->listeners = calloc(ips.nlst, sizeof *m->listeners);
  if (!l || !m->listeners) {
    free(l);
    free(m->listeners);
    m->listeners = NULL;
    return -1;
  }
  for (size_t i = 0; i < ips.nlst; i++) {
    conch__handover__init_listener__init(&l[i]);
    l[i].fd = ips.lst[i]->fd;
    l[i].unix_path = ips.lst[i]->unix_path;
    m->listeners[i] = &l[i];
  }
  m->n_listeners = ips.nlst;
  return 0;
}

void initproto_handover_save_free(Conch__Handover__Init *m) {
  if (m->n_listeners) free(m->listeners[0]);
  free(m->listeners);
  m->listeners = NULL;
  m->n_listeners = 0;
}

int initproto_handover_restore(const Conch__Handover__Init *m) {
  if (!m || !m->present) return 0;
  initproto_configure(&(initproto_opts){.apply_network = m->apply_network,
                                        .apply_restore = m->apply_restore,
                                        .merge_missing = m->merge_missing,
                                        .services_required = m->services_required,
                                        .resolv_path = m->resolv_path,
                                        .services_ready_path = m->ready_path,
                                        .pid1_logs = m->pid1_logs,
                                        .console_level = m->console_level >= 0 && m->console_level <= 3 ? m->console_level : 2,
                                        .log_cid = m->log_cid,
                                        .log_port = m->log_port});
  ips.state = m->state <= INITPROTO_TERMINAL ? (initproto_state)m->state : INITPROTO_TERMINAL;
  if (m->terminal.len) {
    if (!(ips.terminal = malloc(m->terminal.len))) return -1;
    memcpy(ips.terminal, m->terminal.data, m->terminal.len);
    ips.terminal_len = m->terminal.len;
  }
  ips.first_done = m->first_done;
  ips.sigusr1 = m->services_ready;
  if (m->sandbox_id && m->sandbox_id[0] && !(ips.sandbox_id = strdup(m->sandbox_id))) return -1;
  for (size_t i = 0; i < m->n_listeners && ips.nlst < IP_MAX_LISTENERS; i++) {
    ip_listener *l = calloc(1, sizeof *l);
    if (!l) return -1;
    l->fd = m->listeners[i]->fd;
    snprintf(l->unix_path, sizeof l->unix_path, "%s", m->listeners[i]->unix_path);
    ips.lst[ips.nlst++] = l;
  }
  ips.frozen = 1; /* until initproto_handover_resume */
  return 0;
}

void initproto_handover_abandon(const Conch__Handover__Init *m) {
  for (size_t i = 0; m && i < m->n_listeners; i++) {
    int fd = m->listeners[i]->fd, taken = 0;
    for (size_t j = 0; j < ips.nlst && !taken; j++) taken = ips.lst[j]->fd == fd;
    if (!taken && fd > 2) {
      LOG_WARN("upgrade: init listener fd=%d not taken: closed", fd);
      close(fd);
    }
  }
}

void initproto_handover_resume(void) {
  size_t k = 0;
  for (size_t i = 0; i < ips.nlst; i++) {
    ip_listener *l = ips.lst[i];
    if (uv_poll_init_socket(conch.loop, &l->poll, l->fd) != 0) {
      LOG_ERROR("init listener fd=%d lost after the upgrade", l->fd);
      close(l->fd);
      free(l);
      continue;
    }
    l->poll.data = l;
    ips.lst[k++] = l;
  }
  ips.nlst = k;
  ips.frozen = 0;
  ip_listeners_resume();
}
