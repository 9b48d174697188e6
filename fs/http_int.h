/* fs/http_int — internal to fs/http*.c (/files over plain HTTP): the
 * request's state and what the three files share.  http.c: admission,
 * answers, lifecycle; http_get.c: GET/HEAD; http_put.c: PUT/POST raw and
 * multipart. */
#ifndef CONCH_FS_HTTP_INT_H
#define CONCH_FS_HTTP_INT_H

#include <stdatomic.h>
#include <stdint.h>
#include <sys/stat.h>
#include <uv.h>

#include "fs/atomic.h"
#include "fs/multipart.h"
#include "fs/query.h"
#include "fs/status.h"
#include "proto/gzip.h"
#include "server/rpc.h"

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

typedef struct fs_http fs_http;
struct fs_http {
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
  uint8_t *results; /* ",{"path":…,"size":…}" entries (in the memory budget, in held) */
  size_t rlen, rcap;
};

#define FH_NCORS 2
extern const rpc_http_hdr fh_cors[FH_NCORS];

/* The one step of h->phase (core/lifecycle.h checks it). */
void fh_to(fs_http *h, fh_phase to);
void fh_destroy(fs_http *h);
void fh_done(fs_http *h);
void fh_answer(fs_http *h, int status, const char *body, const rpc_http_hdr *extra, size_t nextra);
void fh_error_x(fs_http *h, int status, rpc_code code, const char *msg, const rpc_http_hdr *extra,
                       size_t nextra);
void fh_error(fs_http *h, rpc_code code, const char *msg);
void fh_error_st(fs_http *h);
void fh_keep_spare(fs_http *h);
/* A pool job as the request's user; 0, or -1 (not queued: the caller answers). */
int fh_submit(fs_http *h, void (*run)(void *), void (*done)(void *, int));
void fh_get_opened(void *data, int canceled);
void fh_open_run(void *data);
void fh_pump(fs_http *h);
void fh_put_open_run(void *data);
void fh_put_done(void *data, int canceled);
void fh_put_dispose(fs_http *h);
void fh_on_body(rpc_http *r, const uint8_t *d, size_t n);
void fh_on_body_end(rpc_http *r);
uint8_t *fh_body_into(rpc_http *r, size_t *len);
void fh_mp_pump(fs_http *h);

#endif
