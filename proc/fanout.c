/* fanout — subscribers of a process: events, drops, flow control,
 * keepalives; see fanout.h. */
#include <string.h>
#include <stdlib.h>

#include "core/log.h"
#include "proc/exitfmt.h"
#include "proc/fanout.h"
#include "proto/agent.pb-c.h"
#include "proto/wire.h"

static void proc_sub_on_ka(uv_timer_t *h);

void proc_fanout_init(struct proc_fanout *f, uv_loop_t *loop, uint64_t keepalive_ms,
                      void (*flow)(struct proc_fanout *, int), void (*left)(struct proc_fanout *)) {
  memset(f, 0, sizeof *f);
  f->loop = loop;
  f->keepalive_ms = keepalive_ms;
  f->flow = flow;
  f->left = left;
}

struct proc_sub *proc_sub_add(struct proc_fanout *f, rpc_call *c, int lossless) {
  if (f->nsubs >= PROC_MAX_SUBS) return NULL;
  struct proc_sub *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->call = c;
  s->f = f;
  s->lossless = lossless;
  uv_timer_init(f->loop, &s->ka);
  s->ka.data = s;
  list_insert_head(&f->subs, &s->link);
  f->nsubs++;
  rpc_set_user(c, s);
  return s;
}

static void proc_sub_free(uv_handle_t *h) { free(h->data); }

void proc_sub_remove(struct proc_sub *s) {
  struct proc_fanout *f = s->f;
  int lossless = s->lossless;
  if (s->drain_armed) rpc_on_drain(s->call, NULL);
  rpc_set_user(s->call, NULL);
  list_remove(&s->link);
  f->nsubs--;
  f->dropped_total += s->dropped;
  uv_close((uv_handle_t *)&s->ka, proc_sub_free);
  if (lossless) f->flow(f, 0); /* nobody left to wait for */
  f->left(f);
}

uint64_t proc_fanout_dropped(const struct proc_fanout *f) {
  uint64_t n = f->dropped_total;
  const struct proc_sub *s;
  list_each(s, &f->subs, link) n += s->dropped;
  return n;
}

static int proc_sub_send(struct proc_sub *s, const Pb__ProcessEvent *ev) {
  s->last_send = uv_now(s->f->loop);
  return rpc_send(s->call, &ev->base);
}

static void proc_sub_arm_ka(struct proc_sub *s, uint64_t in_ms) {
  if (s->f->keepalive_ms) uv_timer_start(&s->ka, proc_sub_on_ka, in_ms, 0);
}

