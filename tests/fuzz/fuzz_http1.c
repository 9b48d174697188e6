/* fuzz_http1 — request bytes into an HTTP/1.1 session (server/http1.c) over
 * a memory sink, with the router double of tests/unit/memsink.h and the
 * real HTTP/2 core behind `Upgrade: h2c`.
 *
 * Input: one mode byte, then the bytes the client sends.  Mode: bits 0-5
 * the read size (0: everything at once), bit 6 the output is left unsent
 * until the input is used up, bit 7 the timer fires after the input.
 * Properties: the session settles (no endless deferred work); whatever it
 * sends begins with an HTTP/1.1 status line; a session left open after the
 * output went has no answer half-written (every exchange the handler
 * finished produced a status line); closing it leaks nothing (ASan). */
#include <string.h>

#include "server/h2.h"
#include "server/http1.h"
#include "tests/unit/memsink.h"
#include "fuzz.h"

static const hserve serve = {tr_dispatch, http1_conn_init, h2_conn_init, h2_settings_valid};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  data++;
  size--;
  memsink m;
  tr_reset();
  memsink_init(&m, &serve);
  m.read_chunk = mode & 63;
  m.use_into = 1; /* bodies to /into are read where the handler offers */
  m.auto_flush = !(mode & 64);
  m.out_max = 1u << 16; /* the head of the output is enough to check */
  FUZZ_CHECK(serve.http1_init(&m.s) == 0);
  memsink_feed(&m, data, size);
  FUZZ_CHECK(memsink_run(&m) == 0);
  m.auto_flush = 1;
  FUZZ_CHECK(memsink_run(&m) == 0);
  int upgraded = m.s.proto != &http1_conn_proto;
  if (m.out_len >= 9 && !upgraded) FUZZ_CHECK(memcmp(m.out, "HTTP/1.1 ", 9) == 0);
  if (!m.closed && !upgraded && m.out_len < m.out_max) {
    int done = 0;
    for (int i = 0; i < tr_n; i++) done += tr_x[i].done;
    FUZZ_CHECK(memsink_count(&m, "HTTP/1.1 ") - memsink_count(&m, "HTTP/1.1 100 Continue") >= done);
  }
  if (mode & 128) {
    memsink_fire_timer(&m);
    FUZZ_CHECK(memsink_run(&m) == 0);
  }
  memsink_free(&m);
  tr_reset();
  return 0;
}
