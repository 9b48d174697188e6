/* daemon — the one daemon context; see daemon.h. */
#include "core/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

conch_daemon conch = {.log_level = 1 /* LOG_LVL_INFO */, .http_header_ms = 10000, .http_idle_ms = 60000, .max_conns = 1024,
                      .rx_budget = 256u * 1024 * 1024,
                      .budget = 64u * 1024 * 1024};

int daemon_set_token(const char *tok, size_t len) {
  if (len > CONCH_TOKEN_MAX) len = CONCH_TOKEN_MAX;
  int changed = !conch.token_set || len != conch.token_len || memcmp(conch.token, tok, len) != 0;
  if (changed) explicit_bzero(conch.token, sizeof conch.token); /* a shorter token leaves no tail of the old */
  memcpy(conch.token, tok, len);
  conch.token[len] = 0;
  conch.token_len = len;
  conch.token_set = 1;
  if (changed) conch.token_gen++;
  return changed;
}

void *daemon_alloc_state(size_t size, const char *name) {
  void *p = calloc(1, size);
  if (!p) {
    /* not LOG_ERROR: log.c keeps its state here (no include cycle) */
    fprintf(stderr, "conch-init: out of memory for the %s state\n", name);
    abort();
  }
  return p;
}

void daemon_stdio_fill(void) {
  static unsigned placeholders; /* bit n: fd n holds the O_PATH stand-in */
  for (int fd = 0; fd <= 2; fd++) {
    int closed = fcntl(fd, F_GETFD) < 0 && errno == EBADF;
    if (!closed && !(placeholders & (1u << fd))) continue;
    int nfd = open("/dev/null", O_RDWR);
    unsigned stand_in = 0;
    if (nfd < 0 && closed) {
      nfd = open("/", O_PATH | O_DIRECTORY);
      stand_in = 1;
    }
    if (nfd < 0) continue; /* as it was */
    if (nfd != fd) {
      dup2(nfd, fd); /* clears close-on-exec */
      close(nfd);
    }
    placeholders = (placeholders & ~(1u << fd)) | (stand_in << fd);
  }
}
