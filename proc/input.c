/* input — stdin and PTY input of running processes (api.md §9
 * "Interactive processes"): the per-process input queue and the SendInput,
 * StreamInput, CloseStdin and Update RPCs.
 *
 * One FIFO of chunks per process carries the one-shot `stdin` bytes and
 * every input RPC in arrival order, so order holds across calls.  The FIFO
 * holds at most PROC_INPUT_MAX unwritten bytes; a message that does not fit
 * is parked with its call in a wait list (FIFO too) and admitted as the
 * child reads — a parked StreamInput has its input paused
 * (rpc_pause_input), so it stops reading its client; a parked SendInput
 * simply has not answered yet.  A call holds at most one parked message
 * (≤ PROC_INPUT_MAX), and parking stops at PROC_INPUT_MAX parked bytes per
 * process (a call past that fails `resource_exhausted` `process input
 * queue full`), so a process holds at most 1 MiB queued + 2 MiB parked.
 * Every chunk (the one-shot stdin too, from the StartProcess request on)
 * also holds its bytes of the daemon-wide budget (budget_take): input
 * for processes that never read is bounded in total, not only per
 * process; past it a call fails `resource_exhausted` PROC_INPUT_BUSY.
 *
 * Writes are nonblocking: write() until EAGAIN, then a uv_poll on the fd
 * for writable.  For a PTY the fd is a dup of the master, so this poll
 * never touches the output's (one libuv watcher per fd number).
 *
 * A call answers {} once all its bytes were written (StreamInput: after the
 * client half-closed).  A call that ends early (client gone, deadline)
 * leaves its queued bytes queued and the process running; its parked
 * message, never admitted, is dropped.  When stdin closes for good (the
 * leader exits, EPIPE/EIO) the queue is dropped and calls still waiting for
 * bytes fail `failed_precondition` `process stdin is closed`.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "core/log.h"
#include "proc/input.h"
#include "proc/proc.h"
#include "proc/validate.h"
#include "proto/agent.pb-c.h"

struct proc_in_chunk {
  struct proc_in_chunk *next;
  struct proc_input *owner; /* the call answered once these bytes are written, or NULL */
  size_t len, off;
  size_t budget;  /* bytes of the daemon-wide budget it holds */
  uint8_t *bytes; /* data, or the request's one-shot stdin buffer (taken, not copied) */
  uint8_t data[];
};

static void proc_chunk_free(struct proc_in_chunk *ch) {
  if (!ch) return;
  if (ch->bytes != ch->data) free(ch->bytes);
  budget_give(ch->budget);
  free(ch);
}

/* One SendInput or StreamInput call. */
struct proc_input {
  rpc_call *call; /* NULL once the call ended */
  struct proc *p; /* NULL until a stream's start */
  int stream;
  int input_end;  /* unary: at once; stream: the client half-closed */
  size_t inflight; /* its chunks in p's FIFO */
  struct proc_in_chunk *parked; /* did not fit; waiting in p's wait list */
  list_node wlink;              /* in p->in_wait while parked */
};

#define PROC_STDIN_CLOSED "process stdin is closed"
#define PROC_INPUT_FULL "process input queue full"

static void proc_in_flush(struct proc *p);

/* ---- calls ---- */
static void proc_input_free_if_done(struct proc_input *in) {
  if (in->call || in->inflight || in->parked) return;
  struct proc *p = in->p;
  free(in);
  if (p) {
    p->ninputs--;
    proc_check_free(p);
  }
}

static void proc_input_answer(struct proc_input *in) {
  rpc_call *c = in->call;
  in->call = NULL;
  rpc_set_user(c, NULL);
  int r;
  if (in->stream) {
    Pb__StreamInputResponse resp = PB__STREAM_INPUT_RESPONSE__INIT;
    r = rpc_send(c, &resp.base);
  } else {
    Pb__SendInputResponse resp = PB__SEND_INPUT_RESPONSE__INIT;
    r = rpc_send(c, &resp.base);
  }
  rpc_finish(c, r == 0 ? RPC_OK : RPC_INTERNAL, NULL);
}

