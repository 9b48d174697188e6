/* sink — see sink.h. */
#include "server/sink.h"

#include <stdlib.h>
#include <string.h>

#include "core/daemon.h"
#include "core/log.h"

int sink_write_copy(hsink *s, const void *data, size_t len) {
  void *b = malloc(len ? len : 1);
  if (!b) return -1;
  memcpy(b, data, len);
  uv_buf_t buf = uv_buf_init(b, (unsigned)len);
  return sink_write(s, &buf, 1, &b, 1);
}

void sink_unauth_over(hsink *s, const char *what) {
  if (++conch.unauth_closed % 1000 == 1)
    LOG_WARN("unauthenticated connection closed: %s peer=%s queued=%zu closed=%llu", what, s->peer,
             s->outq, conch.unauth_closed);
}
