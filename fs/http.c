/* fs/http — /files over plain HTTP (api.md §9 "Files over plain HTTP"):
 * GET/HEAD a file's raw bytes (validators, one range, conditionals),
 * PUT/POST a raw body written whole or not at all (fs/atomic.h),
 * OPTIONS for CORS; the token or a signed URL, and the user, through
 * rpc_http_admit (server/rpc.h).
 *
 * GET: the open and fstat run in the pool as the request's user.  A
 * regular file with a size (not on a pseudo filesystem) is sent from its
 * offset: zero copy where the transport can (rpc_http_write_file), else
 * FH_CHUNK reads in the pool, each after rpc_http_room said the transport
 * and the memory budget have room for it.  Other files stream until EOF
 * (chunked): FIFOs and pollable devices read on the loop when uv_poll says
 * so (a FIFO without a writer waits and blocks nothing); devices that
 * cannot be polled (/dev/zero) read in the pool, until the client leaves.
 *
 * PUT/POST: the temp file is opened in the pool, then the body is read:
 * bytes gather in a buffer handed to a pool write at FH_IN_HIGH while the
 * next one fills; the body pauses while both are full, so an upload holds
 * about 2 x FH_IN_HIGH.  At the body's end the commit runs; a peer that
 * leaves before removes the temp file (in the pool).
 *
 * The lifecycle is fh->phase, changed by fh_to() only. */
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
#include "fs/httphdr.h"
#include "fs/multipart.h"
#include "fs/path.h"
#include "fs/query.h"
#include "fs/service.h"
#include "proto/gzip.h"
#include "proto/text.h"

#define FH_CHUNK (256u * 1024)
#define FH_IN_HIGH (1024u * 1024)
#define FH_IN_CAP (2 * FH_IN_HIGH)

typedef enum fh_phase {
  FH_ADMIT,   /* token / signature and user being checked */
  FH_OPEN,    /* pool: open (GET) or temp file (PUT) */
  FH_SEND,    /* GET: answer streaming */
  FH_RECV,    /* PUT: body arriving, pool writes */
  FH_COMMIT,  /* PUT: pool commit */
  FH_CLEANUP, /* the peer left: pool work finishing, temp file removed */
} fh_phase;

typedef struct fs_http {
  rpc_http *r; /* NULL once the exchange is gone (answered or aborted) */
  fh_phase phase;
  int put;     /* PUT/POST, else GET/HEAD */
  int head;
  fs_query q;
  const rpc_ident *id; /* a hold: the request's user, for pool work */
  int busy;            /* a pool job is out */
  atomic_int canceled;
  fs_status st;
  /* GET */
  int fd;
  struct stat sb;
  int sized;            /* Content-Length known: [pos, end) is sent */
  uint64_t pos, end;
  int pollable, poll_init, polling;
  uv_poll_t poll;
  uint8_t *buf; /* the chunk being read */
  size_t n;
  int eof;
  int zero_copy; /* the transport takes file ranges */
  gz_stream *gz;  /* GET: gzip on the fly; PUT: the body is gunzipped */
  uint8_t *zb;    /* GET: the gzip of the chunk read */
  size_t zn, zcap;
  size_t zraw; /* file bytes behind the gzip in buf */
  int gz_done;  /* the gzip stream's end was made */
  /* PUT */
  fs_atomic at;
  uint8_t *in;    /* filling */
  size_t in_len, in_cap;
  uint8_t *wbuf;  /* being written by the pool */
  size_t wlen, wcap;
  uint8_t *spare; /* the last one written, filled next (no malloc per MiB) */
  size_t spare_cap;
  size_t held;    /* budget_take'n for in and wbuf */
  int body_end, paused;
  uint64_t bytes;
  /* POST multipart/form-data */
  int mp;
  fs_mp mpp;
  uint8_t *pend; /* body bytes not yet parsed */
  size_t pend_len, pend_off, pend_cap;
  fs_mp_event saved; /* an event that waits for the pool */
  int has_saved;
  int mp_file;    /* the current part is a file being written */
  char *target;   /* its path */
  enum { MPO_OPEN, MPO_WRITE, MPO_COMMIT } op;
  char *results;  /* ",{"path":…,"size":…}" entries */
  size_t rlen;
} fs_http;

