/* fs/mode — Go's os.FileMode.String() for a struct stat.
 *
 * Type/attribute letters in Go's order "dalTLDpSugct?" (only those a Linux
 * stat can produce: d L D p S u g c t), or "-" when none, then rwxrwxrwx:
 * "-rw-r--r--", "drwxr-xr-x", "dtrwxrwxrwx" (/tmp), "Dcrw-rw-rw-"
 * (/dev/null), "Lrwxrwxrwx" (symlink), "urwxr-xr-x" (setuid).
 */
#ifndef CONCH_FS_MODE_H
#define CONCH_FS_MODE_H

#include <sys/types.h>

/* Longest result: 9 letters + 9 permission chars + NUL. */
#define FS_MODE_STR_MAX 24

/* Writes the string for st_mode into out (>= FS_MODE_STR_MAX); returns out. */
char *fs_mode_string(mode_t mode, char *out);

#endif
