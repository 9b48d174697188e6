/* fs/quote — Go's strconv.Quote (the %q verb), for error texts that quote
 * user input: invalid search pattern "<p>" and friends.
 *
 * '"' and '\' are escaped, \a \b \f \n \r \t \v by name, other ASCII
 * controls and invalid UTF-8 bytes as \xNN, non-printable runes as \uNNNN
 * or \UNNNNNNNN; printable runes (letters, CJK, emoji…) are kept.  Go's
 * Unicode "printable" table is approximated by excluding C1 controls,
 * non-ASCII spaces, format characters and private-use planes.
 */
#ifndef CONCH_FS_QUOTE_H
#define CONCH_FS_QUOTE_H

#include <stddef.h>

/* malloc'd, NUL-terminated, with the surrounding quotes; NULL on ENOMEM. */
char *fs_go_quote(const char *s, size_t len);

#endif
