/* prep — the disk side of StartProcess (api.md §6 steps 5, 6 and the
 * executable lookup of step 8), meant for the libuv thread pool: these
 * functions block on the file system and touch no loop state.
 *
 * Error texts follow the Go reference (a Go *PathError is "<op> <path>:
 * <errno text>", errno text in lower case) so that the service can prefix
 * them: "failed to prepare working directory: mkdir /x: permission denied".
 */
#ifndef CONCH_PROC_PREP_H
#define CONCH_PROC_PREP_H

#include <stddef.h>

/* Script extension by exact command name (api.md §6 step 6). */
const char *proc_script_ext(const char *cmd);

/* Lexically clean an absolute path into out ("/a//b/./c/../d/" → "/a/b/d");
 * a relative path is first joined to base (absolute).  0, or -1 if it does
 * not fit. */
int proc_path_clean(const char *path, const char *base, char *out, size_t n);

/* mkdir -p with mode 0755.  0, or -1 with err = "mkdir <p>: <reason>". */
int proc_mkdir_p(const char *dir, char *err, size_t errn);

/* Write content to "<dir>/conch-script-<12 random chars><ext>", mode 0644,
 * created O_EXCL (retried on a name clash) relative to a descriptor of dir.
 * 0 with the path in path_out and that directory descriptor (O_CLOEXEC) in
 * *dfd_out — the script is removed through it (proc_script_unlink), so a
 * cwd renamed while the process runs leaves nothing behind — or -1 with
 * err = "open <p>: <reason>" / "write <p>: <reason>". */
int proc_script_write(const char *dir, const char *ext, const char *content, size_t len,
                      char *path_out, size_t path_n, int *dfd_out, char *err, size_t errn);

/* Remove the script (path's basename, in dfd) and close dfd: 0 (a script
 * already gone included) or -errno. */
int proc_script_unlink(int dfd, const char *path);

/* execvp-style lookup of cmd in path_env (the PATH of the child's final
 * environment; an empty element means the working directory).  A cmd with a
 * '/' is returned as is (exec reports its errors).  A relative PATH entry is
 * checked against cwd.  Candidates must be non-directories with an execute
 * bit.  0 with out filled, or -1 with err =
 * `exec: "<cmd>": executable file not found in $PATH`. */
int proc_lookup(const char *cmd, const char *path_env, const char *cwd, char *out, size_t n,
                char *err, size_t errn);

/* strerror(e) with its first letter lowered (Go's errno strings). */
const char *proc_errstr(int e, char *buf, size_t n);

#endif