static void proc_sub_on_ka(uv_timer_t *h) {
  struct proc_sub *s = h->data;
  uint64_t ka = s->f->keepalive_ms;
  uint64_t now = uv_now(s->f->loop);
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

void proc_sub_send_start(struct proc_sub *s, int pid) {
  Pb__ProcessStartEvent st = PB__PROCESS_START_EVENT__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  st.pid = (int32_t)pid;
  ev.event_case = PB__PROCESS_EVENT__EVENT_START;
  ev.start = &st;
  proc_sub_send(s, &ev);
  proc_sub_arm_ka(s, s->f->keepalive_ms);
}

static void proc_sub_on_room(rpc_call *c) {
  struct proc_sub *s = rpc_user(c);
  if (!s) return;
  s->drain_armed = 0;
  s->f->flow(s->f, 0);
}

/* After a lossless send: stop reading the outputs while the stream's bytes
 * are held (see fanout.h). */
static void proc_sub_hold(struct proc_sub *s) {
  if (s->drain_armed || (rpc_outq_bytes(s->call) <= PROC_SUB_HELD && !budget_over())) return;
  if (rpc_out_room(s->call, PROC_SUB_HELD, proc_sub_on_room)) return;
  s->drain_armed = 1;
  s->f->flow(s->f, 1);
}

/* ProcessEvent{data{<kind>: buf[0, n), offset}} into ev and d. */
static void proc_data_event(Pb__ProcessEvent *ev, Pb__ProcessDataEvent *d, int kind, const uint8_t *buf,
                            size_t n, uint64_t offset) {
  pb__process_data_event__init(d);
  pb__process_event__init(ev);
  ProtobufCBinaryData bin = {n, (uint8_t *)buf};
  d->offset = offset;
  switch (kind) {
  case PROC_OUT_STDOUT:
    d->output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDOUT;
    d->stdout = bin;
    break;
  case PROC_OUT_STDERR:
    d->output_case = PB__PROCESS_DATA_EVENT__OUTPUT_STDERR;
    d->stderr = bin;
    break;
  default:
    d->output_case = PB__PROCESS_DATA_EVENT__OUTPUT_PTY;
    d->pty = bin;
    break;
  }
  ev->event_case = PB__PROCESS_EVENT__EVENT_DATA;
  ev->data = d;
}

void proc_fanout_data(struct proc_fanout *f, int kind, const char *buf, size_t n, uint64_t offset) {
  Pb__ProcessDataEvent d;
  Pb__ProcessEvent ev;
  proc_data_event(&ev, &d, kind, (const uint8_t *)buf, n, offset);
  struct proc_sub *s, *next;
  list_each_safe(s, next, &f->subs, link) {
    if (s->lossless) {
      if (proc_sub_send(s, &ev) != 0) continue;
      proc_sub_hold(s);
    } else if (rpc_outq_bytes(s->call) >= PROC_SUB_QUEUE_BYTES || budget_over()) {
      s->dropped++;
      s->owed[kind] = offset + n;
    } else if (proc_sub_send(s, &ev) == 0) {
      s->owed[kind] = 0; /* the jump shows in this event's offset */
    }
  }
}

int proc_fanout_direct(const struct proc_fanout *f) {
  const struct proc_sub *s = list_first_entry(&f->subs, struct proc_sub, link);
  return f->nsubs == 1 && s->lossless && !rpc_is_json(s->call);
}

/* ProcessEvent{data{offset, <kind>: n bytes}} up to the bytes (which
 * follow at buf + end: in the buffer, or as a send's tail), written so
 * that it ends at buf + end (at most 19 bytes, and RPC_HEADROOM more stay
 * free in front when end = PROC_HEADROOM); returns where it starts.  offset
 * goes first (0 is omitted, as protobuf-c does): the bytes must come last. */
static size_t proc_data_frame(uint8_t *buf, size_t end, int kind, size_t n, uint64_t offset) {
  uint32_t field = kind == PROC_OUT_STDOUT ? 1 : kind == PROC_OUT_STDERR ? 2 : 3;
  size_t off = wire_prepend_len(buf, end, field, n);
  if (offset) {
    uint8_t v[WIRE_VARINT_MAX];
    size_t vl = wire_varint_put(v, offset);
    off -= vl;
    memcpy(buf + off, v, vl);
    buf[--off] = (uint8_t)wire_key(4, WIRE_T_VARINT); /* ProcessDataEvent.offset */
  }
  return wire_prepend_len(buf, off, 2, end + n - off); /* ProcessEvent.data */
}

/* Frame the event in place, in the headroom in front of the bytes at
 * buf + PROC_HEADROOM, and hand buf over: no copy of the output. */
void proc_fanout_data_packed(struct proc_fanout *f, int kind, uint8_t *buf, size_t n, uint64_t offset) {
  struct proc_sub *s = list_first_entry(&f->subs, struct proc_sub, link);
  size_t off = proc_data_frame(buf, PROC_HEADROOM, kind, n, offset);
  s->last_send = uv_now(f->loop);
  if (rpc_send_bytes(s->call, buf, buf + off, PROC_HEADROOM + n - off) != 0) return;
  proc_sub_hold(s);
}

void proc_sub_send_replay(struct proc_sub *s, int kind, const uint8_t *data, size_t n, uint64_t offset,
                          bufref *ref) {
  if (rpc_outq_bytes(s->call) >= PROC_SUB_QUEUE_BYTES || budget_over()) { /* as live output to a lossy subscriber */
    s->dropped++;
    s->owed[kind] = offset + n;
    ref->release(ref);
    return;
  }
  s->owed[kind] = 0;
  s->last_send = uv_now(s->f->loop);
  if (!rpc_is_json(s->call) && !rpc_compresses(s->call)) {
    uint8_t *head = malloc(PROC_HEADROOM);
    if (!head) {
      ref->release(ref);
      return;
    }
    size_t off = proc_data_frame(head, PROC_HEADROOM, kind, n, offset);
    rpc_send_bytes_tail(s->call, head, head + off, PROC_HEADROOM - off, data, n, ref);
    return;
  }
  Pb__ProcessDataEvent d;
  Pb__ProcessEvent ev;
  proc_data_event(&ev, &d, kind, data, n, offset);
  rpc_send(s->call, &ev.base);
  ref->release(ref);
}

/* Send the end event on c. */
static int proc_send_end_event(rpc_call *c, const proc_end_info *end) {
  proc_exit_info ei;
  proc_exit_describe(end->wstatus, &ei);
  Pb__ProcessEndEvent e = PB__PROCESS_END_EVENT__INIT;
  Pb__ResourceUsage u = PB__RESOURCE_USAGE__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  e.exit_code = ei.exit_code;
  e.exited = 1;
  e.status = (char *)ei.status;
  e.error = ei.error;
  e.oom_killed = end->oom_killed ? 1 : 0;
  e.left_running = end->left_running;
  u.cpu_user_usec = end->cpu_user_usec;
  u.cpu_system_usec = end->cpu_system_usec;
  u.memory_peak_bytes = end->memory_peak;
  e.usage = &u;
  ev.event_case = PB__PROCESS_EVENT__EVENT_END;
  ev.end = &e;
  return rpc_send(c, &ev.base);
}

/* End event to one subscriber, then finish it: first, for each channel
 * whose last output was dropped for it, an empty output event at that
 * channel's end (the jump a client resumes from). */
static void proc_sub_send_end(struct proc_sub *s, int pid, const proc_end_info *e) {
  rpc_call *c = s->call;
  s->last_send = uv_now(s->f->loop);
  for (int k = 0; k < 3; k++)
    if (s->owed[k]) {
      Pb__ProcessDataEvent d;
      Pb__ProcessEvent ev;
      proc_data_event(&ev, &d, k, (const uint8_t *)"", 0, s->owed[k]);
      rpc_send(c, &ev.base);
      s->owed[k] = 0;
    }
  int r = proc_send_end_event(c, e);
  if (s->dropped)
    LOG_INFO("subscriber dropped events pid=%d dropped=%llu", pid, (unsigned long long)s->dropped);
  proc_sub_remove(s);
  rpc_finish(c, r == 0 ? RPC_OK : RPC_RESOURCE_EXHAUSTED, r == 0 ? NULL : "cannot send process event");
}

void proc_fanout_end(struct proc_fanout *f, int pid, const proc_end_info *e) {
  struct proc_sub *s, *next;
  list_each_safe(s, next, &f->subs, link) {
    proc_sub_send_end(s, pid, e);
  }
}

void proc_sub_fail(struct proc_sub *s, rpc_code code, const char *msg) {
  rpc_call *c = s->call;
  proc_sub_remove(s);
  rpc_finish(c, code, msg);
}

void proc_fanout_fail(struct proc_fanout *f, rpc_code code, const char *msg) {
  struct proc_sub *s, *next;
  list_each_safe(s, next, &f->subs, link) {
    proc_sub_fail(s, code, msg);
  }
}

void proc_send_final(rpc_call *c, int pid, const proc_end_info *e) {
  Pb__ProcessStartEvent st = PB__PROCESS_START_EVENT__INIT;
  Pb__ProcessEvent ev = PB__PROCESS_EVENT__INIT;
  st.pid = (int32_t)pid;
  ev.event_case = PB__PROCESS_EVENT__EVENT_START;
  ev.start = &st;
  if (rpc_send(c, &ev.base) != 0) {
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "cannot send process event");
    return;
  }
  int r = proc_send_end_event(c, e);
  rpc_finish(c, r == 0 ? RPC_OK : RPC_RESOURCE_EXHAUSTED, r == 0 ? NULL : "cannot send process event");
}
