/* fanout — subscribers of a process: events, drops, flow control,
 * keepalives; see proc.h. */
#include <string.h>
#include <stdlib.h>

#include "agent/log.h"
#include "proc/exitfmt.h"
#include "proc/proc.h"
#include "proto/agent.pb-c.h"
#include "proto/wire.h"

static void proc_sub_on_ka(uv_timer_t *h);

struct proc_sub *proc_sub_add(struct proc *p, rpc_call *c, int lossless) {
  if (p->nsubs >= PROC_MAX_SUBS) return NULL;
  struct proc_sub *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->call = c;
  s->p = p;
  s->lossless = lossless;
  uv_timer_init(p->t->loop, &s->ka);
  s->ka.data = s;
  s->next = p->subs;
  if (p->subs) p->subs->prev = s;
  p->subs = s;
  p->nsubs++;
  rpc_set_user(c, s);
  return s;
}

static void proc_sub_free(uv_handle_t *h) { free(h->data); }

void proc_sub_remove(struct proc_sub *s) {
  struct proc *p = s->p;
  if (s->drain_armed) rpc_on_drain(s->call, NULL);
  rpc_set_user(s->call, NULL);
  if (s->prev) s->prev->next = s->next; else p->subs = s->next;
  if (s->next) s->next->prev = s->prev;
  p->nsubs--;
  p->dropped_total += s->dropped;
  uv_close((uv_handle_t *)&s->ka, proc_sub_free);
  if (s->lossless && p->paused) proc_pause(p, 0); /* nobody left to wait for */
  proc_check_free(p);
}

static int proc_sub_send(struct proc_sub *s, const Pb__ProcessEvent *ev) {
  s->last_send = uv_now(s->p->t->loop);
  return rpc_send(s->call, &ev->base);
}

static void proc_sub_arm_ka(struct proc_sub *s, uint64_t in_ms) {
  if (s->p->t->keepalive_ms) uv_timer_start(&s->ka, proc_sub_on_ka, in_ms, 0);
}

static void proc_sub_on_ka(uv_timer_t *h) {
  struct proc_sub *s = h->data;
  uint64_t ka = s->p->t->keepalive_ms;
  uint64_t now = uv_now(s->p->t->loop);
  uint64_t idle = now - s->last_send;
  if (idle < ka) {
    proc_sub_arm_ka(s, ka - idle);
    return;
  }
  /* Output still waiting for the client is not silence. */
  if (rpc_outq_bytes(s->call) == 0) {
    Pb__ProcessKeepAlive k = PB__PROCESS_KEEP_ALIVE__INIT;
    Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
    ev.event_case = PB__PROCESS_EVENT__EVENT_KEEPALIVE;
    ev.keepalive = &k;
    proc_sub_send(s, &ev);
  } else {
    s->last_send = now;
  }
  proc_sub_arm_ka(s, ka);
}

void proc_sub_send_start(struct proc_sub *s) {
  Pb__ProcessStartEvent st = PB__PROCESS_START_EVENT__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  st.pid = (int32_t)s->p->pid;
  ev.event_case = PB__PROCESS_EVENT__EVENT_START;
  ev.start = &st;
  proc_sub_send(s, &ev);
  proc_sub_arm_ka(s, s->p->t->keepalive_ms);
}

static void proc_sub_on_drain(rpc_call *c) {
  struct proc_sub *s = rpc_user(c);
  if (!s) return;
  s->drain_armed = 0;
  proc_pause(s->p, 0);
}

