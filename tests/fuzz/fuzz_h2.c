/* fuzz_h2 — an HTTP/2 session (server/h2.c, prior knowledge) over a memory
 * sink with the router double of tests/unit/memsink.h: the client preface,
 * then the input as the frames that follow.
 *
 * Input: one mode byte (as fuzz_http1: bits 0-5 read size, bit 6 output
 * held until the input is used up, bit 7 the timer fires), then frames.
 * Properties: the session settles; what it sends is a sequence of whole
 * HTTP/2 frames of known types, starting with its SETTINGS; closing it
 * leaks nothing (ASan). */
#include <string.h>

#include "server/h2.h"
#include "server/http1.h"
#include "tests/unit/memsink.h"
#include "fuzz.h"

static const hserve serve = {tr_dispatch, http1_conn_init, h2_conn_init, h2_settings_valid};

static void check_frames(const memsink *m) {
  size_t at = 0;
  while (at + 9 <= m->out_len) {
    size_t len = (size_t)m->out[at] << 16 | (size_t)m->out[at + 1] << 8 | m->out[at + 2];
    uint8_t type = m->out[at + 3];
    FUZZ_CHECK(type <= 9); /* DATA … CONTINUATION */
    if (at == 0) FUZZ_CHECK(type == 4);
    at += 9 + len;
  }
  if (m->out_len < m->out_max) FUZZ_CHECK(at == m->out_len); /* whole frames only */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  uint8_t mode = data[0];
  data++;
  size--;
  memsink m;
  tr_reset();
  memsink_init(&m, &serve);
  m.s.authed = mode & 1; /* either budget */
  m.read_chunk = mode & 63;
  m.auto_flush = !(mode & 64);
  m.out_max = 1u << 20;
  FUZZ_CHECK(serve.h2_init(&m.s, NULL, NULL, 0) == 0);
  memsink_feed(&m, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 24);
  memsink_feed(&m, data, size);
  FUZZ_CHECK(memsink_run(&m) == 0);
  m.auto_flush = 1;
  FUZZ_CHECK(memsink_run(&m) == 0);
  check_frames(&m);
  if (mode & 128) {
    memsink_fire_timer(&m);
    FUZZ_CHECK(memsink_run(&m) == 0);
  }
  memsink_free(&m);
  tr_reset();
  return 0;
}