static void proc_input_fail(struct proc_input *in, rpc_code code, const char *msg) {
  if (!in->call) return;
  rpc_call *c = in->call;
  in->call = NULL;
  rpc_set_user(c, NULL);
  rpc_finish(c, code, msg);
}

static void proc_input_maybe_done(struct proc_input *in) {
  if (in->call && in->input_end && in->inflight == 0 && !in->parked) proc_input_answer(in);
  proc_input_free_if_done(in);
}

/* The call is over (cancel or an error we raised): its queued bytes stay
 * queued without an owner, a parked message is dropped. */
static void proc_input_detach(struct proc_input *in) {
  struct proc *p = in->p;
  if (p) {
    for (struct proc_in_chunk *ch = p->in_head; ch; ch = ch->next)
      if (ch->owner == in) ch->owner = NULL;
    in->inflight = 0;
    if (in->parked) {
      list_remove(&in->wlink);
      p->in_parked_bytes -= in->parked->len;
      proc_chunk_free(in->parked);
      in->parked = NULL;
    }
  }
  if (in->call) {
    rpc_set_user(in->call, NULL);
    in->call = NULL;
  }
  proc_input_free_if_done(in);
}

/* ---- the queue ---- */
/* NULL with *busy set when the budget is spent, or out of memory. */
static struct proc_in_chunk *proc_chunk_new(const uint8_t *data, size_t len, struct proc_input *owner,
                                            int *busy) {
  *busy = 0;
  if (budget_take(len) != 0) {
    *busy = 1;
    return NULL;
  }
  struct proc_in_chunk *ch = malloc(sizeof *ch + len);
  if (!ch) {
    budget_give(len);
    return NULL;
  }
  ch->next = NULL;
  ch->owner = owner;
  ch->len = len;
  ch->budget = len;
  ch->off = 0;
  ch->bytes = ch->data;
  if (len) memcpy(ch->data, data, len);
  return ch;
}

static int proc_in_fits(const struct proc *p, size_t len) {
  return !p->in_head || p->in_bytes + len <= PROC_INPUT_MAX;
}

static void proc_in_append(struct proc *p, struct proc_in_chunk *ch) {
  if (p->in_tail) p->in_tail->next = ch; else p->in_head = ch;
  p->in_tail = ch;
  p->in_bytes += ch->len;
  if (ch->owner) ch->owner->inflight++;
}

/* Queue a chunk behind everything before it; 1 when it had to be parked,
 * -1 when the parked messages of this process already hold PROC_INPUT_MAX
 * (many calls pushing at a child that does not read): the caller fails the
 * call and frees ch. */
static int proc_in_submit(struct proc *p, struct proc_input *in, struct proc_in_chunk *ch) {
  if (!list_empty(&p->in_wait) || !proc_in_fits(p, ch->len)) {
    if (p->in_parked_bytes >= PROC_INPUT_MAX) return -1;
    p->in_parked_bytes += ch->len;
    in->parked = ch;
    list_insert_tail(&p->in_wait, &in->wlink);
    return 1;
  }
  proc_in_append(p, ch);
  return 0;
}

static void proc_in_admit(struct proc *p) {
  struct proc_input *w;
  while ((w = list_first_entry(&p->in_wait, struct proc_input, wlink)) && proc_in_fits(p, w->parked->len)) {
    list_remove(&w->wlink);
    struct proc_in_chunk *ch = w->parked;
    w->parked = NULL;
    p->in_parked_bytes -= ch->len;
    proc_in_append(p, ch);
    if (w->stream && w->call) rpc_pause_input(w->call, 0); /* resumes from a timer: no reentry */
  }
}

static void proc_in_on_close(uv_handle_t *h) {
  struct proc *p = h->data;
  p->handles--;
  proc_check_free(p);
}

static void proc_in_close_fd(struct proc *p) {
  if (p->in_open) {
    p->in_open = 0;
    p->in_polling = 0;
    uv_close((uv_handle_t *)&p->in, proc_in_on_close);
  }
  if (p->in_fd >= 0) close(p->in_fd); /* after uv_close: out of epoll already */
  p->in_fd = -1;
}