static void fh_to(fs_http *h, fh_phase from, fh_phase to) {
  assert(h->phase == from);
  (void)from;
  h->phase = to;
}

static const rpc_http_hdr fh_cors[] = {
    {"access-control-allow-origin", "*"},
    {"access-control-expose-headers", "ETag, Content-Range, Content-Length, Content-Disposition"},
};
#define FH_NCORS (sizeof fh_cors / sizeof fh_cors[0])

/* ---------------------------------------------------------------- freeing */

static void fh_free(fs_http *h) {
  if (h->fd >= 0) close(h->fd);
  free(h->buf);
  free(h->in);
  free(h->wbuf);
  free(h->spare);
  free(h->zb);
  gz_stream_free(h->gz);
  free(h->pend);
  free(h->target);
  free(h->results);
  if (h->mp) fs_mp_free(&h->mpp);
  budget_give(h->held);
  fs_query_free(&h->q);
  fs_status_clear(&h->st);
  rpc_ident_release(h->id);
  free(h);
}

static void fh_on_poll_closed(uv_handle_t *p) { fh_free(p->data); }

/* Nothing of h is in use any more (no pool job, the exchange gone). */
static void fh_destroy(fs_http *h) {
  if (h->poll_init) {
    h->poll_init = 0;
    uv_close((uv_handle_t *)&h->poll, fh_on_poll_closed);
    return;
  }
  fh_free(h);
}

/* ---------------------------------------------------------------- answers */

static void fh_done(fs_http *h) {
  rpc_http *r = h->r;
  h->r = NULL;
  if (h->polling) uv_poll_stop(&h->poll);
  h->polling = 0;
  rpc_http_end(r);
}

/* A small whole answer (JSON), then the end of the exchange. */
static void fh_answer(fs_http *h, int status, const char *body, const rpc_http_hdr *extra, size_t nextra) {
  rpc_http_hdr hh[8];
  size_t n = 0;
  hh[n++] = (rpc_http_hdr){"content-type", "application/json"};
  for (size_t i = 0; i < FH_NCORS; i++) hh[n++] = fh_cors[i];
  for (size_t i = 0; i < nextra && n < 8; i++) hh[n++] = extra[i];
  size_t bl = strlen(body);
  rpc_http_respond(h->r, status, hh, n, (int64_t)bl);
  if (bl && strcmp(rpc_http_method(h->r), "HEAD") != 0) {
    char *b = strdup(body);
    if (b) rpc_http_write(h->r, b, (uint8_t *)b, bl);
  }
  fh_done(h);
}

/* {"code":…,"message":…} with Connect's status for the code; the
 * exchange ends.  ENOSPC is 507 (api.md). */
static void fh_error_x(fs_http *h, int status, rpc_code code, const char *msg, const rpc_http_hdr *extra,
                       size_t nextra) {
  if (!msg) msg = "out of memory";
  if (!status) status = rpc_code_http_status(code);
  if (strstr(msg, ": no space left on device")) {
    status = 507;
    code = RPC_RESOURCE_EXHAUSTED;
    msg = "no space left on device";
  }
  size_t ml = strlen(msg);
  char *body = malloc(TEXT_JSON_MAX(ml) + 64);
  if (!body) {
    fh_answer(h, 500, "", NULL, 0);
    return;
  }
  int k = sprintf(body, "{\"code\":\"%s\",\"message\":", rpc_code_name(code));
  k += (int)text_json_string(body + k, msg, ml);
  strcpy(body + k, "}");
  LOG_DEBUG("files %s %s: %d %s", rpc_http_method(h->r), h->q.path ? h->q.path : "-", status, msg);
  fh_answer(h, status, body, extra, nextra);
  free(body);
}

