/* fs/http_get — GET and HEAD /files: see http.c. */
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

/* ---------------------------------------------------------------- GET */

static void fh_on_poll(uv_poll_t *p, int status, int events);

void fh_open_run(void *data) {
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
    /* a kernel file, or one that says 0 bytes (FUSE), is read until EOF */
    h->sized = S_ISREG(h->sb.st_mode) && h->sb.st_size > 0 && !fs_pseudo_fs(fd);
  }
}

void fh_get_opened(void *data, int canceled) {
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
  fh_to(h, FH_SEND);
  /* only FIFOs, sockets and character devices are polled and read on the
   * loop; every regular file (kernel ones too: /proc/kmsg) is read in the pool */
  if (!S_ISREG(sb->st_mode) && !S_ISBLK(sb->st_mode) && uv_poll_init(fs_loop, &h->poll, h->fd) == 0) {
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
void fh_pump(fs_http *h) {
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

