/* pid1 — conch-init as PID 1 (boot.md §2): the whole boot, the init
 * listeners, step 13 on the first valid init message, and then forever
 * serving, reaping and answering init messages.  A fatal failure is logged
 * and PID 1 stays alive in the loop with only the reaper and the signal
 * watchers (no return: returning from init panics the kernel).
 *
 * Signals: SIGTERM, SIGINT (and SIGPIPE, SIGHUP) are ignored — children
 * get default dispositions back before exec; SIGUSR1 marks the rootfs
 * services ready; SIGCHLD drives the reaper.
 */
#ifndef CONCH_INIT_PID1_H
#define CONCH_INIT_PID1_H

/* Step 1 alone: signal dispositions, conch.is_pid1, the loop. */
void init_pid1_prepare(void);
/* After an upgrade in place (boot.md §13): the boot was done by the
 * first program; serve, reap and answer init messages forever. */
int init_pid1_serve(int argc, char **argv);
/* Never returns (the return type is for main()). */
int init_pid1_main(int argc, char **argv);

#endif
