/* fs/download — GetFileStream (api.md §7).
 *
 * Validate; open + fstat in the thread pool (missing → not_found
 * "file not found: <p>", directory → invalid_argument
 * "path is a directory: <p>", else the OS error "open file <p>: …").
 *
 * Regular files and block devices: each pool read fills a 1 MiB chunk (or
 * stops at EOF), so a file of 1 MiB + 4 bytes gives exactly 2 chunks and an
 * empty file none.  Each read waits until the transport has room
 * for its chunk (rpc_out_room): the previous chunk has left for the socket
 * (HTTP/2: into the peer's flow-control window) and the connection's queue
 * is about empty — so a client that stops reading, or holds its window at
 * 0, costs about one chunk per connection, however many streams it opens
 * (and nothing is read while half the daemon-wide budget is held).
 * Disk and network still overlap through the kernel's socket buffer.
 *
 * A regular file smaller than the size it had at open, or at the last
 * chunk's fstat, is "file changed during download: <p>" (data_loss), in
 * both codecs.
 *
 * The chunk is read into its own buffer with its framing room in front
 * and sent from there (no copy on the loop).  Mapping the file instead
 * (one copy less) was slower: every window's pages, mapped and unmapped
 * again, cost more than the copy they save (docs/internals/profile.md,
 * GetFileStream).
 *
 * Special files (FIFOs, character devices) stream until EOF: the fd is
 * non-blocking and watched with uv_poll; each readiness gives one read
 * (≤ 1 MiB) → one chunk.  A FIFO without a writer yet simply waits for
 * one.  Devices that cannot be polled (/dev/zero) are read in the pool.
 *
 * With the JSON codec each chunk is also encoded in the pool (base64 of
 * 1 MiB: milliseconds, far more under ASan), after the read, or after the
 * loop's non-blocking read of a special file: encoding on the loop let 200
 * downloads hold /health for seconds.
 *
 * Only the first chunk carries filepath.  on_cancel stops everything; the
 * fd is closed and the state freed once no pool work or handle is active.
 */
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>
#include <uv.h>

#include "core/log.h"
#include "fs/handlers.h"
#include "proto/agent.pb-c.h"
#include "proto/wire.h"

typedef struct fs_download {
  rpc_call *call; /* NULL once ended (finished or canceled) */
  char *path;
  int fd;
  int pollable;   /* special file watched with uv_poll */
  int poll_init, polling;
  uv_poll_t poll;
  rpc_work *work; /* the pool job while busy */
  int busy;       /* pool work queued/running */
  int sending;    /* inside rpc_send: on_cancel must not free */
  unsigned char *buf; /* the chunk being read; handed to the transport when sent */
  size_t data_off;    /* where file bytes go in buf: room for framing before them */
  size_t cap;     /* file bytes buf has room for */
  size_t n;       /* bytes in buf from the last read */
  int eof;
  int json;       /* the call's codec: chunks are encoded in the pool */
  uint8_t *enc;   /* JSON: the encoded chunk (RPC_HEADROOM in front), from the pool */
  size_t enc_len;
  uint64_t pos;   /* file offset of the next read */
  uint64_t size;  /* sized: its size at open or at the last chunk, else 0 */
  int sized;      /* a regular file whose size means something (dl_pseudo_fs) */
  int sent;       /* chunks sent */
  uint64_t bytes;
  fs_status st;
} fs_download;

static int dl_read_more(fs_download *d);
static void dl_go(fs_download *d);

static void dl_changed(fs_download *d) {
  fs_status_set(&d->st, RPC_DATA_LOSS, "file changed during download: %s", d->path);
}

/* A fresh chunk buffer: [headroom + FileChunk field headers][cap bytes]:
 * 1 MiB, or for a sized file what is left of it and one byte more (its EOF
 * then shows in the same fill) when that is less.  The loop reads size and
 * pos only while no pool job runs. */