static void fh_error(fs_http *h, rpc_code code, const char *msg) { fh_error_x(h, 0, code, msg, NULL, 0); }

static void fh_error_st(fs_http *h) { fh_error(h, h->st.code, h->st.msg); }

/* The buffer the pool wrote is kept for the next fill. */
static void fh_keep_spare(fs_http *h) {
  if (h->wbuf && !h->spare) {
    h->spare = h->wbuf;
    h->spare_cap = h->wcap;
  } else if (h->wbuf) {
    free(h->wbuf);
    budget_give(h->wcap);
    h->held -= h->wcap;
  }
  h->wbuf = NULL;
  h->wlen = h->wcap = 0;
}

/* A pool job as the request's user; 0, or -1 (answered). */
static int fh_submit(fs_http *h, void (*run)(void *), void (*done)(void *, int)) {
  h->busy = 1;
  if (rpc_work_submit_as(h->id, run, done, h) == NULL) {
    h->busy = 0;
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- GET */

static void fh_pump(fs_http *h);
static void fh_on_poll(uv_poll_t *p, int status, int events);

static void fh_open_run(void *data) {
  fs_http *h = data;
  const char *p = h->q.path;
  int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&h->st, RPC_NOT_FOUND, "file not found: %s", p);
    else
      fs_status_os(&h->st, "open file", p, e);
    return;
  }
  if (fstat(fd, &h->sb) != 0) {
    fs_status_os(&h->st, "stat file", p, errno);
    close(fd);
    return;
  }
  if (S_ISDIR(h->sb.st_mode)) {
    fs_status_set(&h->st, RPC_INVALID_ARGUMENT, "path is a directory: %s", p);
    close(fd);
    return;
  }
  h->fd = fd;
  if (S_ISREG(h->sb.st_mode) || S_ISBLK(h->sb.st_mode)) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    h->sized = S_ISREG(h->sb.st_mode) && !fs_pseudo_fs(fd);
  }
}

