/* handover — the agent's state carried across an upgrade in place
 * (docs/api.md "Upgrading the agent in place", docs/guide/upgrade.md).
 *
 * The old program, on the loop, after the Upgrade answer:
 *   handover_begin(new program's fd)
 *     → DRAINING: the API listener stops accepting (its socket stays open:
 *       clients wait in the backlog), every API connection is flushed
 *       briefly and closed, foreground commands are adopted, the loop runs
 *       until no start, pool job or accounting read is in flight (bounded)
 *     → SAVING: every part writes its state into one message
 *       (proto/handover.proto) in a memfd; the descriptors it names lose
 *       close-on-exec, no others
 *     → fexecve(new, argv + "--handover <fd>").
 * The new program, at start, before the reaper's first wait:
 *   handover_restore(fd) reads the message and rebuilds each part; a
 *   format it cannot read, or a part that fails, → fexecve of the previous
 *   program (a descriptor in the state) with the same state and
 *   "--handover-rollback <fd>".
 *
 * A lifecycle of its own (handover_state), changed only by hs_step().
 */
#ifndef CONCH_HANDOVER_H
#define CONCH_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

/* The state format this program writes; it reads HANDOVER_FORMAT_MIN up to
 * HANDOVER_FORMAT. */
#define HANDOVER_FORMAT 2 /* 2: forwarders and relayed connections (net) */
#define HANDOVER_FORMAT_MIN 1

/* 1 when this program can restore state format n (`--handover-check N`). */
int handover_can_read(unsigned n);

/* Loop: hand over to the program in prog_fd (a sealed memfd, owned by the
 * handover from now on).  Returns at once; the exec follows from the loop.
 * -1 (errno EBUSY) when a handover is already under way. */
int handover_begin(int prog_fd, const char *to_version);

/* 1 while a handover is under way (new Upgrade calls are refused). */
int handover_busy(void);

/* ---- wiring (agent/main.c) ---- */
#include <uv.h>
typedef struct Conch__Handover__State Conch__Handover__State;

/* A part of the state kept by a module outside agent/ (the process table,
 * ports, PID 1).  Every hook is optional.
 *   drain         old program: stop taking work (1), or take it again (0)
 *   busy          old program: work in flight, the drain waits (bounded)
 *   save          fill its fields of st (may point into live memory)
 *   save_free     free what save allocated (after the state was written)
 *   restore_early new program, before the services start (cgroups)
 *   restore       after they started, without I/O; 0 or -1 with err
 *                 (then the previous program takes over: rollback)
 *   keep_fds      name, through handover_keep_fd, descriptors of its own
 *                 encoding (they get close-on-exec back after the restore)
 *   abandon       new program, no rollback possible: its restore failed or
 *                 never ran; close what the state names that it did not
 *                 take (else a listening socket would stay bound by nobody)
 *   resume        the restore is committed: start (reads, timers) */
typedef struct handover_part {
  const char *name;
  void (*drain)(int on); /* 1: stop taking new work (its listeners); 0: the exec failed, go on */
  int (*busy)(void);
  int (*save)(Conch__Handover__State *st);
  void (*save_free)(Conch__Handover__State *st);
  int (*restore_early)(uv_loop_t *loop, const Conch__Handover__State *st);
  int (*restore)(const Conch__Handover__State *st, uint64_t now_mono, char *err, size_t errn);
  void (*keep_fds)(const Conch__Handover__State *st);
  void (*abandon)(const Conch__Handover__State *st);
  void (*resume)(void);
} handover_part;
void handover_add_part(const handover_part *p);
/* The argument vector the next program gets (plus --handover <fd>). */
void handover_set_argv(int argc, char **argv);
/* A descriptor the state names: it survives the exec. */
void handover_keep_fd(int fd);

/* The new program: the state's descriptor from `--handover N` or
 * `--handover-rollback N` (*rollback = 1), or -1 when there is none. */
int handover_arg(int argc, char **argv, int *rollback);
/* Read the state, restore the daemon's part (token, sandbox identity and
 * environment, default user, log) and every part's restore_early.  On
 * failure it rolls back (no return) or, when it cannot, returns -1. */
int handover_load(int fd, int rollback, char *err, size_t errn);
/* After the services are registered: every part's restore, the API
 * listeners, then the commit (descriptors close-on-exec again, the
 * previous program and the state closed) and every part's resume.  A
 * failing part rolls back; when it cannot, what was restored serves. */
int handover_finish(char *err, size_t errn);

#endif
