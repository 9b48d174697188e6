/* proc — ProcessService internals: the process table and process records.
 * Public face for the daemon: proc/service.h.  process.c is the one owner
 * of a record's life (create, table membership, state changes, exit, end,
 * retention, removal); fanout.c (fanout.h) only delivers events to the
 * record's subscribers, input.c feeds its stdin, service.c answers RPCs.
 *
 * A record (struct proc) lives from a validated StartProcess until it has
 * ended, left the table and closed all its handles:
 *
 *   PREP     cwd/script/PATH work on the thread pool (tag already reserved)
 *   RUNNING  spawned, reaper_watch()ed, outputs read on the loop
 *   EXITED   reaped; outputs still being drained (see "End" below)
 *   ENDED    end event delivered; a background record stays findable by
 *            Connect for PROC_RETAIN_MS, then leaves the table
 *
 * Outputs (stdout/stderr pipes, or the PTY master) are nonblocking fds
 * watched by uv_poll_t and read by our own loop (≤ 16 reads per wakeup)
 * into one per-record buffer (32 KiB, PTY 16 KiB): one read → one data
 * event.  EOF = read() 0, or EIO on a PTY master.  rpc_send() serialises the message at once, so the buffer is
 * reused.
 *
 * Offsets and retention (api.md §9): each output counts the bytes it sent
 * as data events (ProcessDataEvent.offset); a background record also
 * keeps the most recent in a ring per output (ring.h), within a budget
 * across the table (PROC_RING_*), freed at proc_release.  Connect with
 * replay sends a ring's bytes and subscribes in one go (proc_replay).
 *
 * Subscribers (fanout.h): the foreground starter is lossless — when its
 * queue passes RPC_OUTQ_HIGH both outputs stop reading (the child blocks on
 * a full pipe) until it drains (the fanout's flow callback, proc_pause).
 * Background subscribers are lossy; the process never waits for them.
 *
 * End: the end event is sent once the main process was reaped AND every
 * output is done: at EOF, or "quiet" — after the exit, a check every
 * PROC_EXIT_GRACE_MS finds nothing buffered in it and nothing read since the
 * previous check (FIONREAD 0, so all the main process wrote before exiting
 * has been read; a PTY needs two such checks, as bytes in its flip buffer
 * are not counted), or PROC_EXIT_LINGER_MS passed and at least the bytes
 * buffered at exit time were read.  So a
 * backgrounded grandchild that keeps the pipe open (`sh -c 'srv &'`) delays
 * the end by ~100 ms, not forever (the reference waits for EOF).  After the
 * end such an output keeps being read and discarded until EOF, so the
 * grandchild neither blocks nor dies of SIGPIPE.
 *
 * Signals (SendSignal, timeout, vanished foreground client) go to the whole
 * tree — every process in the command's cgroup (cgroup.h), setsid escapees
 * included — or, without cgroups, to the process group; and only while the
 * leader is unreaped (afterwards the pid — and so the group id — could be
 * reused).  A timeout bounds the tree: when the leader exits before it,
 * the cgroup keeps the deadline and SIGKILLs whatever is left at T.
 */
#ifndef CONCH_PROC_PROC_H
#define CONCH_PROC_PROC_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>
#include <uv.h>

#include "core/list.h"
#include "server/rpc.h"
#include "proc/cgroup.h"
#include "proc/fanout.h"
#include "proc/reaper.h"
#include "proc/ring.h"
#include "proc/spawn.h"

#define PROC_EXIT_GRACE_MS 100
#define PROC_EXIT_LINGER_MS 2000
#define PROC_RETAIN_MS 60000
/* Ended records kept at most (the oldest goes first): each keeps its whole
 * config for List, env included, so without a bound a client starting many
 * short background commands with big environments held 100+ MiB. */
#define PROC_RETAIN_MAX 256
#define PROC_KEEPALIVE_MS 30000
#define PROC_MAX_PROCS 4096   /* live records (any state) */
#define PROC_INPUT_MAX (1024u * 1024) /* pending input per process; also the largest input message */
/* input refused because everything held for clients reached the daemon-wide budget */
#define PROC_INPUT_BUSY "server is busy: too much input queued for processes"
/* Retained output of background processes (api.md §9, ring.h): per
 * channel, and what the rings of all records may take together; past the
 * budget they are cut to PROC_RING_SLACK below it, so the cutting (a sort
 * of the rings) runs once per MiB of output at most, not per read. */
#define PROC_RING_MAX (256u * 1024)
#define PROC_RING_BUDGET (32u * 1024 * 1024)
#define PROC_RING_SLACK (1024u * 1024)

enum proc_state { PROC_PREP, PROC_RUNNING, PROC_EXITED, PROC_ENDED };

struct proc;