/* Stdin is gone for good: drop what is queued, fail who waits for it. */
static void proc_in_drop(struct proc *p) {
  p->in_closed = 1;
  proc_in_close_fd(p);
  struct proc_in_chunk *ch;
  while ((ch = p->in_head)) {
    p->in_head = ch->next;
    struct proc_input *o = ch->owner;
    proc_chunk_free(ch);
    if (o) {
      o->inflight--;
      proc_input_fail(o, RPC_FAILED_PRECONDITION, PROC_STDIN_CLOSED);
      proc_input_free_if_done(o);
    }
  }
  p->in_tail = NULL;
  p->in_bytes = 0;
  struct proc_input *w;
  while ((w = list_first_entry(&p->in_wait, struct proc_input, wlink))) {
    list_remove(&w->wlink);
    p->in_parked_bytes -= w->parked->len;
    proc_chunk_free(w->parked);
    w->parked = NULL;
    proc_input_fail(w, RPC_FAILED_PRECONDITION, PROC_STDIN_CLOSED);
    proc_input_free_if_done(w);
  }
}

static void proc_in_on_writable(uv_poll_t *h, int status, int events) {
  struct proc *p = h->data;
  if (status < 0) { /* the fd is broken: as EPIPE */
    proc_in_drop(p);
    return;
  }
  proc_in_flush(p);
}

static void proc_in_wait_writable(struct proc *p, int on) {
  if (!p->in_open || p->in_polling == on) return;
  if (on ? uv_poll_start(&p->in, UV_WRITABLE, proc_in_on_writable) == 0 : uv_poll_stop(&p->in) == 0)
    p->in_polling = on;
}

/* Write what the child takes now; the rest waits for writable. */
static void proc_in_flush(struct proc *p) {
  for (;;) {
    struct proc_in_chunk *ch;
    while (p->in_fd >= 0 && (ch = p->in_head)) {
      if (ch->off < ch->len) {
        ssize_t n = write(p->in_fd, ch->bytes + ch->off, ch->len - ch->off);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          proc_in_admit(p); /* a partial write may have made room */
          proc_in_wait_writable(p, 1);
          return;
        }
        if (n < 0) { /* EPIPE (reader gone), EIO (PTY slave closed) */
          LOG_DEBUG("input write ended pid=%d errno=%d", (int)p->pid, errno);
          proc_in_drop(p);
          return;
        }
        ch->off += (size_t)n;
        p->in_bytes -= (size_t)n;
        if (ch->off < ch->len) continue;
      }
      p->in_head = ch->next;
      if (!p->in_head) p->in_tail = NULL;
      struct proc_input *o = ch->owner;
      proc_chunk_free(ch);
      if (o) {
        o->inflight--;
        proc_input_maybe_done(o);
      }
    }
    if (p->in_fd < 0) return;
    proc_in_admit(p);
    if (!p->in_head) break;
  }
  proc_in_wait_writable(p, 0);
  if (p->in_closed && list_empty(&p->in_wait) && !p->has_pty) proc_in_close_fd(p); /* EOF for the child */
}

int proc_input_open(struct proc *p, int fd) {
  p->in_fd = -1;
  if (p->has_pty) /* its own fd number for its own poll (see the top) */
    fd = p->out[0].open ? fcntl(p->out[0].fd, F_DUPFD_CLOEXEC, 3) : -1;
  else if (!p->stdin_open)
    p->in_closed = 1; /* §6: the one-shot bytes, then EOF */
  int rc = 0;
  if (fd >= 0 && uv_poll_init(p->t->loop, &p->in, fd) == 0) {
    p->in.data = p;
    p->handles++;
    p->in_open = 1;
    p->in_fd = fd;
    if (p->stdin_len) {
      int busy;
      struct proc_in_chunk *ch = proc_chunk_new(NULL, 0, NULL, &busy);
      if (ch) { /* may exceed PROC_INPUT_MAX alone: it is the request's own */
        ch->bytes = p->stdin_buf;
        ch->len = p->stdin_len;
        ch->budget = p->stdin_budget; /* taken with the request (service.c) */
        p->stdin_budget = 0;
        p->stdin_buf = NULL;
        proc_in_append(p, ch);
      } else {
        rc = -1;
      }
    }
    proc_in_flush(p);
  } else {
    if (fd >= 0) close(fd);
    p->in_closed = 1;
  }
  free(p->stdin_buf);
  p->stdin_buf = NULL;
  p->stdin_len = 0;
  return rc;
}