static int dl_alloc(fs_download *d) {
  if (d->buf) return 0;
  d->cap = FS_CHUNK_MAX;
  if (d->sized && d->pos <= d->size && d->size - d->pos < FS_CHUNK_MAX)
    d->cap = (size_t)(d->size - d->pos) + 1;
  d->buf = malloc(d->data_off + d->cap);
  return d->buf ? 0 : -1;
}

static void dl_on_poll(uv_poll_t *h, int status, int events);

static void dl_free(fs_download *d) {
  if (d->fd >= 0) close(d->fd);
  free(d->buf);
  free(d->enc);
  free(d->path);
  fs_status_clear(&d->st);
  free(d);
}

/* The fd is closed only once the poll handle is closed. */
static void dl_on_poll_closed(uv_handle_t *h) { dl_free(h->data); }

/* Release everything (the call must already be finished or canceled). */
static void dl_destroy(fs_download *d) {
  if (d->poll_init) {
    uv_close((uv_handle_t *)&d->poll, dl_on_poll_closed);
    return;
  }
  dl_free(d);
}

/* End the call (from the loop, call alive) and release. */
static void dl_finish(fs_download *d, rpc_code code, const char *msg) {
  rpc_call *c = d->call;
  d->call = NULL;
  if (d->polling) uv_poll_stop(&d->poll);
  d->polling = 0;
  rpc_set_user(c, NULL);
  if (code == RPC_OK)
    LOG_DEBUG("download done path=%s bytes=%llu chunks=%d", d->path,
              (unsigned long long)d->bytes, d->sent);
  rpc_finish(c, code, msg);
  if (!d->busy) dl_destroy(d);
}

/* Read until buf is full (cap) or EOF (blocking fd; pool thread). */
static void dl_fill(fs_download *d) {
  d->n = 0;
  while (d->n < d->cap) {
    ssize_t r = read(d->fd, d->buf + d->data_off + d->n, d->cap - d->n);
    if (r < 0) {
      if (errno == EINTR) continue;
      fs_status_os(&d->st, "read file", d->path, errno);
      return;
    }
    if (r == 0) {
      d->eof = 1;
      if (d->pos < d->size) dl_changed(d); /* shrank under us */
      return;
    }
    d->n += (size_t)r;
    d->pos += (uint64_t)r;
  }
}

/* Kernel pseudo filesystems: their sizes promise nothing (a sysfs
 * attribute says 4096 and reads a few bytes), so a short read there is not
 * a file that changed. */
int fs_pseudo_fs(int fd) {
  struct statfs sf;
  if (fstatfs(fd, &sf) != 0) return 1;
  switch ((unsigned long)sf.f_type) {
    case PROC_SUPER_MAGIC: case SYSFS_MAGIC: case DEBUGFS_MAGIC: case TRACEFS_MAGIC:
    case SECURITYFS_MAGIC: case CGROUP_SUPER_MAGIC: case CGROUP2_SUPER_MAGIC:
    case EFIVARFS_MAGIC: case BPF_FS_MAGIC:
      return 1;
    default: return 0;
  }
}

static void dl_open_work(void *data) {
  fs_download *d = data;
  int fd = open(d->path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT || e == ENOTDIR)
      fs_status_set(&d->st, RPC_NOT_FOUND, "file not found: %s", d->path);
    else
      fs_status_os(&d->st, "open file", d->path, e);
    return;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    fs_status_os(&d->st, "stat file", d->path, errno);
    close(fd);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    fs_status_set(&d->st, RPC_INVALID_ARGUMENT, "path is a directory: %s", d->path);
    close(fd);
    return;
  }
  d->fd = fd;
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) {
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    d->sized = S_ISREG(st.st_mode) && st.st_size > 0 && !fs_pseudo_fs(fd);
    if (d->sized) d->size = (uint64_t)st.st_size;
    /* the first chunk is read once the transport has room for it */
  } else {
    d->pollable = 1; /* decided on the loop: uv_poll or pool reads */
  }
}

