/* fs/http_put — PUT and POST /files, raw and multipart: see http.c. */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "core/log.h"
#include "fs/atomic.h"
#include "fs/handlers.h"
#include "fs/http_int.h"
#include "fs/httphdr.h"
#include "fs/multipart.h"
#include "fs/path.h"
#include "fs/query.h"
#include "fs/service.h"
#include "proto/gzip.h"
#include "proto/text.h"

/* ---------------------------------------------------------------- PUT */

static void fh_put_kick(fs_http *h);

void fh_put_open_run(void *data) {
  fs_http *h = data;
  fs_atomic_open(&h->at, &h->st);
}

static int fh_gunzip_sink(void *arg, const uint8_t *p, size_t n) {
  fs_http *h = arg;
  if (fs_atomic_write(&h->at, p, n, &h->st) < 0) return -1;
  h->bytes += n;
  return 0;
}

static void fh_put_write_run(void *data) {
  fs_http *h = data;
  int last = h->phase == FH_COMMIT;
  if (atomic_load(&h->canceled)) {
    fs_atomic_abort(&h->at);
    return;
  }
  if (h->gz) { /* Content-Encoding: gzip: the file gets what it decodes to */
    gz_result g = gz_stream_feed(h->gz, h->wbuf, h->wlen, last, fh_gunzip_sink, h);
    if (g == GZ_TOO_BIG) return; /* the write failed: st set, temp file gone */
    if (g != GZ_OK) {
      fs_status_set(&h->st, RPC_INVALID_ARGUMENT, "invalid gzip body");
      fs_atomic_abort(&h->at);
      return;
    }
  } else {
    if (h->wlen && fs_atomic_write(&h->at, h->wbuf, h->wlen, &h->st) < 0) return;
    h->bytes += h->wlen;
  }
  if (last) fs_atomic_commit(&h->at, &h->st);
}

static void fh_cleanup_run(void *data) {
  fs_http *h = data;
  fs_atomic_abort(&h->at);
}

static void fh_cleanup_done(void *data, int canceled) {
  fs_http *h = data;
  (void)canceled;
  h->busy = 0;
  fh_destroy(h);
}

/* The exchange is gone (answered or aborted): no temp file may stay. */
void fh_put_dispose(fs_http *h) {
  if (h->busy) return; /* its done comes back here */
  if (fs_atomic_has_temp(&h->at)) {
    if (h->phase != FH_CLEANUP) fh_to(h, FH_CLEANUP);
    if (fh_submit(h, fh_cleanup_run, fh_cleanup_done) == 0) return;
    fs_atomic_abort(&h->at); /* cannot queue: here */
  }
  fh_destroy(h);
}

static void fh_put_fail(fs_http *h) {
  atomic_store(&h->canceled, 1);
  fh_error_st(h);
  fh_put_dispose(h);
}

/* An upload's pool job is back: 0 to go on, -1 when it is over (the
 * client left, or the job failed and the answer went out). */
static int fh_job_back(fs_http *h, int canceled) {
  h->busy = 0;
  fh_keep_spare(h);
  if (!h->r) {
    fh_put_dispose(h);
    return -1;
  }
  if (canceled && h->st.code == RPC_OK) fs_status_set(&h->st, RPC_INTERNAL, "file upload was canceled");
  if (h->st.code != RPC_OK) {
    fh_put_fail(h);
    return -1;
  }
  return 0;
}

void fh_put_done(void *data, int canceled) {
  fs_http *h = data;
  if (fh_job_back(h, canceled) != 0) return;
  if (h->phase == FH_OPEN) {
    fh_to(h, FH_RECV);
    rpc_http_pause_body(h->r, 0);
    fh_put_kick(h);
    return;
  }
  if (h->phase == FH_COMMIT) {
    size_t pl = strlen(h->q.path);
    char *body = malloc(TEXT_JSON_MAX(pl) + 64);
    if (!body) {
      fh_error(h, RPC_RESOURCE_EXHAUSTED, "out of memory");
      fh_destroy(h);
      return;
    }
    int k = sprintf(body, "{\"path\":");
    k += (int)text_json_string(body + k, h->q.path, pl);
    sprintf(body + k, ",\"size\":%" PRIu64 "}", h->bytes);
    LOG_INFO("files %s %s: %" PRIu64 " bytes", rpc_http_method(h->r), h->q.path, h->bytes);
    fh_answer(h, h->at.replaced ? 200 : 201, body, NULL, 0);
    free(body);
    fh_destroy(h);
    return;
  }
  fh_put_kick(h);
}

/* The buffer filled so far becomes the one the pool writes; the one it
 * wrote last time, if any, is filled next. */
static void fh_take_in(fs_http *h) {
  h->wbuf = h->in;
  h->wlen = h->in_len;
  h->wcap = h->in_cap;
  h->in = h->spare; /* the buffer written last time, if any */
  h->in_cap = h->spare_cap;
  h->in_len = 0;
  h->spare = NULL;
  h->spare_cap = 0;
}

