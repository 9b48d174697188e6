/* bootutil — pure text helpers of the boot sequence (unit-tested):
 * the passwd fix-up of boot.md §2 step 11 and /proc/self/mountinfo lookup.
 */
#ifndef CONCH_INIT_BOOTUTIL_H
#define CONCH_INIT_BOOTUTIL_H

#include <stddef.h>

/* Set the 6th field (home) of the first "root:" line to /root; every other
 * byte is kept.  Returns 1 (changed, *out malloc'd, NUL-terminated), 0
 * (already /root, no root line, or a root line with fewer than 6 fields:
 * left alone) or -1 (out of memory). */
int boot_passwd_fix(const char *in, size_t n, char **out, size_t *outn);
/* 1 if the mountinfo text lists mountpoint (field 5, octal escapes such as
 * \040 decoded). */
int boot_mountinfo_has(const char *text, size_t n, const char *mountpoint);

/* A whole small file (at most BOOT_MAX_TEXT_FILE bytes), malloc'd and
 * NUL-terminated, its length in *len; NULL with errno set on failure. */
#define BOOT_MAX_TEXT_FILE (4u * 1024 * 1024)
char *boot_read_file(const char *path, size_t *len);

#endif