/* JSON (pool thread): encode the chunk in buf, which is freed.  The loop
 * does not touch d while the job runs (d->sent included). */
static void dl_encode(fs_download *d) {
  Pb__FileChunk ch = PB__FILE_CHUNK__INIT;
  ch.filepath = d->sent == 0 ? d->path : "";
  ch.content.data = d->buf + d->data_off;
  ch.content.len = d->n;
  d->enc = rpc_encode(1, &ch.base, &d->enc_len);
  if (!d->enc) fs_status_set(&d->st, RPC_RESOURCE_EXHAUSTED, "out of memory");
  free(d->buf);
  d->buf = NULL;
}

/* Sized files, before each chunk: smaller than the size last seen, or
 * than what was read of it, is a change (as a read ending short of it is);
 * a file that grew is read to its new size. */
static int dl_check_size(fs_download *d) {
  struct stat st;
  if (fstat(d->fd, &st) != 0) {
    fs_status_os(&d->st, "stat file", d->path, errno);
    return -1;
  }
  if ((uint64_t)st.st_size < (d->size > d->pos ? d->size : d->pos)) {
    dl_changed(d);
    return -1;
  }
  d->size = (uint64_t)st.st_size;
  return 0;
}

/* A chunk that fills half its 1 MiB buffer or less (a pseudo file's, a
 * FIFO's read; a sized file's buffer is already cut to what is left)
 * moves to a buffer of its size: the big one would otherwise stay
 * allocated, though counted by the budget at its content's size, while
 * the chunk waits for the client.  A copy of half a chunk at most. */
static void dl_shrink(fs_download *d) {
  unsigned char *b = malloc(d->data_off + d->n);
  if (!b) return; /* keeps the big one */
  memcpy(b + d->data_off, d->buf + d->data_off, d->n);
  free(d->buf);
  d->buf = b;
}

static void dl_read_work(void *data) {
  fs_download *d = data;
  if (d->sized && dl_check_size(d) != 0) return;
  dl_fill(d);
  if (d->st.code != RPC_OK || d->n == 0) return;
  if (d->json) dl_encode(d);
  else if (d->n + FS_CHUNK_MAX / 2 <= d->cap) dl_shrink(d);
}

static void dl_encode_work(void *data) { dl_encode(data); }

/* The FileChunk fields in front of n content bytes at buf + data_off
 * (filepath in the first chunk only); returns where the message starts. */
static size_t dl_frame(const fs_download *d, unsigned char *buf, size_t n) {
  size_t off = wire_prepend_len(buf, d->data_off, 2, n); /* content */
  if (d->sent == 0) {
    size_t pl = strlen(d->path);
    off -= pl;
    memcpy(buf + off, d->path, pl);
    off = wire_prepend_len(buf, off, 1, pl); /* filepath */
  }
  return off;
}

/* Send what is in buf (which goes with it); 0 ok, -1 failed: d->call NULL
 * when on_cancel ran meanwhile, else the call is still ours.  With the
 * proto codec the FileChunk is framed in place, in front of the data: no
 * copy of the file bytes on the loop. */
static int dl_send(fs_download *d, unsigned char *buf, size_t n) {
  int r;
  d->sending = 1;
  size_t off = dl_frame(d, buf, n);
  r = rpc_send_bytes(d->call, buf, buf + off, d->data_off + n - off);
  d->sending = 0;
  if (r != 0 || !d->call) return -1;
  d->sent++;
  d->bytes += n;
  return 0;
}

/* A chunk the pool encoded (JSON): enc[RPC_HEADROOM, +len), n file bytes.
 * Same contract as dl_send. */
static int dl_send_json(fs_download *d, uint8_t *enc, size_t len, size_t n) {
  d->sending = 1;
  int r = rpc_send_bytes(d->call, enc, enc + RPC_HEADROOM, len);
  d->sending = 0;
  if (r != 0 || !d->call) return -1;
  d->sent++;
  d->bytes += n;
  return 0;
}