/* Hand the filled buffer to the pool when it is not busy (at FH_IN_HIGH,
 * or at the body's end with the commit); pause the body while both
 * buffers are full. */
static void fh_put_kick(fs_http *h) {
  if (!h->r || h->phase != FH_RECV) return;
  if (!h->busy && (h->in_len >= FH_IN_HIGH || h->body_end)) {
    fh_take_in(h);
    if (h->body_end) fh_to(h, FH_COMMIT);
    if (fh_submit(h, fh_put_write_run, fh_put_done) != 0) {
      fs_status_set(&h->st, RPC_INTERNAL, "queue file write failed");
      fh_put_fail(h);
      return;
    }
  }
  int full = h->busy && h->in_len >= FH_IN_HIGH;
  if (full != h->paused && h->phase == FH_RECV) {
    h->paused = full;
    rpc_http_pause_body(h->r, full);
  }
}

/* Room for need more bytes in *buf (counted in the memory budget), at
 * least first bytes; 0, or -1 with h->st set. */
static int fh_grow(fs_http *h, uint8_t **buf, size_t *cap, size_t used, size_t need, size_t first) {
  if (used + need <= *cap) return 0;
  size_t nc = *cap ? *cap : first;
  while (nc < used + need) nc *= 2;
  if (budget_take(nc - *cap) != 0) {
    fs_status_set(&h->st, RPC_RESOURCE_EXHAUSTED, "memory budget exhausted");
    return -1;
  }
  uint8_t *nb = realloc(*buf, nc);
  if (!nb) {
    budget_give(nc - *cap);
    fs_status_set(&h->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return -1;
  }
  h->held += nc - *cap;
  *buf = nb;
  *cap = nc;
  return 0;
}

static void fh_mp_body(fs_http *h, const uint8_t *d, size_t n);

void fh_on_body(rpc_http *r, const uint8_t *d, size_t n) {
  fs_http *h = rpc_http_data(r);
  if (!h->r || h->phase != FH_RECV || !n) return;
  if (h->mp) {
    fh_mp_body(h, d, n);
    return;
  }
  if (d != h->in + h->in_len || h->in_len + n > h->in_cap) { /* else read there: fh_body_into */
    if (fh_grow(h, &h->in, &h->in_cap, h->in_len, n, FH_IN_HIGH) != 0) {
      fh_put_fail(h);
      return;
    }
    memcpy(h->in + h->in_len, d, n);
  }
  h->in_len += n;
  fh_put_kick(h);
}

/* A raw upload's next bytes may be read straight into the buffer that
 * fills (up to FH_IN_CAP). */
uint8_t *fh_body_into(rpc_http *r, size_t *len) {
  fs_http *h = rpc_http_data(r);
  if (!h || !h->r || h->phase != FH_RECV || h->mp || h->in_len >= FH_IN_HIGH) return NULL;
  if (h->in_cap < FH_IN_CAP && fh_grow(h, &h->in, &h->in_cap, h->in_len, FH_IN_CAP - h->in_len, FH_IN_HIGH) != 0) {
    fs_status_clear(&h->st); /* only a missed shortcut: on_body copies */
    return NULL;
  }
  *len = h->in_cap - h->in_len;
  return h->in + h->in_len;
}

/* ---------------------------------------------------------------- multipart */


static void fh_mp_run(void *data) {
  fs_http *h = data;
  if (atomic_load(&h->canceled)) {
    fs_atomic_abort(&h->at);
    return;
  }
  if (h->op == MPO_OPEN) {
    fs_atomic_open(&h->at, &h->st);
    return;
  }
  if (h->wlen && fs_atomic_write(&h->at, h->wbuf, h->wlen, &h->st) < 0) return;
  h->bytes += h->wlen;
  if (h->op == MPO_COMMIT) fs_atomic_commit(&h->at, &h->st);
}

static void fh_mp_done(void *data, int canceled) {
  fs_http *h = data;
  if (fh_job_back(h, canceled) != 0) return;
  if (h->op == MPO_COMMIT) {
    size_t pl = strlen(h->target);
    if (fh_grow(h, &h->results, &h->rcap, h->rlen, TEXT_JSON_MAX(pl) + 48, 4096) != 0) {
      fh_put_fail(h);
      return;
    }
    char *nr = (char *)h->results;
    h->rlen += (size_t)sprintf(nr + h->rlen, "%s{\"path\":", h->rlen ? "," : "");
    h->rlen += text_json_string(nr + h->rlen, h->target, pl);
    h->rlen += (size_t)sprintf(nr + h->rlen, ",\"size\":%" PRIu64 "}", h->bytes);
    LOG_INFO("files POST %s: %" PRIu64 " bytes", h->target, h->bytes);
    h->mp_file = 0;
  }
  fh_mp_pump(h);
}

/* The pool takes h->in (op: MPO_WRITE or MPO_COMMIT) or opens h->target. */
static int fh_mp_submit(fs_http *h, int op) {
  h->op = op;
  if (op != MPO_OPEN) {
    fh_take_in(h);
  }
  if (fh_submit(h, fh_mp_run, fh_mp_done) != 0) {
    fs_status_set(&h->st, RPC_INTERNAL, "queue file write failed");
    fh_put_fail(h);
    return -1;
  }
  return 0;
}

/* A part with a file name: where it goes, or a 400 (nothing of it written). */
static int fh_mp_part(fs_http *h) {
  const char *base = fs_mp_basename(h->mpp.filename);
  if (!base) {
    fs_status_set(&h->st, RPC_INVALID_ARGUMENT, "invalid file name in multipart body: \"%.200s\"",
                  h->mpp.filename);
    fh_put_fail(h);
    return -1;
  }
  const char *dir = h->q.path;
  free(h->target);
  size_t dl = strlen(dir);
  if (dl == 1) dl = 0; /* "/" */
  if (!(h->target = malloc(dl + strlen(base) + 2))) {
    fs_status_set(&h->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    fh_put_fail(h);
    return -1;
  }
  sprintf(h->target, "%.*s/%s", (int)dl, dir, base);
  h->mp_file = 1;
  h->bytes = 0;
  fs_atomic_init(&h->at, h->target, &h->canceled);
  return fh_mp_submit(h, MPO_OPEN);
}

/* Parse what is pending as far as the pool lets it go: data gathers in
 * h->in (written at FH_IN_HIGH), a part's start and end wait until the
 * pool is free.  The body is paused while parsed bytes wait. */
void fh_mp_pump(fs_http *h) {
  while (h->r) {
    if (!h->has_saved) {
      if (h->in_len >= FH_IN_HIGH) {
        if (h->busy || fh_mp_submit(h, MPO_WRITE) != 0) break;
        continue;
      }
      size_t avail = h->pend_len - h->pend_off, used;
      if (!avail) {
        if (h->body_end) {
          fs_status_set(&h->st, RPC_INVALID_ARGUMENT, "invalid multipart body: cut short");
          fh_put_fail(h);
          return;
        }
        h->pend_len = h->pend_off = 0;
        break;
      }
      const uint8_t *d;
      size_t dl;
      fs_mp_event ev = fs_mp_next(&h->mpp, h->pend + h->pend_off, avail, &used, &d, &dl);
      h->pend_off += used;
      if (ev == FS_MP_NEED) continue;
      if (ev == FS_MP_DATA) {
        if (!h->mp_file) continue;
        if (fh_grow(h, &h->in, &h->in_cap, h->in_len, dl, FH_IN_HIGH) != 0) {
          fh_put_fail(h);
          return;
        }
        memcpy(h->in + h->in_len, d, dl);
        h->in_len += dl;
        continue;
      }
      h->saved = ev;
      h->has_saved = 1;
    }
    if (h->saved == FS_MP_ERROR) {
      fs_status_set(&h->st, RPC_INVALID_ARGUMENT, "%s", h->mpp.err);
      fh_put_fail(h);
      return;
    }
    if (h->busy) break;
    h->has_saved = 0;
    if (h->saved == FS_MP_PART) {
      if (h->mpp.filename && fh_mp_part(h) != 0) return;
    } else if (h->saved == FS_MP_PART_END) {
      if (h->mp_file && fh_mp_submit(h, MPO_COMMIT) != 0) return;
    } else if (h->saved == FS_MP_END) {
      char *body = malloc(h->rlen + 16);
      if (!body) {
        fh_error(h, RPC_RESOURCE_EXHAUSTED, "out of memory");
      } else {
        sprintf(body, "{\"files\":[%.*s]}", (int)h->rlen, h->results ? (char *)h->results : "");
        fh_answer(h, 200, body, NULL, 0);
        free(body);
      }
      fh_destroy(h);
      return;
    }
  }
  if (!h->r) return;
  int wait = h->has_saved || h->pend_off < h->pend_len;
  if (wait != h->paused) {
    h->paused = wait;
    rpc_http_pause_body(h->r, wait);
  }
}

static void fh_mp_body(fs_http *h, const uint8_t *d, size_t n) {
  if (h->pend_off) { /* what was parsed goes */
    memmove(h->pend, h->pend + h->pend_off, h->pend_len - h->pend_off);
    h->pend_len -= h->pend_off;
    h->pend_off = 0;
  }
  if (fh_grow(h, &h->pend, &h->pend_cap, h->pend_len, n, FH_IN_HIGH) != 0) {
    fh_put_fail(h);
    return;
  }
  memcpy(h->pend + h->pend_len, d, n);
  h->pend_len += n;
  fh_mp_pump(h);
}

void fh_on_body_end(rpc_http *r) {
  fs_http *h = rpc_http_data(r);
  if (!h->r || !h->put) return;
  h->body_end = 1;
  if (h->mp)
    fh_mp_pump(h);
  else
    fh_put_kick(h);
}

