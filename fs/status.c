/* fs/status — operation outcome and errno mapping; see status.h. */
#include "fs/status.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fs_status_clear(fs_status *st) {
  free(st->msg);
  st->msg = NULL;
  st->code = RPC_OK;
  st->err = 0;
}

void fs_status_set(fs_status *st, rpc_code code, const char *fmt, ...) {
  va_list ap;
  char *m = NULL;
  free(st->msg);
  va_start(ap, fmt);
  if (vasprintf(&m, fmt, ap) < 0) m = NULL;
  va_end(ap);
  st->msg = m;
  st->code = code;
  st->err = 0;
}

rpc_code fs_errno_code(int err) {
  return (err == EACCES || err == EPERM) ? RPC_PERMISSION_DENIED : RPC_INTERNAL;
}

void fs_status_os(fs_status *st, const char *context, const char *path, int err) {
  char buf[256];
  /* GNU strerror_r: thread safe, returns the text (maybe not in buf). */
  const char *s = strerror_r(err, buf, sizeof buf);
  char low[256];
  size_t i = 0;
  for (; s[i] && i + 1 < sizeof low; i++) low[i] = (char)tolower((unsigned char)s[i]);
  low[i] = 0;
  fs_status_set(st, fs_errno_code(err), "%s %s: %s", context, path, low);
  st->err = err;
}