struct proc_out {
  uv_poll_t h;
  int fd;
  struct proc *p;
  int kind;        /* enum proc_out_kind */
  int open;        /* handle initialised and not yet closing */
  int reading;
  int done;        /* EOF, error or quiet: no more data events */
  uint64_t read_since_exit;
  uint64_t read_at_tick;
  int silent_ticks;
  int64_t pending_at_exit;
  uint64_t offset;        /* bytes of this channel sent as data events so far */
  struct proc_ring ring;  /* background: its most recent output */
};

struct proc {
  struct proc_table *t;
  list_node alink; /* in t->all: every record of the table (an upgrade saves them all) */
  list_node tlink; /* in t->table (background only), start order */
  int retained; /* ended, kept for Connect/List until its retention ends */
  enum proc_state state;
  int background;
  int has_pty;
  uint32_t cols, rows;
  pid_t pid;

  /* effective configuration (List) */
  char *tag;      /* "" when none */
  char *cmd;
  char **args;    /* effective args (a script run: the script path) */
  size_t nargs;
  char *args_block;  /* the strings of args (NULL: args[i] malloc'd each) */
  char **env_keys, **env_vals; /* request env only */
  char *env_kblock, *env_vblock; /* their strings */
  size_t nenv;
  char *cwd;      /* resolved */
  char *script;   /* script path to remove, or NULL */
  int script_dfd; /* its directory, held while script is set (removal by it) */
  time_t started_at;

  /* request data only needed until spawn */
  char *content;
  size_t content_len;
  unsigned char *stdin_buf;
  size_t stdin_len;
  size_t stdin_budget; /* budget_take'n for the one-shot stdin, until its chunk holds it */
  char **envp;    /* senv_merge() result, freed after spawn */
  char **base_env; /* sandbox env snapshot (loop) the request env overlays */
  char *home;      /* default cwd: the sandbox env's HOME, or the user's home */
  int cwd_default; /* the request named no cwd: home ("/" for a user whose home is missing) */
  const rpc_ident *ident; /* who it runs as (a hold, rpc.h), from the start on */
  struct Pb__StartProcessRequest *req; /* taken request, copied in the pool */
  char exe[4096]; /* resolved path */
  char prep_err[4608];
  int prep_errcode; /* 0, or the rpc_code of a failed prep step */
  int prep_step;    /* 5, 6 or 8 */
  int work_pending; /* the start's pool job (rpc_work_submit) is out */
  int pins; /* readers off the loop (a List encode): the record is not freed meanwhile */
  /* the spawn, done at the end of the pool work (see proc_launch_spawn) */
  reaper_inflight inflight;
  proc_spawn_result sr;
  int spawn_rc;     /* 0 spawned, -1 failed (spawn_err), 1 not tried */
  char spawn_err[4200];
  int aborted;      /* foreground starter vanished during PREP */

  int64_t timeout_ms;
  uint64_t deadline_at; /* uv_now at which the timeout falls (timeout_ms > 0) */
  struct proc_cg *cg;   /* the command's cgroup until the leader was reaped and it is empty, or NULL */
  proc_cg_limits limits; /* the request's (api.md §9) */
  int has_limits;
  int cg_err;           /* creating it failed (errno; thread pool → loop) */
  const char *cg_what;  /* the step that failed */
  proc_end_info end;    /* filled at the reap (wait4), then from the cgroup */
  int acct_pending;     /* the cgroup's usage is being read: no end event yet */
  int lingering;        /* leader reaped, processes left in the cgroup: still signalable
                         * (in t->linger, but for a record restored by an upgrade
                         * until proc_resume links it) */
  list_node llink;      /* in t->linger */
  time_t finished_at;
  uv_timer_t timer;   /* RUNNING: timeout; ENDED: retention */
  uv_timer_t grace;   /* EXITED: quiet checks */
  uint64_t exit_ms;
  int wstatus;
  int reaped;
  int timed_out;

  struct proc_out out[2];
  int nout;
  /* input (input.c): the stdin pipe's write end, or a dup of the PTY
   * master (its own fd, so its writable watch never disturbs the output
   * poll); chunks in arrival order across all input RPCs */
  uv_poll_t in;
  int in_fd;          /* -1: no input fd */
  int in_open;        /* poll handle initialised and not closing */
  int in_polling;     /* waiting for writable */
  int in_closed;      /* no new input accepted (CloseStdin, one-shot only, exit, EPIPE) */
  int stdin_open;     /* the request's stdin_open */
  struct proc_in_chunk *in_head, *in_tail;
  size_t in_bytes;    /* queued, unwritten: at most PROC_INPUT_MAX */
  list_node in_wait;  /* calls holding a chunk that did not fit (struct proc_input), oldest first */
  size_t in_parked_bytes; /* their chunks: parking stops at PROC_INPUT_MAX */
  size_t ninputs;     /* input calls referring to this record */
  list_node flink; /* in t->fg: running foreground processes */

