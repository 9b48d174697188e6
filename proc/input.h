/* input — stdin / PTY input of running processes (api.md §9); see input.c.
 * Above the record (proc.h, process.c): process.c reaches these two only
 * through the table's input_open / input_shutdown hooks (proc_init sets
 * them), so calls between the two files go one way. */
#ifndef CONCH_PROC_INPUT_H
#define CONCH_PROC_INPUT_H

#include "server/rpc.h"

struct proc;

/* At launch: take the input fd (pipe write end, or -1 for a PTY: the master
 * is dup'ed here) and queue the one-shot stdin bytes; 0 or -1 (ENOMEM). */
int proc_input_open(struct proc *p, int pipe_fd);
/* The leader was reaped (or the record is going): close the input, fail
 * calls waiting for bytes that will never be written. */
void proc_input_shutdown(struct proc *p);
/* Upgrade in place: the input queued and not yet written, in order (its
 * unwritten part), as one malloc'd block of *n bytes; NULL when none (or
 * out of memory: *n is then nonzero). */
unsigned char *proc_input_pending(const struct proc *p, size_t *n);
/* SendInput, StreamInput, CloseStdin, Update. */
extern const rpc_method proc_input_methods[4];

#endif
