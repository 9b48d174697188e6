/* fuzz_multipart — the streaming multipart/form-data parser (fs/multipart.c)
 * on a Content-Type line (up to the first '\n') and a body.  Properties:
 * the body fed whole, byte by byte and cut at a point of its own gives the
 * same events, the same part names and the same bytes per part; every
 * byte given as data lies inside the body and no part gets more bytes
 * than the body has; events come in order (PART, DATA…, PART_END; END
 * last); a stored name (fs_mp_basename) has no '/' or '\' and is not "."
 * or "..". */
#include <string.h>

#include "fs/multipart.h"
#include "fuzz.h"

typedef struct trace {
  uint8_t *buf; /* events and data, serialized */
  size_t len, cap;
  size_t data;  /* data bytes */
} trace;

static void put(trace *t, const void *p, size_t n) {
  if (t->len + n > t->cap) {
    t->cap = (t->len + n) * 2 + 64;
    t->buf = realloc(t->buf, t->cap);
    FUZZ_CHECK(t->buf != NULL);
  }
  memcpy(t->buf + t->len, p, n);
  t->len += n;
}

/* Feed body in pieces of `step` bytes (0: whole; else the cut at `cut`
 * first).  Consecutive DATA events are joined in the trace. */
static void run(const char *ct, const uint8_t *body, size_t n, size_t step, size_t cut, trace *t) {
  fs_mp m;
  char err[160];
  if (fs_mp_init(&m, ct, err, sizeof err) != 0) {
    put(t, "I", 1);
    return;
  }
  size_t off = 0;
  int in_part = 0, ended = 0;
  size_t part_bytes = 0;
  char last = 0;
  while (off < n || off == 0) {
    size_t piece = step ? step : n - off;
    if (cut && off < cut) piece = cut - off;
    if (piece > n - off) piece = n - off;
    const uint8_t *p = body + off;
    size_t left = piece;
    for (;;) {
      size_t used;
      const uint8_t *d;
      size_t dl;
      fs_mp_event ev = fs_mp_next(&m, p, left, &used, &d, &dl);
      FUZZ_CHECK(used <= left);
      p += used;
      left -= used;
      if (ev == FS_MP_NEED) {
        FUZZ_CHECK(left == 0);
        break;
      }
      FUZZ_CHECK(!ended);
      if (ev == FS_MP_DATA) {
        FUZZ_CHECK(in_part && dl > 0);
        FUZZ_CHECK((d >= body && d + dl <= body + n) ||
                   (d >= (const uint8_t *)m.delim && d + dl <= (const uint8_t *)m.delim + m.dlen));
        part_bytes += dl;
        FUZZ_CHECK(part_bytes <= n);
        t->data += dl;
        if (last != 'D') put(t, "D", 1);
        put(t, d, dl);
        last = 'D';
        continue;
      }
      last = 0;
      if (ev == FS_MP_PART) {
        FUZZ_CHECK(!in_part);
        in_part = 1;
        part_bytes = 0;
        put(t, "P", 1);
        if (m.filename) {
          put(t, m.filename, strlen(m.filename) + 1);
          const char *b = fs_mp_basename(m.filename);
          if (b) {
            FUZZ_CHECK(*b && !strchr(b, '/') && !strchr(b, '\\'));
            FUZZ_CHECK(strcmp(b, ".") != 0 && strcmp(b, "..") != 0);
          }
        }
      } else if (ev == FS_MP_PART_END) {
        FUZZ_CHECK(in_part);
        in_part = 0;
        put(t, "E", 1);
      } else if (ev == FS_MP_END) {
        FUZZ_CHECK(!in_part);
        ended = 1;
        put(t, "Z", 1);
      } else {
        FUZZ_CHECK(ev == FS_MP_ERROR && strncmp(m.err, "invalid multipart body: ", 24) == 0);
        put(t, "X", 1);
        put(t, m.err, strlen(m.err));
        fs_mp_free(&m);
        return;
      }
    }
    off += piece;
    if (n == 0) break;
  }
  fs_mp_free(&m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nl = memchr(data, '\n', size);
  if (!nl || (size_t)(nl - data) > 200) return 0;
  char ct[256];
  memcpy(ct, data, (size_t)(nl - data));
  ct[nl - data] = 0;
  const uint8_t *body = nl + 1;
  size_t n = size - (size_t)(nl - data) - 1;
  trace whole = {0}, bytes = {0}, cut = {0};
  run(ct, body, n, 0, 0, &whole);
  run(ct, body, n, 1, 0, &bytes);
  run(ct, body, n, 0, n ? (size_t)body[0] % n : 0, &cut);
  FUZZ_CHECK(whole.len == bytes.len && (!whole.len || memcmp(whole.buf, bytes.buf, whole.len) == 0));
  FUZZ_CHECK(whole.len == cut.len && (!whole.len || memcmp(whole.buf, cut.buf, whole.len) == 0));
  FUZZ_CHECK(whole.data <= n);
  free(whole.buf);
  free(bytes.buf);
  free(cut.buf);
  return 0;
}