unsigned char *proc_input_pending(const struct proc *p, size_t *n) {
  size_t total = 0;
  for (const struct proc_in_chunk *ch = p->in_head; ch; ch = ch->next) total += ch->len - ch->off;
  *n = total;
  unsigned char *b = total ? malloc(total) : NULL;
  if (!b) return NULL;
  size_t at = 0;
  for (const struct proc_in_chunk *ch = p->in_head; ch; ch = ch->next) {
    memcpy(b + at, ch->bytes + ch->off, ch->len - ch->off);
    at += ch->len - ch->off;
  }
  return b;
}

void proc_input_shutdown(struct proc *p) {
  if (p->in_open || p->in_head || !list_empty(&p->in_wait) || !p->in_closed) proc_in_drop(p);
}

/* ---- lookups and checks ---- */
/* Running processes only; a foreground one by pid (§9). */
static struct proc *proc_in_find(const Pb__ProcessSelector *sel) {
  struct proc_table *t = proc_tab;
  struct proc *p;
  list_each_rev(p, &t->table, tlink)
    if (p->state == PROC_RUNNING && (sel->pid != 0 ? p->pid == sel->pid : strcmp(p->tag, sel->tag) == 0))
      return p;
  if (sel->pid != 0)
    list_each(p, &t->fg, flink)
      if (p->state == PROC_RUNNING && p->pid == sel->pid) return p;
  return NULL;
}

/* Selector check and lookup; NULL with msg/code set when it fails. */
static struct proc *proc_in_select(const Pb__ProcessSelector *sel, rpc_code *code, char *msg, size_t n) {
  *code = proc_validate_selector(sel, msg, n);
  if (*code != RPC_OK) return NULL;
  struct proc *p = proc_in_find(sel);
  if (!p) {
    *code = RPC_NOT_FOUND;
    if (sel->pid != 0)
      snprintf(msg, n, "process pid %d not found", (int)sel->pid);
    else
      snprintf(msg, n, "process tag \"%s\" not found", sel->tag);
  }
  return p;
}

/* Kind, then closed stdin, then size. */
static rpc_code proc_in_check(const struct proc *p, const Pb__ProcessInput *in, ProtobufCBinaryData *out,
                              char *msg, size_t n) {
  if (!in || in->input_case == PB__PROCESS_INPUT__INPUT__NOT_SET) {
    snprintf(msg, n, "input is required");
    return RPC_INVALID_ARGUMENT;
  }
  if (in->input_case == PB__PROCESS_INPUT__INPUT_PTY && !p->has_pty) {
    snprintf(msg, n, "process has no pty");
    return RPC_FAILED_PRECONDITION;
  }
  if (in->input_case == PB__PROCESS_INPUT__INPUT_STDIN && p->has_pty) {
    snprintf(msg, n, "process stdin is a pty: send pty input");
    return RPC_FAILED_PRECONDITION;
  }
  if (p->in_closed) {
    snprintf(msg, n, PROC_STDIN_CLOSED);
    return RPC_FAILED_PRECONDITION;
  }
  *out = in->input_case == PB__PROCESS_INPUT__INPUT_PTY ? in->pty : in->stdin;
  if (out->len > PROC_INPUT_MAX) {
    snprintf(msg, n, "input exceeds maximum size %u bytes", PROC_INPUT_MAX);
    return RPC_RESOURCE_EXHAUSTED;
  }
  return RPC_OK;
}

static struct proc_input *proc_input_new(rpc_call *c, struct proc *p, int stream) {
  struct proc_input *in = calloc(1, sizeof *in);
  if (!in) return NULL;
  in->call = c;
  in->stream = stream;
  if (p) {
    in->p = p;
    p->ninputs++;
  }
  rpc_set_user(c, in);
  return in;
}