/* A send failed: on_cancel ran inside it, or memory ran out. */
static void dl_send_failed(fs_download *d) {
  if (!d->call) { /* canceled: the read in flight's callback, if any, destroys */
    if (!d->busy) dl_destroy(d);
  } else {
    dl_finish(d, RPC_RESOURCE_EXHAUSTED, "out of memory sending file chunk");
  }
}

static void dl_on_room(rpc_call *c) {
  fs_download *d = rpc_user(c);
  if (!d || !d->call || d->busy) return;
  dl_go(d);
}

/* The next chunk, once the transport has room for it (else dl_on_room
 * comes back here): a pool read, or (special files) polling. */
static void dl_go(fs_download *d) {
  /* the room asked is what the next send holds: a JSON chunk is base64 */
  size_t room = d->json ? FS_CHUNK_MAX / 3 * 4 + 4096 : FS_CHUNK_MAX;
  if (!rpc_out_room(d->call, room, dl_on_room)) {
    if (d->polling) {
      uv_poll_stop(&d->poll);
      d->polling = 0;
    }
    return;
  }
  if (d->pollable) {
    if (!d->polling && d->poll_init) {
      d->polling = 1;
      uv_poll_start(&d->poll, UV_READABLE, dl_on_poll);
    }
    return;
  }
  if (dl_read_more(d) != 0) dl_finish(d, RPC_INTERNAL, "queue file read failed");
}

static void dl_after_read(void *data, int canceled) {
  fs_download *d = data;
  d->busy = 0;
  d->work = NULL;
  if (!d->call) { /* canceled meanwhile */
    dl_destroy(d);
    return;
  }
  if (canceled) { /* never ran: no thread could take it */
    dl_finish(d, RPC_INTERNAL, "file read was canceled");
    return;
  }
  if (d->st.code != RPC_OK) {
    dl_finish(d, d->st.code, d->st.msg);
    return;
  }
  int eof = d->eof;
  unsigned char *chunk = d->buf; /* the chunk just read */
  uint8_t *enc = d->enc;         /* JSON: the chunk just encoded */
  size_t n = d->n;
  d->buf = NULL;
  d->enc = NULL;
  d->n = 0;
  int r = 0;
  if (enc) {
    r = dl_send_json(d, enc, d->enc_len, n);
  } else if (n > 0) {
    r = dl_send(d, chunk, n);
    chunk = NULL; /* dl_send took it */
  }
  free(chunk);
  if (r < 0)
    dl_send_failed(d);
  else if (eof)
    dl_finish(d, RPC_OK, NULL);
  else
    dl_go(d); /* the next chunk once this one has left */
}

static int dl_read_more(fs_download *d) {
  if (dl_alloc(d) != 0) return -1;
  d->busy = 1;
  d->work = rpc_work_submit(d->call, dl_read_work, dl_after_read, d);
  if (!d->work) d->busy = 0;
  return d->work ? 0 : -1;
}