  struct proc_fanout fan; /* its subscribers */
  int paused;

  int handles;  /* uv handles not yet closed */
  int released; /* no longer wanted by the table/service */
  char *buf;
};

struct proc_table {
  uv_loop_t *loop;
  list_node table;  /* background records, start order (tlink) */
  list_node fg;     /* running foreground records, newest first: input RPCs find them by pid (flink) */
  list_node linger; /* records whose leader exited with processes left in its cgroup, newest first (llink) */
  list_node all;    /* every record, any state, newest first (alink) */
  size_t nrecords;          /* every live record */
  size_t nretained;         /* ended background records still in the table */
  size_t ring_mem;          /* what the output rings of all records take (ring.h) */
  uint64_t started;         /* processes started since this program started (/metrics) */
  uint64_t keepalive_ms;
  uint64_t retain_ms;
  /* the record's input (input.c, above process.c, which calls it only
   * through these): opened at launch, shut at the reap and at release */
  int (*input_open)(struct proc *p, int pipe_fd);
  void (*input_shutdown)(struct proc *p);
};

/* ---- process.c: record lifecycle ---- */
/* The one table (proc_table_init; loop thread only). */
extern struct proc_table *proc_tab;
int proc_table_init(uv_loop_t *loop, uint64_t keepalive_ms, uint64_t retain_ms,
                    int (*input_open)(struct proc *, int), void (*input_shutdown)(struct proc *));
/* A new record in PREP (the caller checks PROC_MAX_PROCS); NULL when out of memory. */
struct proc *proc_new(struct proc_table *t);
/* A background record enters the table at once (its tag is reserved;
 * List/Connect skip PREP records). */
void proc_table_add(struct proc *p);
/* The record of a subscriber. */
struct proc *proc_of_sub(const struct proc_sub *s);
/* Thread pool, after the prep steps: spawn (spawn_rc, sr, spawn_err).  The
 * execve of a big environment runs while this thread waits, not the loop. */
void proc_launch_spawn(struct proc *p);
/* Loop, after the pool work: own the child (reaper_inflight_claim) and
 * start reading it; 0, or -1 with err (the record is then unusable for
 * events and the caller fails it with proc_start_fail).  Also when nothing
 * was spawned (spawn_rc 1): the in-flight slot is given up. */
int proc_launch_finish(struct proc *p, char *err, size_t errn);
/* The start failed (PREP): every subscriber fails with code/msg, the
 * script goes, the record is released. */
void proc_start_fail(struct proc *p, rpc_code code, const char *msg);
/* The foreground starter's call ended (client gone, why): PREP → the start
 * is aborted when the pool work returns; RUNNING → the tree is killed. */
void proc_starter_gone(struct proc *p, rpc_code why);
/* Send sig to the tree: its cgroup (also while it lingers after the
 * leader), else the process group while the leader is unreaped (0 / -errno). */
int proc_signal(struct proc *p, int sig);
/* The service no longer needs the record (foreground end, PREP failure,
 * retention expiry); it is freed once its handles are closed. */
void proc_release(struct proc *p);
/* Queue removal of the script file (thread pool). */
void proc_remove_script(struct proc *p);
/* Flow control for lossless subscribers. */
void proc_pause(struct proc *p, int paused);
/* Free the record if nothing refers to it any more. */
void proc_check_free(struct proc *p);
/* A job in the pool reads the record's fixed strings (tag, cmd, args, cwd,
 * env): it is not freed until unpinned (on the loop). */
void proc_pin(struct proc *p);
void proc_unpin(struct proc *p);
/* Usage of a running or lingering record now, from its cgroup or /proc
 * (thread pool; the record pinned, its cgroup pinned by the caller). */
void proc_usage_now(struct proc_cg *cg, pid_t pid, proc_end_info *u);
/* Replay (Connect with ReplayFrom): the output produced so far on a
 * channel (enum proc_out_kind; 0 for a channel the process has not), and
 * the retained bytes of each channel from from[kind] on, to subscriber s,
 * as data events with their offsets (loop: the live output that follows
 * goes to s too, so nothing is lost or repeated between the two). */
uint64_t proc_out_total(const struct proc *p, int kind);
void proc_replay(struct proc *p, struct proc_sub *s, const uint64_t from[3]);
/* Upgrade in place (proc/handover.c): a record rebuilt from the saved
 * state (no handle started yet) starts again: its outputs are read, its
 * input flushed, the reaper watches a running leader, timers resume with
 * what was left of them (ms; 0 = none).  A foreground record becomes a
 * background one (adopted: Connect finds it by pid). */
void proc_resume(struct proc *p, uint64_t deadline_left, uint64_t cg_deadline_left, uint64_t retain_left);
/* Foreground list of the table (running foreground records, found by pid
 * by the input RPCs). */
void proc_fg_link(struct proc *p);
void proc_fg_unlink(struct proc *p);

#endif