/* ---- SendInput ---- */
static void proc_send_input_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__SendInputRequest *req = (const Pb__SendInputRequest *)m;
  char msg[160];
  rpc_code code;
  ProtobufCBinaryData data;
  struct proc *p = proc_in_select(req->process, &code, msg, sizeof msg);
  if (p) code = proc_in_check(p, req->input, &data, msg, sizeof msg);
  if (code != RPC_OK) {
    rpc_finish(c, code, msg);
    return;
  }
  struct proc_input *in = proc_input_new(c, p, 0);
  int busy = 0;
  struct proc_in_chunk *ch = in ? proc_chunk_new(data.data, data.len, in, &busy) : NULL;
  if (!ch) {
    if (in) proc_input_detach(in);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, busy ? PROC_INPUT_BUSY : "out of memory");
    return;
  }
  in->input_end = 1;
  rpc_waiting(c); /* its answer waits for the child to read */
  int r = proc_in_submit(p, in, ch);
  if (r == 0) {
    proc_in_flush(p); /* may answer at once */
  } else if (r < 0) {
    proc_chunk_free(ch);
    proc_input_fail(in, RPC_RESOURCE_EXHAUSTED, PROC_INPUT_FULL);
    proc_input_detach(in);
  }
}

/* ---- StreamInput ---- */
static void proc_stream_input_on_open(rpc_call *c, const ProtobufCMessage *m) {
  if (!proc_input_new(c, NULL, 1)) rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
}

static void proc_stream_input_fail(struct proc_input *in, rpc_code code, const char *msg) {
  proc_input_fail(in, code, msg);
  proc_input_detach(in);
}

static void proc_stream_input_on_message(rpc_call *c, const ProtobufCMessage *m) {
  struct proc_input *in = rpc_user(c);
  const Pb__StreamInputRequest *req = (const Pb__StreamInputRequest *)m;
  char msg[160];
  rpc_code code;
  if (!in) return;
  if (!in->p) {
    if (req->event_case != PB__STREAM_INPUT_REQUEST__EVENT_START) {
      proc_stream_input_fail(in, RPC_INVALID_ARGUMENT, "first stream input event must be start");
      return;
    }
    struct proc *p = proc_in_select(req->start->process, &code, msg, sizeof msg);
    if (!p) {
      proc_stream_input_fail(in, code, msg);
      return;
    }
    in->p = p;
    p->ninputs++;
    return;
  }
  if (req->event_case == PB__STREAM_INPUT_REQUEST__EVENT_START) {
    proc_stream_input_fail(in, RPC_INVALID_ARGUMENT, "stream input already started");
    return;
  }
  if (req->event_case != PB__STREAM_INPUT_REQUEST__EVENT_DATA) return; /* keepalive */
  struct proc *p = in->p;
  ProtobufCBinaryData data;
  code = proc_in_check(p, req->data->input, &data, msg, sizeof msg);
  if (code != RPC_OK) {
    proc_stream_input_fail(in, code, msg);
    return;
  }
  int busy;
  struct proc_in_chunk *ch = proc_chunk_new(data.data, data.len, in, &busy);
  if (!ch) {
    proc_stream_input_fail(in, RPC_RESOURCE_EXHAUSTED, busy ? PROC_INPUT_BUSY : "out of memory");
    return;
  }
  int r = proc_in_submit(p, in, ch);
  if (r > 0) {
    rpc_pause_input(c, 1); /* the child is not reading: stop reading the client */
  } else if (r < 0) {
    proc_chunk_free(ch);
    proc_stream_input_fail(in, RPC_RESOURCE_EXHAUSTED, PROC_INPUT_FULL);
  } else {
    proc_in_flush(p);
  }
}

static void proc_stream_input_on_end(rpc_call *c) {
  struct proc_input *in = rpc_user(c);
  if (!in) return;
  if (!in->p) {
    proc_stream_input_fail(in, RPC_INVALID_ARGUMENT, "first stream input event must be start");
    return;
  }
  in->input_end = 1;
  rpc_waiting(c);
  proc_input_maybe_done(in);
}