static void fh_get_opened(void *data, int canceled) {
  fs_http *h = data;
  h->busy = 0;
  if (!h->r) {
    fh_destroy(h);
    return;
  }
  if (canceled) fs_status_set(&h->st, RPC_INTERNAL, "file download was canceled");
  if (h->st.code != RPC_OK) {
    fh_error_st(h);
    fh_destroy(h);
    return;
  }
  rpc_http *r = h->r;
  const struct stat *sb = &h->sb;
  char etag[80], lm[40], crange[80];
  /* gzip when asked, for the whole file (a range is of the identity bytes) */
  int gz = gz_accepted(rpc_http_header(r, "accept-encoding")) && !rpc_http_header(r, "range");
  snprintf(etag, sizeof etag, "\"%" PRIx64 "-%" PRIx64 "-%" PRIx64 "%s\"", (uint64_t)sb->st_ino,
           (uint64_t)sb->st_size,
           (uint64_t)sb->st_mtim.tv_sec * 1000000000u + (uint64_t)sb->st_mtim.tv_nsec, gz ? "-gzip" : "");
  fs_http_date(sb->st_mtim.tv_sec, lm);
  char *disp = fs_http_disposition(fs_path_base(h->q.path));
  rpc_http_hdr hh[16];
  size_t n = 0;
  for (size_t i = 0; i < FH_NCORS; i++) hh[n++] = fh_cors[i];
  hh[n++] = (rpc_http_hdr){"etag", etag};
  hh[n++] = (rpc_http_hdr){"last-modified", lm};
  if (h->sized) hh[n++] = (rpc_http_hdr){"accept-ranges", "bytes"};
  hh[n++] = (rpc_http_hdr){"vary", "Accept-Encoding"};
  /* RFC 9110 §13.2.2: If-None-Match, else If-Modified-Since */
  const char *inm = rpc_http_header(r, "if-none-match");
  int64_t ims = fs_http_parse_date(rpc_http_header(r, "if-modified-since"));
  if ((inm && fs_http_etag_listed(inm, etag)) || (!inm && ims >= 0 && sb->st_mtim.tv_sec <= ims)) {
    rpc_http_respond(r, 304, hh, n, 0);
    fh_done(h);
    free(disp);
    fh_destroy(h);
    return;
  }
  if (disp) hh[n++] = (rpc_http_hdr){"content-disposition", disp};
  hh[n++] = (rpc_http_hdr){"content-type", "application/octet-stream"};
  int status = 200;
  if (gz) {
    hh[n++] = (rpc_http_hdr){"content-encoding", "gzip"};
    if (!(h->gz = gz_stream_new(1, 1))) {
      free(disp);
      fh_error(h, RPC_RESOURCE_EXHAUSTED, "out of memory");
      fh_destroy(h);
      return;
    }
    h->pos = 0;
    h->end = (uint64_t)sb->st_size;
  } else if (h->sized) {
    uint64_t size = (uint64_t)sb->st_size, a = 0, b = 0;
    const char *ir = rpc_http_header(r, "if-range");
    fs_http_rng rg = fs_http_range(rpc_http_header(r, "range"), size, &a, &b);
    if (rg != FS_RANGE_NONE && ir && strcmp(ir, etag) != 0 && strcmp(ir, lm) != 0) rg = FS_RANGE_NONE;
    h->pos = 0;
    h->end = size;
    if (rg == FS_RANGE_BAD) {
      snprintf(crange, sizeof crange, "bytes */%" PRIu64, size);
      rpc_http_hdr cr = {"content-range", crange};
      free(disp);
      fh_error_x(h, 416, RPC_OUT_OF_RANGE, "range not satisfiable", &cr, 1);
      fh_destroy(h);
      return;
    }
    if (rg == FS_RANGE_OK) {
      status = 206;
      h->pos = a;
      h->end = b + 1;
      snprintf(crange, sizeof crange, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, a, b, size);
      hh[n++] = (rpc_http_hdr){"content-range", crange};
    }
  }
  rpc_http_respond(r, status, hh, n, h->sized && !gz ? (int64_t)(h->end - h->pos) : -1);
  free(disp);
  if (h->head) {
    fh_done(h);
    fh_destroy(h);
    return;
  }
  fh_to(h, FH_OPEN, FH_SEND);
  if (!h->sized && !S_ISBLK(sb->st_mode) && uv_poll_init(fs_loop, &h->poll, h->fd) == 0) {
    h->poll_init = 1;
    h->poll.data = h;
    h->pollable = 1;
  }
  h->zero_copy = h->sized && !gz;
  fh_pump(h);
}

static int fh_zb_sink(void *arg, const uint8_t *p, size_t n) {
  fs_http *h = arg;
  if (h->zn + n > h->zcap) {
    size_t cap = (h->zn + n) * 2;
    uint8_t *nb = realloc(h->zb, cap);
    if (!nb) return -1;
    h->zb = nb;
    h->zcap = cap;
  }
  memcpy(h->zb + h->zn, p, n);
  h->zn += n;
  return 0;
}

/* GET with gzip: buf's n bytes become their gzip (the last chunk ends the
 * stream).  Pool thread, or the loop for a FIFO's small reads. */
