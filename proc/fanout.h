/* fanout — delivers one process's events to its subscribers (the streams
 * of StartProcess and Connect): start, output, keepalive and end events,
 * drops for lossy subscribers, flow control for the lossless one.
 *
 * It knows nothing of the process record (proc/proc.h, process.c owns
 * that): what an event says (pid, exit status) comes in as arguments, and
 * what the record must do about its subscribers goes back through the two
 * callbacks given at init — flow(f, 1/0): stop/resume reading the outputs
 * (the lossless subscriber's bytes are held / have room again, or it
 * left); left(f): a subscriber left (the record may be free to go).
 *
 * Subscribers: the foreground starter is lossless — once its call holds
 * more than PROC_SUB_HELD unsent bytes (or the daemon-wide budget is past
 * its half, budget_over) it asks rpc_out_room, and when the transport
 * has no room, flow(f, 1) until the room callback, then flow(f, 0): the
 * pipe is not read while the stream's bytes are held, so a connection of
 * 128 such streams holds about 128 x PROC_SUB_HELD.
 * The others are lossy: an output event for a subscriber whose call
 * already holds PROC_SUB_QUEUE_BYTES unsent bytes (or while the budget is
 * past its half) is dropped for it and counted; nobody waits for them.  Start/end/keepalive events are never
 * dropped, and a drop is always seen: by the offset of the next output
 * event of that channel, or, when the drop was the channel's last output,
 * by an empty output event at the channel's end sent before `end`.  Every subscriber gets a keepalive after keepalive_ms of
 * silence (0: never).  Loop thread only.
 */
#ifndef CONCH_PROC_FANOUT_H
#define CONCH_PROC_FANOUT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "core/bufref.h"
#include "core/list.h"
#include "server/rpc.h"

#define PROC_READ_MAX (32u * 1024)
#define PROC_PTY_READ_MAX (16u * 1024)
/* Room in front of output read for in-place framing (envelope + event
 * tags + the offset field: 5 + 4 + 11 + 4, rounded up). */
#define PROC_HEADROOM 32
#define PROC_SUB_QUEUE_BYTES (64u * PROC_READ_MAX) /* ≈ the reference's 64 events */
#define PROC_SUB_HELD (8u * PROC_READ_MAX) /* lossless: bytes held before asking room */
#define PROC_MAX_SUBS 256 /* subscribers per process */

enum proc_out_kind { PROC_OUT_STDOUT, PROC_OUT_STDERR, PROC_OUT_PTY };

struct proc_fanout;

struct proc_sub {
  rpc_call *call;
  struct proc_fanout *f;
  list_node link; /* in f->subs, newest first */
  uv_timer_t ka;
  uint64_t last_send; /* uv_now of the last message */
  uint64_t dropped;
  /* per channel (enum proc_out_kind): the end of the last output dropped
   * for it since one was delivered; 0: none owed.  The end event is
   * preceded by an empty data event at that offset, so a drop at the very
   * end still shows as a jump in `offset` */
  uint64_t owed[3];
  int lossless;       /* foreground starter: flow control instead of drops */
  int drain_armed;
};

struct proc_fanout {
  uv_loop_t *loop;
  uint64_t keepalive_ms;
  list_node subs; /* struct proc_sub, newest first */
  size_t nsubs;
  uint64_t dropped_total; /* of subscribers gone */
  void (*flow)(struct proc_fanout *f, int paused);
  void (*left)(struct proc_fanout *f);
};

void proc_fanout_init(struct proc_fanout *f, uv_loop_t *loop, uint64_t keepalive_ms,
                      void (*flow)(struct proc_fanout *, int), void (*left)(struct proc_fanout *));
/* A subscriber for call c (its rpc_user), or NULL (PROC_MAX_SUBS, ENOMEM). */
struct proc_sub *proc_sub_add(struct proc_fanout *f, rpc_call *c, int lossless);
/* Detach and free (the call itself is left alone: it is ending); then
 * flow(f, 0) if it was the lossless one, and left(f). */
void proc_sub_remove(struct proc_sub *s);
/* Finish s's call with an error and remove it. */
void proc_sub_fail(struct proc_sub *s, rpc_code code, const char *msg);
/* The same for every subscriber. */
void proc_fanout_fail(struct proc_fanout *f, rpc_code code, const char *msg);

/* The start event to s (a new subscriber of a running process). */
void proc_sub_send_start(struct proc_sub *s, int pid);
/* An output event (enum proc_out_kind) to every subscriber; offset: the
 * bytes of that channel sent before it (ProcessDataEvent.offset). */
void proc_fanout_data(struct proc_fanout *f, int kind, const char *buf, size_t n, uint64_t offset);
/* 1 when the one subscriber is the lossless starter speaking the binary
 * codec: output can be framed in place by proc_fanout_data_packed, which
 * takes a malloc'd buf holding n bytes at PROC_HEADROOM. */
int proc_fanout_direct(const struct proc_fanout *f);
void proc_fanout_data_packed(struct proc_fanout *f, int kind, uint8_t *buf, size_t n, uint64_t offset);
/* A replayed output event to the lossy subscriber s, under the same rule
 * as live output (dropped and counted past PROC_SUB_QUEUE_BYTES or while
 * the budget is past its half).  ref
 * holds one reference on the bytes, given up here: a binary, uncompressed
 * call sends them as they are (rpc_send_bytes_tail, no copy), others get
 * them encoded. */
void proc_sub_send_replay(struct proc_sub *s, int kind, const uint8_t *data, size_t n, uint64_t offset,
                          bufref *ref);
/* What the end event says (api.md §6, §9): the leader's wait status, and
 * what the command's cgroup (or wait4) tells. */
typedef struct proc_end_info {
  int wstatus;
  int oom_killed;
  int left_running;
  uint64_t cpu_user_usec, cpu_system_usec, memory_peak;
} proc_end_info;
/* The end event to every subscriber, each call then finished with RPC_OK
 * and removed. */
void proc_fanout_end(struct proc_fanout *f, int pid, const proc_end_info *e);
/* Connect to an ended process: start + end on c, then finish it (no
 * subscriber). */
void proc_send_final(rpc_call *c, int pid, const proc_end_info *e);
/* Events dropped so far, for every subscriber past and present. */
uint64_t proc_fanout_dropped(const struct proc_fanout *f);

#endif