/* Poll mode: one non-blocking read per readiness. */
static void dl_on_poll(uv_poll_t *h, int status, int events) {
  fs_download *d = h->data;
  if (!d->call) return;
  if (status < 0) {
    fs_status_os(&d->st, "read file", d->path, -status);
    dl_finish(d, d->st.code, d->st.msg);
    return;
  }
  ssize_t r;
  if (dl_alloc(d) != 0) {
    dl_finish(d, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  do r = read(d->fd, d->buf + d->data_off, d->cap);
  while (r < 0 && errno == EINTR);
  if (r < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK) { /* no 1 MiB held while it waits */
      free(d->buf);
      d->buf = NULL;
      return;
    }
    fs_status_os(&d->st, "read file", d->path, errno);
    dl_finish(d, d->st.code, d->st.msg);
    return;
  }
  if (r == 0) {
    dl_finish(d, RPC_OK, NULL);
    return;
  }
  if (d->json) { /* encoded in the pool; dl_after_read sends it and polls on */
    uv_poll_stop(&d->poll);
    d->polling = 0;
    d->n = (size_t)r;
    d->busy = 1;
    if (!(d->work = rpc_work_submit(d->call, dl_encode_work, dl_after_read, d))) {
      d->busy = 0;
      dl_finish(d, RPC_INTERNAL, "queue chunk encoding failed");
    }
    return;
  }
  d->n = (size_t)r;
  if (d->n + FS_CHUNK_MAX / 2 <= d->cap) dl_shrink(d); /* a pipe's read: its capacity at most */
  unsigned char *chunk = d->buf;
  d->buf = NULL;
  d->n = 0;
  if (dl_send(d, chunk, (size_t)r) < 0) {
    dl_send_failed(d);
    return;
  }
  dl_go(d); /* polling goes on only while the transport has room */
}

static void dl_after_open(void *data, int canceled) {
  fs_download *d = data;
  d->busy = 0;
  d->work = NULL;
  if (!d->call) {
    dl_destroy(d);
    return;
  }
  if (canceled || d->st.code != RPC_OK) {
    if (canceled) fs_status_set(&d->st, RPC_INTERNAL, "file open was canceled");
    dl_finish(d, d->st.code, d->st.msg);
    return;
  }
  if (d->pollable) {
    if (uv_poll_init(fs_loop, &d->poll, d->fd) == 0) {
      d->poll_init = 1;
      d->poll.data = d;
    } else {
      /* Not pollable (e.g. /dev/zero): blocking reads in the pool. */
      d->pollable = 0;
      int fl = fcntl(d->fd, F_GETFL);
      if (fl >= 0) fcntl(d->fd, F_SETFL, fl & ~O_NONBLOCK);
    }
  }
  if (d->sized && d->size > FS_CHUNK_MAX) rpc_bulk(d->call); /* a file of more than a chunk */
  dl_go(d);
}

void fs_download_on_request(rpc_call *c, const ProtobufCMessage *msg) {
  const Pb__GetFileRequest *req = (const Pb__GetFileRequest *)msg;
  char err[160];
  if (fs_check_call_path(c, req->filepath, "stream file retrieval", err, sizeof err) < 0) {
    rpc_finish(c, RPC_INVALID_ARGUMENT, err);
    return;
  }
  fs_download *d = calloc(1, sizeof *d);
  if (d) {
    d->fd = -1;
    d->path = strdup(req->filepath);
    /* headroom + field 1 (tag, varint, path) + field 2 (tag, 3-byte varint) */
    if (d->path) d->data_off = RPC_HEADROOM + 1 + 10 + strlen(d->path) + 1 + 3;
    d->json = rpc_is_json(c);
  }
  if (!d || !d->path) {
    if (d) free(d->path);
    free(d);
    rpc_finish(c, RPC_RESOURCE_EXHAUSTED, "out of memory");
    return;
  }
  d->call = c;
  d->busy = 1;
  rpc_set_user(c, d);
  if (!(d->work = rpc_work_submit(c, dl_open_work, dl_after_open, d))) {
    d->busy = 0;
    dl_finish(d, RPC_INTERNAL, "queue file open failed");
  }
}

void fs_download_on_cancel(rpc_call *c, rpc_code why) {
  fs_download *d = rpc_user(c);
  if (!d) return;
  LOG_DEBUG("download canceled path=%s why=%s sent=%d", d->path, rpc_code_name(why), d->sent);
  d->call = NULL;
  if (d->polling) uv_poll_stop(&d->poll);
  d->polling = 0;
  if (d->busy) {
    rpc_work_cancel(d->work); /* its done callback destroys, canceled or not */
    return;
  }
  if (d->sending) return; /* dl_send's caller destroys */
  dl_destroy(d);
}