static void fh_gzip_chunk(fs_http *h) {
  int last = h->sized ? h->pos + h->n >= h->end : h->eof;
  h->zn = 0;
  if (gz_stream_feed(h->gz, h->buf, h->n, last, fh_zb_sink, h) != GZ_OK) {
    fs_status_set(&h->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  h->gz_done = last;
  uint8_t *t = h->buf; /* the gzip goes out in buf's place */
  h->buf = h->zb;
  h->zb = t;
  h->zcap = FH_CHUNK;
  size_t raw = h->n;
  h->n = h->zn;
  h->zraw = raw;
}

static void fh_read_fill(fs_http *h);

static void fh_read_run(void *data) {
  fs_http *h = data;
  fh_read_fill(h);
  if (h->gz && h->st.code == RPC_OK) fh_gzip_chunk(h);
}

static void fh_read_fill(fs_http *h) {
  size_t want = FH_CHUNK;
  if (h->sized && h->end - h->pos < want) want = (size_t)(h->end - h->pos);
  h->n = 0;
  while (h->n < want) {
    ssize_t r = h->sized ? pread(h->fd, h->buf + h->n, want - h->n, (off_t)(h->pos + h->n))
                         : read(h->fd, h->buf + h->n, want - h->n);
    if (r < 0) {
      if (errno == EINTR) continue;
      fs_status_os(&h->st, "read file", h->q.path, errno);
      return;
    }
    if (r == 0) {
      h->eof = 1;
      if (h->sized) fs_status_set(&h->st, RPC_DATA_LOSS, "file changed during download: %s", h->q.path);
      return;
    }
    h->n += (size_t)r;
    if (!h->sized) break; /* a device or pipe: what it has now */
  }
}

/* Hand the chunk read to the transport. */
static int fh_send_buf(fs_http *h) {
  uint8_t *b = h->buf;
  size_t n = h->n;
  h->buf = NULL;
  h->n = 0;
  h->pos += h->gz ? h->zraw : n;
  if (!n) {
    free(b);
    return 0;
  }
  return rpc_http_write(h->r, b, b, n);
}

static void fh_read_done(void *data, int canceled) {
  fs_http *h = data;
  h->busy = 0;
  if (!h->r) {
    fh_destroy(h);
    return;
  }
  if (canceled || h->st.code != RPC_OK) {
    /* the head is out: all that is left is to cut the answer short */
    LOG_WARN("files GET %s: %s", h->q.path, h->st.msg ? h->st.msg : "canceled");
    rpc_http_abort(h->r);
    h->r = NULL;
    fh_destroy(h);
    return;
  }
  if (fh_send_buf(h) != 0) {
    rpc_http_abort(h->r);
    h->r = NULL;
    fh_destroy(h);
    return;
  }
  fh_pump(h);
}

/* The next piece of a GET's answer, once there is room for it. */
static void fh_pump(fs_http *h) {
  if (!h->r || h->busy) return;
  if (h->gz ? h->gz_done : (h->sized && h->pos >= h->end) || h->eof) {
    fh_done(h);
    fh_destroy(h);
    return;
  }
  if (h->zero_copy) {
    int z = rpc_http_write_file(h->r, h->fd, h->pos, h->end - h->pos);
    if (z == 0) { /* on_drain once it is all sent */
      h->pos = h->end;
      return;
    }
    if (z < 0) {
      rpc_http_abort(h->r);
      h->r = NULL;
      fh_destroy(h);
      return;
    }
    h->zero_copy = 0; /* not on this transport */
  }
  if (!rpc_http_room(h->r, FH_CHUNK)) {
    if (h->polling) uv_poll_stop(&h->poll);
    h->polling = 0;
    return; /* on_drain comes back */
  }
  if (!h->buf && !(h->buf = malloc(FH_CHUNK))) {
    rpc_http_abort(h->r);
    h->r = NULL;
    fh_destroy(h);
    return;
  }
  if (h->pollable) {
    if (!h->polling && uv_poll_start(&h->poll, UV_READABLE | UV_DISCONNECT, fh_on_poll) == 0)
      h->polling = 1;
    return;
  }
  if (fh_submit(h, fh_read_run, fh_read_done) != 0) {
    rpc_http_abort(h->r);
    h->r = NULL;
    fh_destroy(h);
  }
}

/* A FIFO or pollable device has bytes (or hung up): one non-blocking read. */
static void fh_on_poll(uv_poll_t *p, int status, int events) {
  fs_http *h = p->data;
  (void)events;
  if (!h->r) return;
  ssize_t r = status < 0 ? -1 : read(h->fd, h->buf, FH_CHUNK);
  if (r < 0 && (errno == EAGAIN || errno == EINTR) && status >= 0) return;
  if (r <= 0) {
    h->eof = 1;
    h->n = 0;
    if (!h->gz) {
      fh_pump(h);
      return;
    }
  } else {
    h->n = (size_t)r;
  }
  if (h->gz) fh_gzip_chunk(h); /* a FIFO's read: small, on the loop */
  if (h->st.code != RPC_OK || fh_send_buf(h) != 0) {
    rpc_http_abort(h->r);
    h->r = NULL;
    uv_poll_stop(&h->poll);
    h->polling = 0;
    fh_destroy(h);
    return;
  }
  fh_pump(h);
}

/* ---------------------------------------------------------------- PUT */

static void fh_put_kick(fs_http *h);

static void fh_put_open_run(void *data) {
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
static void fh_put_dispose(fs_http *h) {
  if (h->busy) return; /* its done comes back here */
  if (fs_atomic_has_temp(&h->at)) {
    if (h->phase != FH_CLEANUP) fh_to(h, h->phase, FH_CLEANUP);
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

static void fh_put_done(void *data, int canceled) {
  fs_http *h = data;
  h->busy = 0;
  fh_keep_spare(h);
  if (!h->r) {
    fh_put_dispose(h);
    return;
  }
  if (canceled && h->st.code == RPC_OK) fs_status_set(&h->st, RPC_INTERNAL, "file upload was canceled");
  if (h->st.code != RPC_OK) {
    fh_put_fail(h);
    return;
  }
  if (h->phase == FH_OPEN) {
    fh_to(h, FH_OPEN, FH_RECV);
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

/* Hand the filled buffer to the pool when it is not busy (at FH_IN_HIGH,
 * or at the body's end with the commit); pause the body while both
 * buffers are full. */
static void fh_put_kick(fs_http *h) {
  if (!h->r || h->phase != FH_RECV) return;
  if (!h->busy && (h->in_len >= FH_IN_HIGH || h->body_end)) {
    h->wbuf = h->in;
    h->wlen = h->in_len;
    h->wcap = h->in_cap;
    h->in = h->spare; /* the buffer written last time, if any */
    h->in_cap = h->spare_cap;
    h->in_len = 0;
    h->spare = NULL;
    h->spare_cap = 0;
    if (h->body_end) fh_to(h, FH_RECV, FH_COMMIT);
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

/* Room for need more bytes in *buf (counted in the memory budget); 0, or
 * -1 with h->st set. */
static int fh_grow(fs_http *h, uint8_t **buf, size_t *cap, size_t used, size_t need) {
  if (used + need <= *cap) return 0;
  size_t nc = *cap ? *cap : FH_IN_HIGH;
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

static void fh_on_body(rpc_http *r, const uint8_t *d, size_t n) {
  fs_http *h = rpc_http_data(r);
  if (!h->r || h->phase != FH_RECV || !n) return;
  if (h->mp) {
    fh_mp_body(h, d, n);
    return;
  }
  if (d != h->in + h->in_len || h->in_len + n > h->in_cap) { /* else read there: fh_body_into */
    if (fh_grow(h, &h->in, &h->in_cap, h->in_len, n) != 0) {
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
static uint8_t *fh_body_into(rpc_http *r, size_t *len) {
  fs_http *h = rpc_http_data(r);
  if (!h || !h->r || h->phase != FH_RECV || h->mp || h->in_len >= FH_IN_HIGH) return NULL;
  if (h->in_cap < FH_IN_CAP && fh_grow(h, &h->in, &h->in_cap, h->in_len, FH_IN_CAP - h->in_len) != 0) {
    fs_status_clear(&h->st); /* only a missed shortcut: on_body copies */
    return NULL;
  }
  *len = h->in_cap - h->in_len;
  return h->in + h->in_len;
}

/* ---------------------------------------------------------------- multipart */

static void fh_mp_pump(fs_http *h);

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
  h->busy = 0;
  fh_keep_spare(h);
  if (!h->r) {
    fh_put_dispose(h);
    return;
  }
  if (canceled && h->st.code == RPC_OK) fs_status_set(&h->st, RPC_INTERNAL, "file upload was canceled");
  if (h->st.code != RPC_OK) {
    fh_put_fail(h);
    return;
  }
  if (h->op == MPO_COMMIT) {
    size_t pl = strlen(h->target);
    char *nr = realloc(h->results, h->rlen + TEXT_JSON_MAX(pl) + 48);
    if (!nr) {
      fs_status_set(&h->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
      fh_put_fail(h);
      return;
    }
    h->results = nr;
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
    h->wbuf = h->in;
    h->wlen = h->in_len;
    h->wcap = h->in_cap;
    h->in = h->spare; /* the buffer written last time, if any */
    h->in_cap = h->spare_cap;
    h->in_len = 0;
    h->spare = NULL;
    h->spare_cap = 0;
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
static void fh_mp_pump(fs_http *h) {
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
        if (fh_grow(h, &h->in, &h->in_cap, h->in_len, dl) != 0) {
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
        sprintf(body, "{\"files\":[%.*s]}", (int)h->rlen, h->results ? h->results : "");
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
  if (fh_grow(h, &h->pend, &h->pend_cap, h->pend_len, n) != 0) {
    fh_put_fail(h);
    return;
  }
  memcpy(h->pend + h->pend_len, d, n);
  h->pend_len += n;
  fh_mp_pump(h);
}

static void fh_on_body_end(rpc_http *r) {
  fs_http *h = rpc_http_data(r);
  if (!h->r || !h->put) return;
  h->body_end = 1;
  if (h->mp)
    fh_mp_pump(h);
  else
    fh_put_kick(h);
}

/* ---------------------------------------------------------------- common */

static void fh_on_abort(rpc_http *r) {
  fs_http *h = rpc_http_data(r);
  h->r = NULL;
  atomic_store(&h->canceled, 1);
  if (h->polling) uv_poll_stop(&h->poll);
  h->polling = 0;
  if (h->phase == FH_ADMIT) {
    fh_destroy(h);
    return;
  }
  if (h->put) {
    fh_put_dispose(h);
    return;
  }
  if (!h->busy) fh_destroy(h);
}

static void fh_on_drain(rpc_http *r) { fh_pump(rpc_http_data(r)); }

static uint8_t *fh_body_into(rpc_http *r, size_t *len);
static const rpc_http_handler fh_handler = {fh_on_body, fh_on_body_end, fh_on_abort, fh_on_drain,
                                            fh_body_into};

static void fh_ready(rpc_http *r, rpc_code code, const char *msg) {
  fs_http *h = rpc_http_data(r);
  if (code != RPC_OK) {
    fh_error(h, code, msg);
    fh_destroy(h);
    return;
  }
  h->id = rpc_ident_hold(rpc_http_ident(r));
  fh_to(h, FH_ADMIT, FH_OPEN);
  if (h->mp) {
    fh_to(h, FH_OPEN, FH_RECV);
    rpc_http_pause_body(r, 0);
    fh_mp_pump(h);
    return;
  }
  if (h->put) {
    fs_atomic_init(&h->at, h->q.path, &h->canceled);
    if (fh_submit(h, fh_put_open_run, fh_put_done) != 0) {
      fh_error(h, RPC_INTERNAL, "queue file upload failed");
      fh_destroy(h);
    }
    return;
  }
  if (fh_submit(h, fh_open_run, fh_get_opened) != 0) {
    fh_error(h, RPC_INTERNAL, "queue file download failed");
    fh_destroy(h);
  }
}

void fs_http_serve(rpc_http *r) {
  fs_http *h = calloc(1, sizeof *h);
  if (!h) {
    static const rpc_http_handler none;
    if (rpc_http_open(r, &none, NULL) == 0) { /* else it answered 500 itself */
      rpc_http_respond(r, 500, NULL, 0, 0);
      rpc_http_end(r);
    }
    return;
  }
  h->fd = -1;
  atomic_init(&h->canceled, 0);
  fs_atomic_init(&h->at, NULL, &h->canceled); /* no temp file yet */
  if (rpc_http_open(r, &fh_handler, h) != 0) {
    free(h);
    return;
  }
  h->r = r;
  const char *m = rpc_http_method(r);
  if (strcmp(m, "OPTIONS") == 0) {
    rpc_http_hdr hh[] = {
        {"access-control-allow-origin", "*"},
        {"access-control-allow-methods", "GET, HEAD, PUT, POST"},
        {"access-control-allow-headers", "content-type, range, conch-init-token, conch-init-user"},
        {"access-control-max-age", "7200"},
    };
    rpc_http_respond(r, 204, hh, sizeof hh / sizeof hh[0], 0);
    fh_done(h);
    fh_destroy(h);
    return;
  }
  h->head = strcmp(m, "HEAD") == 0;
  h->put = strcmp(m, "PUT") == 0 || strcmp(m, "POST") == 0;
  if (!h->head && !h->put && strcmp(m, "GET") != 0) {
    rpc_http_hdr allow = {"allow", "GET, HEAD, PUT, POST, OPTIONS"};
    fh_answer(h, 405, "{\"code\":\"unimplemented\",\"message\":\"method not allowed\"}", &allow, 1);
    fh_destroy(h);
    return;
  }
  char err[200];
  if (fs_query_parse(rpc_http_query(r), &h->q, err, sizeof err) != 0) {
    fh_error(h, RPC_INVALID_ARGUMENT, err);
    fh_destroy(h);
    return;
  }
  const char *op = h->put ? "http file upload" : "http file download";
  if (fs_path_check(h->q.path ? h->q.path : "", h->q.path_len, op, err, sizeof err) != 0) {
    fh_error(h, RPC_INVALID_ARGUMENT, err);
    fh_destroy(h);
    return;
  }
  const char *ce = rpc_http_header(r, "content-encoding");
  if (h->put && ce && strcasecmp(ce, "identity") != 0) {
    const char *ct = rpc_http_header(r, "content-type");
    if (strcasecmp(ce, "gzip") != 0 || (ct && strncasecmp(ct, "multipart/form-data", 19) == 0)) {
      char e[120];
      snprintf(e, sizeof e, "unsupported content encoding: %.60s", ce);
      fh_error_x(h, 415, RPC_INVALID_ARGUMENT, e, NULL, 0);
      fh_destroy(h);
      return;
    }
    if (!(h->gz = gz_stream_new(0, 0))) {
      fh_error(h, RPC_RESOURCE_EXHAUSTED, "out of memory");
      fh_destroy(h);
      return;
    }
  }
  if (h->put && strcmp(m, "POST") == 0) {
    const char *ct = rpc_http_header(r, "content-type");
    if (ct && strncasecmp(ct, "multipart/form-data", 19) == 0) {
      if (fs_mp_init(&h->mpp, ct, err, sizeof err) != 0) {
        fh_error(h, RPC_INVALID_ARGUMENT, err);
        fh_destroy(h);
        return;
      }
      h->mp = 1;
    }
  }
  rpc_http_auth a = {0};
  if (h->q.signature) {
    a.sign_method = h->put ? "PUT" : "GET";
    a.path = h->q.path;
    a.expires = h->q.expires;
    a.signature = h->q.signature;
  }
  a.user = h->q.username;
  rpc_http_admit(r, &a, fh_ready);
}