void proc_fanout_data(struct proc *p, int kind, const char *buf, size_t n) {
  Pb__ProcessDataEvent d;
  pb__process_data_event__init(&d);
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  ProtobufCBinaryData bin = {n, (uint8_t *)buf};
  switch (kind) {
  case PROC_OUT_STDOUT:
    d.output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDOUT;
    d.stdout = bin;
    break;
  case PROC_OUT_STDERR:
    d.output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDERR;
    d.stderr = bin;
    break;
  default:
    d.output_case = PB__PROCESS_DATA_EVENT__OUTPUT_PTY;
    d.pty = bin;
    break;
  }
  ev.event_case = PB__PROCESS_EVENT__EVENT_DATA;
  ev.data = &d;
  struct proc_sub *s = p->subs, *next;
  for (; s; s = next) {
    next = s->next;
    if (s->lossless) {
      if (proc_sub_send(s, &ev) != 0) continue;
      if (rpc_outq_bytes(s->call) > RPC_OUTQ_HIGH && !s->drain_armed) {
        s->drain_armed = 1;
        proc_pause(p, 1);
        rpc_on_drain(s->call, proc_sub_on_drain);
      }
    } else if (rpc_outq_bytes(s->call) >= PROC_SUB_QUEUE_BYTES) {
      s->dropped++;
    } else {
      proc_sub_send(s, &ev);
    }
  }
}

int proc_fanout_direct(const struct proc *p) {
  return p->nsubs == 1 && p->subs->lossless && rpc_is_proto(p->subs->call);
}

/* Frame ProcessEvent{data{<kind>: buf[PROC_HEADROOM, +n)}} in place, in the
 * headroom in front of the bytes, and hand buf over: no copy of the output. */
void proc_fanout_data_packed(struct proc *p, int kind, uint8_t *buf, size_t n) {
  struct proc_sub *s = p->subs;
  uint32_t field = kind == PROC_OUT_STDOUT ? 1 : kind == PROC_OUT_STDERR ? 2 : 3;
  size_t off = wire_prepend_len(buf, PROC_HEADROOM, field, n);
  off = wire_prepend_len(buf, off, 2, PROC_HEADROOM + n - off); /* ProcessEvent.data */
  s->last_send = uv_now(p->t->loop);
  if (rpc_send_packed(s->call, buf, off, PROC_HEADROOM + n - off) != 0) return;
  if (rpc_outq_bytes(s->call) > RPC_OUTQ_HIGH && !s->drain_armed) {
    s->drain_armed = 1;
    proc_pause(p, 1);
    rpc_on_drain(s->call, proc_sub_on_drain);
  }
}

/* Send the end event of p's exit status on c. */
static int proc_send_end_event(rpc_call *c, const struct proc *p) {
  proc_exit_info ei;
  proc_exit_describe(p->wstatus, &ei);
  Pb__ProcessEndEvent e = PB__PROCESS_END_EVENT__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  e.exit_code = ei.exit_code;
  e.exited = 1;
  e.status = (char *)ei.status;
  e.error = ei.error;
  ev.event_case = PB__PROCESS_EVENT__EVENT_END;
  ev.end = &e;
  return rpc_send(c, &ev.base);
}

void proc_sub_send_end(struct proc_sub *s) {
  rpc_call *c = s->call;
  s->last_send = uv_now(s->p->t->loop);
  int r = proc_send_end_event(c, s->p);
  if (s->dropped)
    LOG_INFO("subscriber dropped events pid=%d dropped=%llu", (int)s->p->pid,
             (unsigned long long)s->dropped);
  proc_sub_remove(s);
  rpc_finish(c, r == 0 ? RPC_OK : RPC_RESOURCE_EXHAUSTED, r == 0 ? NULL : "cannot send process event");
}

void proc_fanout_end(struct proc *p) {
  struct proc_sub *s = p->subs, *next;
  for (; s; s = next) {
    next = s->next;
    proc_sub_send_end(s);
  }
}

void proc_sub_fail(struct proc_sub *s, rpc_code code, const char *msg) {
  rpc_call *c = s->call;
  proc_sub_remove(s);
  rpc_finish(c, code, msg);
}

void proc_send_final(rpc_call *c, struct proc *p) {
  Pb__ProcessStartEvent st = PB__PROCESS_START_EVENT__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  st.pid = (int32_t)p->pid;
  ev.event_case = PB__PROCESS_EVENT__EVENT_START;
  ev.start = &st;
  if (rpc_send(c, &ev.base) != 0) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "cannot send process event");
    return;
  }
  int r = proc_send_end_event(c, p);
  rpc_finish(c, r == 0 ? RPC_OK : RPC_RESOURCE_EXHAUSTED, r == 0 ? NULL : "cannot send process event");
}