/* Client gone or deadline: the process keeps running (§9). */
static void proc_input_on_cancel(rpc_call *c, rpc_code why) {
  struct proc_input *in = rpc_user(c);
  if (!in) return;
  in->call = NULL;
  rpc_set_user(c, NULL);
  proc_input_detach(in);
}

/* ---- CloseStdin ---- */
static void proc_close_stdin_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__CloseStdinRequest *req = (const Pb__CloseStdinRequest *)m;
  char msg[160];
  rpc_code code;
  struct proc *p = proc_in_select(req->process, &code, msg, sizeof msg);
  if (!p) {
    rpc_finish(c, code, msg);
    return;
  }
  if (p->has_pty) {
    rpc_finish(c, RPC_FAILED_PRECONDITION, "cannot close stdin of a pty process: send Ctrl-D (0x04)");
    return;
  }
  if (p->in_closed) {
    rpc_finish(c, RPC_FAILED_PRECONDITION, PROC_STDIN_CLOSED);
    return;
  }
  p->in_closed = 1; /* EOF once everything queued before this call is written */
  proc_in_flush(p);
  Pb__CloseStdinResponse resp = PB__CLOSE_STDIN_RESPONSE__INIT;
  rpc_finish(c, rpc_send(c, &resp.base) == 0 ? RPC_OK : RPC_INTERNAL, NULL);
}

/* ---- Update ---- */
static void proc_update_on_request(rpc_call *c, const ProtobufCMessage *m) {
  const Pb__UpdateRequest *req = (const Pb__UpdateRequest *)m;
  char msg[160];
  rpc_code code;
  struct proc *p = proc_in_select(req->process, &code, msg, sizeof msg);
  if (p) code = proc_validate_pty_size(req->pty, 1, msg, sizeof msg);
  if (code == RPC_OK && !p->has_pty) {
    code = RPC_FAILED_PRECONDITION;
    snprintf(msg, sizeof msg, "process has no pty");
  }
  if (code != RPC_OK) {
    rpc_finish(c, code, msg);
    return;
  }
  uint32_t cols = req->pty->cols ? req->pty->cols : PROC_PTY_DEFAULT_COLS;
  uint32_t rows = req->pty->rows ? req->pty->rows : PROC_PTY_DEFAULT_ROWS;
  struct winsize ws = {.ws_row = (unsigned short)rows, .ws_col = (unsigned short)cols};
  /* the kernel sends SIGWINCH to the terminal's foreground process group */
  if (p->in_fd < 0 || ioctl(p->in_fd, TIOCSWINSZ, &ws) != 0) {
    rpc_finishf(c, RPC_INTERNAL, "failed to set pty size: %s", strerror(p->in_fd < 0 ? EBADF : errno));
    return;
  }
  p->cols = cols;
  p->rows = rows;
  Pb__UpdateResponse resp = PB__UPDATE_RESPONSE__INIT;
  rpc_finish(c, rpc_send(c, &resp.base) == 0 ? RPC_OK : RPC_INTERNAL, NULL);
}

static void proc_input_unary_cancel(rpc_call *c, rpc_code why) {}

const rpc_method proc_input_methods[4] = {
    {"/pb.ProcessService/SendInput", RPC_UNARY, &pb__send_input_request__descriptor,
     &pb__send_input_response__descriptor, 0, proc_send_input_on_request, NULL, NULL, proc_input_on_cancel},
    {"/pb.ProcessService/StreamInput", RPC_CLIENT_STREAM, &pb__stream_input_request__descriptor,
     &pb__stream_input_response__descriptor, 0, proc_stream_input_on_open, proc_stream_input_on_message,
     proc_stream_input_on_end, proc_input_on_cancel},
    {"/pb.ProcessService/CloseStdin", RPC_UNARY, &pb__close_stdin_request__descriptor,
     &pb__close_stdin_response__descriptor, 0, proc_close_stdin_on_request, NULL, NULL,
     proc_input_unary_cancel},
    {"/pb.ProcessService/Update", RPC_UNARY, &pb__update_request__descriptor, &pb__update_response__descriptor,
     0, proc_update_on_request, NULL, NULL, proc_input_unary_cancel},
};
