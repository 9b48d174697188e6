/* fs/http — /files over plain HTTP (api.md §9 "Files over plain HTTP"):
 * GET/HEAD a file's raw bytes (validators, one range, conditionals),
 * PUT/POST a raw body written whole or not at all (fs/atomic.h),
 * OPTIONS for CORS; the token or a signed URL, and the user, through
 * rpc_http_admit (server/rpc.h).
 *
 * GET: the open and fstat run in the pool as the request's user.  A
 * regular file with a size (more than 0 bytes, not on a pseudo filesystem)
 * is sent from its offset: zero copy where the transport can
 * (rpc_http_write_file), else FH_CHUNK reads in the pool, each after
 * rpc_http_room said the transport and the memory budget have room for it.
 * Other files stream until EOF (chunked): regular files (kernel ones too)
 * and block devices read in the pool; FIFOs and pollable character devices
 * read on the loop when uv_poll says so (a FIFO without a writer waits and
 * blocks nothing); devices that cannot be polled (/dev/zero) read in the
 * pool, until the client leaves.
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

#include "core/lifecycle.h"
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

/* The phases each phase may be entered from. */
static const unsigned fh_legal_from[] = {
    [FH_ADMIT] = 0,
    [FH_OPEN] = 1u << FH_ADMIT,
    [FH_SEND] = 1u << FH_OPEN,
    [FH_RECV] = 1u << FH_OPEN,
    [FH_COMMIT] = 1u << FH_RECV,
    [FH_CLEANUP] = 1u << FH_OPEN | 1u << FH_RECV | 1u << FH_COMMIT,
};
static const char *const fh_phase_names[] = {"admit", "open", "send", "recv", "commit", "cleanup"};

void fh_to(fs_http *h, fh_phase to) {
  if (lifecycle_check("files request", fh_legal_from[to], (int)h->phase, (int)to, fh_phase_names,
                      (int)(sizeof fh_phase_names / sizeof *fh_phase_names)) == 0)
    h->phase = to;
}

const rpc_http_hdr fh_cors[FH_NCORS] = {
    {"access-control-allow-origin", "*"},
    {"access-control-expose-headers", "ETag, Content-Range, Content-Length, Content-Disposition"},
};

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
void fh_destroy(fs_http *h) {
  if (h->poll_init) {
    h->poll_init = 0;
    uv_close((uv_handle_t *)&h->poll, fh_on_poll_closed);
    return;
  }
  fh_free(h);
}

/* ---------------------------------------------------------------- answers */

void fh_done(fs_http *h) {
  rpc_http *r = h->r;
  h->r = NULL;
  if (h->polling) uv_poll_stop(&h->poll);
  h->polling = 0;
  rpc_http_end(r);
}

/* A small whole answer (JSON), then the end of the exchange. */
void fh_answer(fs_http *h, int status, const char *body, const rpc_http_hdr *extra, size_t nextra) {
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

/* {"code":…,"message":…} with Connect's status for the code, and for a
 * multipart upload the files already written ("files":[…]); the exchange
 * ends. */
void fh_error_x(fs_http *h, int status, rpc_code code, const char *msg, const rpc_http_hdr *extra,
                       size_t nextra) {
  if (!msg) msg = "out of memory";
  if (!status) status = rpc_code_http_status(code);
  size_t ml = strlen(msg), fl = h->mp ? h->rlen : 0;
  char *body = malloc(TEXT_JSON_MAX(ml) + 64 + fl);
  if (!body) {
    fh_answer(h, 500, "", NULL, 0);
    return;
  }
  int k = sprintf(body, "{\"code\":\"%s\",\"message\":", rpc_code_name(code));
  k += (int)text_json_string(body + k, msg, ml);
  if (fl) k += sprintf(body + k, ",\"files\":[%.*s]", (int)fl, (const char *)h->results);
  strcpy(body + k, "}");
  LOG_DEBUG("files %s %s: %d %s", rpc_http_method(h->r), h->q.path ? h->q.path : "-", status, msg);
  fh_answer(h, status, body, extra, nextra);
  free(body);
}

void fh_error(fs_http *h, rpc_code code, const char *msg) { fh_error_x(h, 0, code, msg, NULL, 0); }

/* The error in h->st; out of space (ENOSPC) is 507 (api.md). */
void fh_error_st(fs_http *h) {
  if (h->st.err == ENOSPC)
    fh_error_x(h, 507, RPC_RESOURCE_EXHAUSTED, "no space left on device", NULL, 0);
  else
    fh_error(h, h->st.code, h->st.msg);
}

/* The buffer the pool wrote is kept for the next fill. */
void fh_keep_spare(fs_http *h) {
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

/* A pool job as the request's user; 0, or -1 (not queued: the caller answers). */
int fh_submit(fs_http *h, void (*run)(void *), void (*done)(void *, int)) {
  h->busy = 1;
  if (rpc_work_submit_as(h->id, run, done, h) == NULL) {
    h->busy = 0;
    return -1;
  }
  return 0;
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
  fh_to(h, FH_OPEN);
  if (h->mp) {
    fh_to(h, FH_RECV);
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
  if (h->mp && h->q.signature && !rpc_http_header(r, "conch-init-token")) { /* a signature names one file: never a directory of them */
    fh_error(h, RPC_PERMISSION_DENIED, "a signed URL uploads one file: multipart/form-data needs the token");
    fh_destroy(h);
    return;
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
