/* handover — an upgrade in place, both sides of the exec: the parts that
 * carry state, the state file, the exec and the rollback
 * (docs/internals/upgrade.md, docs/guide/upgrade.md).
 *
 * The old program, on the loop, after the Upgrade answer:
 *   handover_begin(new program's fd)
 *     → DRAINING: every part's drain (it stops taking work), then the loop
 *       runs until no part is busy (bounded: HANDOVER_DRAIN_MS)
 *     → SAVING: every part writes its fields of one state message, packed
 *       into a memfd; the descriptors the parts name lose close-on-exec,
 *       no others
 *     → fexecve(new, argv + "--handover <fd>").
 * The new program, at start, before the reaper's first wait:
 *   handover_load(fd) reads the message, handover_finish rebuilds each
 *   part; a format it cannot read, or a part that fails → fexecve of the
 *   previous program (a descriptor in the state) with the same state and
 *   "--handover-rollback <fd>".
 *
 * The framework knows no part and no field of the state but its own
 * (handover_schema); the parts are registered by the program's top.
 * A lifecycle of its own (handover_state), changed only by hs_step(),
 * which asserts the previous state.
 */
#ifndef CONCH_CORE_HANDOVER_H
#define CONCH_CORE_HANDOVER_H

#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>
#include <uv.h>

/* The state message and the formats of it this program writes (format)
 * and reads (format_min to format).  The message must have these proto3
 * fields (no `optional`), which the framework fills and reads itself
 * (handover_init checks them):
 *   uint32 format, string version, uint64 upgrades (since boot, this one
 *   included), int32 prev_program_fd (the writer's program: rollback). */
typedef struct handover_schema {
  const ProtobufCMessageDescriptor *desc;
  unsigned format, format_min;
} handover_schema;

/* A part of the state, kept by a module above core/.  st is the state
 * message (the schema's type).  Every hook is optional.
 *   drain         old program: stop taking work (1), or take it again (0:
 *                 the exec failed)
 *   busy          old program: work in flight, the drain waits (bounded)
 *   save          fill its fields of st (may point into live memory)
 *   save_free     free what save allocated (after the state was written)
 *   restore_early new program, in handover_load, before the services start
 *   restore       in handover_finish, without I/O; 0, or -1 with err (then
 *                 the previous program takes over: rollback)
 *   keep_fds      name, through handover_keep_fd, every descriptor its
 *                 fields hold (they get close-on-exec back after the restore)
 *   abandon       new program, no rollback possible: its restore failed or
 *                 never ran; close what the state names that it did not
 *                 take (else a listening socket would stay bound by nobody)
 *   resume        the restore is committed (every part's, even after one
 *                 failed without a rollback): start (reads, timers) */
typedef struct handover_part {
  const char *name;
  void (*drain)(int on);
  int (*busy)(void);
  int (*save)(ProtobufCMessage *st);
  void (*save_free)(ProtobufCMessage *st);
  int (*restore_early)(uv_loop_t *loop, const ProtobufCMessage *st);
  int (*restore)(const ProtobufCMessage *st, uint64_t now_mono, char *err, size_t errn);
  void (*keep_fds)(const ProtobufCMessage *st);
  void (*abandon)(const ProtobufCMessage *st);
  void (*resume)(void);
} handover_part;

/* The schema, and the argument vector the next program gets (plus
 * --handover <fd>).  Once, before anything below. */
void handover_init(const handover_schema *schema, int argc, char **argv);
/* Parts save, restore and resume in the order they were added. */
void handover_add_part(const handover_part *p);
/* A descriptor the state names: it survives the exec (from keep_fds). */
void handover_keep_fd(int fd);

/* 1 when this program can restore state format n (`--handover-check N`). */
int handover_can_read(unsigned n);

/* Loop: hand over to the program in prog_fd (a sealed memfd, owned by the
 * handover from now on).  Returns at once; the exec follows from the loop.
 * -1 (errno EBUSY) when a handover is already under way. */
int handover_begin(int prog_fd, const char *to_version);
/* 1 while a handover is under way (new Upgrade calls are refused). */
int handover_busy(void);
/* 1 when this build asserts on an illegal step of the lifecycle (no
 * NDEBUG); a release build logs it and stays where it was. */
extern const int handover_asserts;

/* The new program: the state's descriptor from `--handover N` or
 * `--handover-rollback N` (*rollback = 1), or -1 when there is none. */
int handover_arg(int argc, char **argv, int *rollback);
/* Read the state and run every part's restore_early.  On failure it rolls
 * back (no return) or, when it cannot, returns -1. */
int handover_load(int fd, int rollback, char *err, size_t errn);
/* After the services are registered: every part's restore, then the
 * commit (descriptors close-on-exec again, the previous program and the
 * state closed) and every part's resume.  A failing part rolls back; when
 * it cannot, what was restored serves. */
int handover_finish(char *err, size_t errn);

#endif
