/* entrypoint — the rootfs entrypoint of boot.md §6.
 *
 * entrypoint_start runs PATH (no arguments, cwd "/", stdin /dev/null,
 * stdout/stderr inherited = the console) in a new session with default
 * signal dispositions and an empty signal mask, environment = sandbox
 * environment + HOME=/root, PATH=/usr/local/bin:/usr/bin:/bin:/sbin:/usr/sbin,
 * CONCH_SANDBOX_ID=<id>.  Not waited for, never restarted: the reaper
 * hands its exit status to a callback that logs it.
 */
#ifndef CONCH_INIT_ENTRYPOINT_H
#define CONCH_INIT_ENTRYPOINT_H

#include <sys/types.h>

#define ENTRYPOINT_PATH "/etc/conch/entrypoint"
#define ENTRYPOINT_ENVD_FEATURE "/etc/conch/features/envd"
#define ENTRYPOINT_PATH_ENV "/usr/local/bin:/usr/bin:/bin:/sbin:/usr/sbin"

/* 1 if path exists, is not a directory and is executable. */
int entrypoint_usable(const char *path);
/* Fork/exec; returns the pid or -errno. */
pid_t entrypoint_start(const char *path, const char *sandbox_id);

#endif
