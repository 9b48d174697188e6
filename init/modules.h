/* modules — kernel module loading by PID 1 (boot.md §9).
 *
 * A stock distribution kernel has virtio, vsock, erofs and overlay as
 * modules; nothing else in the guest would load them.  The names come from
 * conch.modules=a,b (argv or /proc/cmdline) and then /etc/conch/modules of
 * the boot root (one per line, '#' comments).  Each name's dependencies,
 * from /lib/modules/<release>/modules.dep, load first; '-' and '_' in names
 * are the same, as for modprobe.  finit_module loads each file (.ko.xz and
 * .ko.zst through the kernel's own decompression).  Built in (named in
 * modules.builtin) or already loaded (EEXIST) is fine; a missing or failing
 * module is a warning naming it and the error, never fatal.  One info line
 * gives the counts and the time taken.
 *
 * modules_plan is the pure part (unit-tested): the load order.
 */
#ifndef CONCH_INIT_MODULES_H
#define CONCH_INIT_MODULES_H

#include <stddef.h>

#define MODULES_MAX_LOAD 512

typedef struct modules_plan_ops {
  /* a module file (path relative to the modules directory), in load order */
  void (*load)(void *arg, const char *path);
  /* a requested name that is built in: nothing to load */
  void (*builtin)(void *arg, const char *name);
  /* a warning: the module and why ("not found", "dependency cycle", …) */
  void (*warn)(void *arg, const char *name, const char *why);
  void *arg;
} modules_plan_ops;

/* The load order for names[0..n) from the modules.dep text (and the
 * modules.builtin text, either may be NULL): every dependency before its
 * user, each file once, requested order kept otherwise.  A dependency
 * cycle is warned about and broken; a name in neither file is warned
 * about.  Returns the number of files planned, or -1 (out of memory). */
int modules_plan(const char *dep, size_t deplen, const char *builtin, size_t builtinlen,
                 const char *const *names, size_t n, const modules_plan_ops *ops);

/* Split a list of names (separators: ',', whitespace; '#' to the end of a
 * line is a comment) and call fn for each name.  Returns the count. */
size_t modules_split(const char *text, size_t len, void (*fn)(void *arg, const char *name, size_t n),
                     void *arg);

/* Load the modules named by cmdline_list (may be NULL) and by the file
 * list_path (absent is fine) from moddir (NULL: /lib/modules/<uname -r>).
 * Warnings only.  Returns the number of modules loaded now. */
int modules_load(const char *cmdline_list, const char *list_path, const char *moddir);

#endif
