/* log — see log.h.  The level, the file's path and size live in the daemon
 * context (conch.log_*); the destinations' queues and handles here, one
 * object (lg) guarded by one mutex, since a pool thread may log too. */
#include "core/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "core/daemon.h"
#include "core/logfmt.h"
#include "core/pool.h"

#define LOG_ROTATE_BYTES (10u * 1024 * 1024)
#define LOG_NOTE_MAX 512 /* room kept for a "<n> log lines dropped" line */
#define LOG_BACKOFF_MIN_MS 100
#define LOG_BACKOFF_MAX_MS 5000

static const char *const log_lnames[] = {"debug", "info", "warn", "error"};

/* One destination's queue: bytes buf[off, off+len), whole lines. */
typedef struct log_q {
  char *buf;
  size_t cap, off, len;
  unsigned long long pending; /* dropped since the last line through */
  unsigned long long dropped; /* since start */
} log_q;

/* The file, written by one pool job at a time (and rotated by it). */
typedef struct log_fjob {
  pool_job job; /* first */
  char *buf;
  size_t n;
  int fd, newfd;
  size_t bytes;
  char path[512];
} log_fjob;

/* The host stream's connection: one state, changed by stream_to(). */
typedef enum { LS_OFF, LS_WAIT, LS_CONNECTING, LS_UP } ls_state;

static struct {
  uv_mutex_t mu;
  int inited;
  uv_thread_t loop_thread;
  int attached, wake_ok;
  uv_async_t wake; /* another thread queued bytes */
  size_t (*esc)(char *, const char *, size_t);

  /* console */
  int con_fd;    /* -1 until set up */
  int con_ready; /* 1 once set up (or given up) */
  int con_pollable;
  uv_poll_t con_poll;
  int con_poll_inited, con_polling;
  int con_level; /* -1: conch.log_level */
  int con_json;
  log_q con;

  /* file */
  int file_fd;
  int file_retired; /* replaced while a job wrote to it: closed when it ends */
  int file_busy;
  log_fjob fjob;
  log_q file;

  /* host stream */
  ls_state ls;
  int ls_family;
  struct sockaddr_storage ls_addr;
  socklen_t ls_addrlen;
  int ls_fd;
  uv_poll_t *ls_poll; /* one per connection, freed when closed */
  uv_timer_t ls_timer;
  int ls_timer_inited;
  unsigned ls_backoff;
  log_q str;     /* whole lines: a line leaves it once sent whole */
  size_t ls_sent; /* bytes of its first line already sent on this connection */
} lg = {.con_fd = -1, .con_level = -1, .file_fd = -1, .file_retired = -1, .ls_fd = -1};

static void log_kick(void);

void log_set_level(log_level lvl) { conch.log_level = (int)lvl; }

int log_level_parse(const char *s) {
  for (int i = 0; i < 4; i++)
    if (strcmp(s, log_lnames[i]) == 0) return i;
  return -1;
}

static void log_init_once(void) {
  if (lg.inited) return;
  lg.inited = 1;
  if (uv_mutex_init(&lg.mu) != 0) abort();
}

static void log_lock(void) { log_init_once(); uv_mutex_lock(&lg.mu); }
static void log_unlock(void) { uv_mutex_unlock(&lg.mu); }

void log_set_console_level(int lvl) { __atomic_store_n(&lg.con_level, lvl, __ATOMIC_RELAXED); }
void log_set_console_json(int on) {
  log_lock();
  lg.con_json = on;
  log_unlock();
}
void log_set_json_escaper(size_t (*esc)(char *, const char *, size_t)) { lg.esc = esc; }

const char *log_dest_name(log_dest d) {
  static const char *const n[] = {"console", "file", "stream"};
  return d < LOG_NDEST ? n[d] : "?";
}

unsigned long long log_dropped(log_dest d) {
  log_lock();
  unsigned long long v = d == LOG_DEST_CONSOLE ? lg.con.dropped : d == LOG_DEST_FILE ? lg.file.dropped : lg.str.dropped;
  log_unlock();
  return v;
}

/* ---------------------------------------------------------------- queues */

static int q_alloc(log_q *q, size_t cap) {
  if (q->buf) return 0;
  q->buf = malloc(cap + LOG_NOTE_MAX);
  if (!q->buf) return -1;
  q->cap = cap + LOG_NOTE_MAX;
  q->off = q->len = 0;
  return 0;
}

/* Room for n more bytes at the end (moving the queued bytes to the front). */
static char *q_tail(log_q *q, size_t n) {
  if (q->off + q->len + n > q->cap) {
    memmove(q->buf, q->buf + q->off, q->len);
    q->off = 0;
  }
  return q->off + q->len + n <= q->cap ? q->buf + q->off + q->len : NULL;
}

static void q_put(log_q *q, const char *s, size_t n) {
  char *t = q_tail(q, n);
  if (!t) return;
  memcpy(t, s, n);
  q->len += n;
}

static void q_consume(log_q *q, size_t n) {
  q->off += n;
  q->len -= n;
  if (q->len == 0) q->off = 0;
}

/* Drop the oldest whole line. */
static void q_drop_oldest(log_q *q) {
  char *nl = memchr(q->buf + q->off, '\n', q->len);
  size_t n = nl ? (size_t)(nl - (q->buf + q->off)) + 1 : q->len;
  q_consume(q, n);
  q->pending++;
  q->dropped++;
}

/* The "<n> log lines dropped" line in a destination's form. */
static size_t fmt_note(char *out, size_t cap, int json, unsigned long long n) {
  char words[64];
  int wl = snprintf(words, sizeof words, "%llu log lines dropped", n);
  log_rec r = {.lvl = LOG_LVL_WARN, .src = "log.c", .line = __LINE__, .msg = words, .msglen = (size_t)wl};
  gettimeofday(&r.tv, NULL);
  if (!json) return logfmt_text(out, cap, &r);
  char big[LOG_JSON_MAX];
  size_t k = logfmt_json(big, sizeof big, &r, lg.esc);
  if (k == 0 || k > cap) return 0;
  memcpy(out, big, k);
  return k;
}

/* Queue a line whose queue is bounded at limit: the line, preceded by the
 * drop note when lines were dropped before it; or nothing, counted. */
static void q_line(log_q *q, size_t limit, int json, const char *s, size_t n) {
  char note[LOG_NOTE_MAX];
  size_t nn = 0;
  if (q->pending) nn = fmt_note(note, sizeof note, json, q->pending);
  if (q->len + nn + n > limit) {
    q->pending++;
    q->dropped++;
    return;
  }
  if (nn) {
    q_put(q, note, nn);
    q->pending = 0;
  }
  q_put(q, s, n);
}

/* ---------------------------------------------------------------- console */

static void con_flush(void);

static void con_on_poll(uv_poll_t *h, int status, int events) {
  (void)h;
  (void)status;
  (void)events;
  log_lock();
  con_flush();
  log_unlock();
}

/* A descriptor of our own for stderr, non-blocking: /proc/self/fd/2
 * opened again is a new open file description of the same pipe or tty, so
 * O_NONBLOCK stays ours and the processes that share stderr keep theirs
 * blocking.  A regular file is written as it is (it never stalls); a
 * socket cannot be opened again and gets O_NONBLOCK itself.  Without /proc
 * yet (PID 1's first lines) stderr is written directly and this is tried
 * again at the next line. */
static void con_setup(void) {
  struct stat st;
  if (fstat(STDERR_FILENO, &st) != 0) {
    lg.con_ready = 1;
    return;
  }
  if (S_ISREG(st.st_mode)) {
    lg.con_fd = STDERR_FILENO;
    lg.con_ready = 1;
    return;
  }
  int fd = open("/proc/self/fd/2", O_WRONLY | O_NOCTTY | O_CLOEXEC | O_NONBLOCK | O_APPEND);
  if (fd < 0 && errno == ENOENT) return; /* no /proc yet */
  if (fd < 0) {
    int fl = fcntl(STDERR_FILENO, F_GETFL);
    if (fl >= 0) fcntl(STDERR_FILENO, F_SETFL, fl | O_NONBLOCK);
    fd = STDERR_FILENO;
  }
  if (fd != STDERR_FILENO) { /* out of the low numbers, which callers reason about (a closed one stays free) */
    int high = fcntl(fd, F_DUPFD_CLOEXEC, 64);
    if (high >= 0) {
      close(fd);
      fd = high;
    }
  }
  lg.con_fd = fd;
  lg.con_pollable = 1;
  lg.con_ready = 1;
}

static int on_loop_thread(void) {
  if (!lg.attached) return 0;
  uv_thread_t self = uv_thread_self();
  return uv_thread_equal(&self, &lg.loop_thread);
}

static void con_flush(void) {
  while (lg.con.len) {
    ssize_t w = write(lg.con_fd, lg.con.buf + lg.con.off, lg.con.len);
    if (w > 0) {
      q_consume(&lg.con, (size_t)w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    /* the console is gone (EPIPE, EIO): what was queued is lost, counted */
    for (size_t i = 0; i < lg.con.len; i++)
      if (lg.con.buf[lg.con.off + i] == '\n') lg.con.dropped++;
    q_consume(&lg.con, lg.con.len);
  }
  int want = lg.con.len > 0;
  if (want == lg.con_polling || !lg.con_pollable || !on_loop_thread()) return;
  if (!lg.con_poll_inited) {
    if (uv_poll_init(conch.loop, &lg.con_poll, lg.con_fd) != 0) {
      lg.con_pollable = 0; /* not pollable: retried at each line */
      return;
    }
    lg.con_poll_inited = 1;
  }
  if (want) uv_poll_start(&lg.con_poll, UV_WRITABLE, con_on_poll);
  else uv_poll_stop(&lg.con_poll);
  lg.con_polling = want;
}

static void con_line(const char *s, size_t n) {
  if (!lg.con_ready) con_setup();
  if (!lg.con_ready) { /* PID 1 before /proc: the boot's first lines, written as they come */
    ssize_t w = write(STDERR_FILENO, s, n);
    (void)w;
    return;
  }
  if (lg.con_fd < 0 || q_alloc(&lg.con, LOG_QUEUE_MAX) != 0) return;
  q_line(&lg.con, LOG_QUEUE_MAX, lg.con_json, s, n);
  if (!lg.con_polling) con_flush();
}

/* ---------------------------------------------------------------- file */

/* Pool thread: write the batch, rotate past LOG_ROTATE_BYTES (rename to
 * <dir>/<YYYYMMDD-HHMMSS>.log.<n>, open the path anew). */
static void file_work(pool_job *j) {
  log_fjob *f = (log_fjob *)j;
  size_t done = 0;
  while (done < f->n) {
    ssize_t w = write(f->fd, f->buf + done, f->n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) break;
    done += (size_t)w;
  }
  f->bytes += done;
  if (f->bytes < LOG_ROTATE_BYTES || !f->path[0]) return;
  char dir[512], stamp[32], dst[600];
  snprintf(dir, sizeof dir, "%s", f->path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  else snprintf(dir, sizeof dir, ".");
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  for (int n = 1; n < 1000; n++) {
    snprintf(dst, sizeof dst, "%s/%s.log.%d", dir, stamp, n);
    if (access(dst, F_OK) != 0) break;
  }
  if (rename(f->path, dst) != 0) return; /* keep appending to the old one */
  f->newfd = open(f->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (f->newfd >= 0) f->bytes = 0;
}

static void file_kick(void);

static void file_done(pool_job *j, int canceled) {
  (void)canceled;
  log_fjob *f = (log_fjob *)j;
  log_lock();
  if (f->newfd >= 0) {
    if (lg.file_fd == f->fd) {
      lg.file_fd = f->newfd;
      close(f->fd);
    } else {
      close(f->newfd); /* the file was replaced meanwhile */
    }
  }
  if (lg.file_retired == f->fd) {
    close(lg.file_retired);
    lg.file_retired = -1;
  }
  if (lg.file_fd == f->fd || lg.file_fd == f->newfd) conch.log_file_bytes = f->bytes;
  lg.file_busy = 0;
  file_kick();
  log_unlock();
}

/* Hand the queued bytes to a pool job (one at a time; loop thread). */
static void file_kick(void) {
  if (lg.file_busy || !lg.file.len || lg.file_fd < 0 || !on_loop_thread()) return;
  log_fjob *f = &lg.fjob;
  if (!f->buf && !(f->buf = malloc(LOG_QUEUE_MAX + LOG_NOTE_MAX))) return;
  memcpy(f->buf, lg.file.buf + lg.file.off, lg.file.len);
  f->n = lg.file.len;
  q_consume(&lg.file, lg.file.len);
  f->fd = lg.file_fd;
  f->newfd = -1;
  f->bytes = conch.log_file_bytes;
  snprintf(f->path, sizeof f->path, "%s", conch.log_path);
  lg.file_busy = 1;
  pool_submit(&f->job, file_work, file_done);
}

static void file_line(const char *s, size_t n) {
  if (lg.file_fd < 0 || q_alloc(&lg.file, LOG_QUEUE_MAX) != 0) return;
  q_line(&lg.file, LOG_QUEUE_MAX, 0, s, n);
  if (!conch.loop) { /* no loop (unit tests): written at once */
    ssize_t w = write(lg.file_fd, lg.file.buf + lg.file.off, lg.file.len);
    (void)w;
    q_consume(&lg.file, lg.file.len);
    return;
  }
  file_kick();
}

/* Replace the file's descriptor; the one a job still writes to is closed
 * when the job ends. */
static void file_set(int fd, const char *path) {
  log_lock();
  int old = lg.file_fd;
  if (old >= 0) {
    if (lg.file_busy && lg.fjob.fd == old && lg.file_retired < 0) lg.file_retired = old;
    else close(old);
  }
  lg.file_fd = fd;
  struct stat st;
  conch.log_file_bytes = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  snprintf(conch.log_path, sizeof conch.log_path, "%s", path);
  log_unlock();
}

/* Make fd the agent's own: a regular file with one name, root's (when we
 * are root), mode 0600 — an older file was 0644, and its lines name other
 * users' commands.  0 or -errno. */
static int file_own(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode) || st.st_nlink != 1) return -EPERM;
  if (geteuid() == 0 && (st.st_uid != 0 || st.st_gid != 0) && fchown(fd, 0, 0) != 0) return -errno;
  if (fchmod(fd, 0600) != 0) return -errno;
  return 0;
}

int log_open_file(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK, 0600);
  if (fd < 0) return -errno;
  int e = file_own(fd);
  if (e == 0 && fcntl(fd, F_SETFL, O_APPEND) != 0) e = -errno; /* O_NONBLOCK was for opening only */
  if (e != 0) {
    close(fd);
    return e;
  }
  file_set(fd, path);
  return 0;
}

int log_adopt_file(int fd, const char *path) {
  int e = file_own(fd);
  if (e != 0) {
    close(fd);
    return e;
  }
  file_set(fd, path);
  return 0;
}

int log_file_fd(void) { return lg.file_fd; }

/* ---------------------------------------------------------------- host stream */

static void stream_connect(void);
static void stream_on_poll(uv_poll_t *h, int status, int events);
static void stream_flush(void);

static void stream_poll_closed(uv_handle_t *h) { free(h); }

/* The one place the stream's state changes. */
static void stream_to(ls_state to) {
  ls_state from = lg.ls;
  int ok = 1; /* OFF and WAIT from anywhere (a failed attempt waits again) */
  if (to == LS_CONNECTING) ok = from == LS_OFF || from == LS_WAIT;
  if (to == LS_UP) ok = from == LS_CONNECTING;
  if (!ok) abort();
  if ((from == LS_CONNECTING || from == LS_UP) && to != LS_UP) {
    if (lg.ls_poll) uv_close((uv_handle_t *)lg.ls_poll, stream_poll_closed);
    lg.ls_poll = NULL;
    close(lg.ls_fd);
    lg.ls_fd = -1;
  }
  if (to != LS_UP) lg.ls_sent = 0; /* a partly sent line is sent again whole on the next connection */
  if (to == LS_OFF && lg.ls_timer_inited) uv_timer_stop(&lg.ls_timer);
  lg.ls = to;
}

static void stream_on_timer(uv_timer_t *t) {
  (void)t;
  log_lock();
  if (lg.ls == LS_WAIT) stream_connect();
  log_unlock();
}

static void stream_wait(void) {
  stream_to(LS_WAIT);
  if (!lg.ls_timer_inited) {
    uv_timer_init(conch.loop, &lg.ls_timer);
    uv_unref((uv_handle_t *)&lg.ls_timer);
    lg.ls_timer_inited = 1;
  }
  unsigned ms = lg.ls_backoff ? lg.ls_backoff : LOG_BACKOFF_MIN_MS;
  lg.ls_backoff = ms * 2 > LOG_BACKOFF_MAX_MS ? LOG_BACKOFF_MAX_MS : ms * 2;
  uv_timer_start(&lg.ls_timer, stream_on_timer, ms, 0);
}

static void stream_poll_set(void) {
  if (!lg.ls_poll) return;
  int ev = UV_DISCONNECT;
  if (lg.ls == LS_CONNECTING || lg.str.len > lg.ls_sent) ev |= UV_WRITABLE;
  if (lg.ls == LS_UP) ev |= UV_READABLE;
  uv_poll_start(lg.ls_poll, ev, stream_on_poll);
}

/* Connected: the lines dropped while nobody listened are announced first. */
static void stream_up(void) {
  stream_to(LS_UP);
  lg.ls_backoff = 0;
  if (lg.str.pending) {
    char note[LOG_NOTE_MAX];
    size_t nn = fmt_note(note, sizeof note, 1, lg.str.pending);
    if (nn && lg.str.off + (lg.str.cap - lg.str.off - lg.str.len) >= nn) {
      memmove(lg.str.buf + nn, lg.str.buf + lg.str.off, lg.str.len);
      memcpy(lg.str.buf, note, nn);
      lg.str.off = 0;
      lg.str.len += nn;
      lg.str.pending = 0;
    }
  }
  stream_flush();
}

static void stream_connect(void) {
  int fd = socket(lg.ls_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    stream_wait();
    return;
  }
  int r = connect(fd, (struct sockaddr *)&lg.ls_addr, lg.ls_addrlen);
  if (r != 0 && errno != EINPROGRESS && errno != EAGAIN) {
    close(fd);
    stream_wait();
    return;
  }
  uv_poll_t *p = malloc(sizeof *p);
  if (!p || uv_poll_init_socket(conch.loop, p, fd) != 0) {
    free(p);
    close(fd);
    stream_wait();
    return;
  }
  uv_unref((uv_handle_t *)p);
  lg.ls_fd = fd;
  lg.ls_poll = p;
  stream_to(LS_CONNECTING);
  if (r == 0) stream_up();
  else stream_poll_set();
}

static void stream_flush(void) {
  while (lg.ls == LS_UP && lg.str.len > lg.ls_sent) {
    ssize_t w = send(lg.ls_fd, lg.str.buf + lg.str.off + lg.ls_sent, lg.str.len - lg.ls_sent, MSG_NOSIGNAL);
    if (w > 0) {
      lg.ls_sent += (size_t)w;
      const char *nl = memrchr(lg.str.buf + lg.str.off, '\n', lg.ls_sent);
      if (nl) {
        size_t whole = (size_t)(nl - (lg.str.buf + lg.str.off)) + 1;
        q_consume(&lg.str, whole);
        lg.ls_sent -= whole;
      }
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EAGAIN) break;
    stream_wait(); /* the host went away */
    return;
  }
  stream_poll_set();
}

static void stream_on_poll(uv_poll_t *h, int status, int events) {
  (void)h;
  log_lock();
  if (lg.ls == LS_CONNECTING) {
    int err = 0;
    socklen_t el = sizeof err;
    if (status < 0 || getsockopt(lg.ls_fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0 || err) stream_wait();
    else if (events & (UV_WRITABLE | UV_DISCONNECT)) stream_up();
    log_unlock();
    return;
  }
  if (lg.ls != LS_UP) {
    log_unlock();
    return;
  }
  int gone = status < 0 || (events & UV_DISCONNECT);
  if (!gone && (events & UV_READABLE)) { /* the host sends nothing: read means EOF or noise */
    char junk[512];
    ssize_t r = recv(lg.ls_fd, junk, sizeof junk, 0);
    gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR);
  }
  if (gone) {
    stream_wait();
  } else {
    stream_flush();
  }
  log_unlock();
}

static void stream_line(const char *s, size_t n) {
  if (lg.ls == LS_OFF || q_alloc(&lg.str, LOG_STREAM_KEEP) != 0) return;
  if (lg.ls == LS_UP) {
    q_line(&lg.str, LOG_QUEUE_MAX > lg.str.len ? LOG_QUEUE_MAX : lg.str.len, 1, s, n);
    if (on_loop_thread()) stream_flush();
    return;
  }
  if (n > LOG_STREAM_KEEP) return;
  while (lg.str.len + n > LOG_STREAM_KEEP) q_drop_oldest(&lg.str);
  q_put(&lg.str, s, n);
}

int log_stream_set(const char *spec) {
  struct sockaddr_storage ss;
  memset(&ss, 0, sizeof ss);
  socklen_t len = 0;
  int family = 0;
  if (spec && *spec) {
    char *end;
    if (strncmp(spec, "vsock:", 6) == 0) {
      struct sockaddr_vm *vm = (struct sockaddr_vm *)&ss;
      errno = 0;
      unsigned long cid = strtoul(spec + 6, &end, 10);
      if (end == spec + 6 || *end != ':' || errno || cid > 0xffffffffUL) return -EINVAL;
      const char *ps = end + 1;
      unsigned long port = strtoul(ps, &end, 10);
      if (end == ps || *end || errno || port == 0 || port > 0xffffffffUL) return -EINVAL;
      vm->svm_family = AF_VSOCK;
      vm->svm_cid = (unsigned)cid;
      vm->svm_port = (unsigned)port;
      family = AF_VSOCK;
      len = sizeof *vm;
    } else if (strncmp(spec, "unix:", 5) == 0) {
      struct sockaddr_un *un = (struct sockaddr_un *)&ss;
      size_t pl = strlen(spec + 5);
      if (pl == 0 || pl >= sizeof un->sun_path) return -EINVAL;
      un->sun_family = AF_UNIX;
      memcpy(un->sun_path, spec + 5, pl);
      family = AF_UNIX;
      len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pl + 1);
    } else if (strncmp(spec, "tcp:", 4) == 0) {
      const char *h = spec + 4, *colon = strrchr(h, ':');
      if (!colon) return -EINVAL;
      char host[64];
      size_t hl = (size_t)(colon - h);
      if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') h++, hl -= 2;
      if (hl == 0 || hl >= sizeof host) return -EINVAL;
      memcpy(host, h, hl);
      host[hl] = 0;
      errno = 0;
      unsigned long port = strtoul(colon + 1, &end, 10);
      if (end == colon + 1 || *end || errno || port == 0 || port > 65535) return -EINVAL;
      struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
      if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        len = sizeof *in4;
      } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        len = sizeof *in6;
      } else {
        return -EINVAL;
      }
    } else {
      return -EINVAL;
    }
  }
  log_lock();
  if (lg.ls != LS_OFF) stream_to(LS_OFF);
  lg.ls_backoff = 0;
  if (family && conch.loop) {
    lg.ls_family = family;
    memcpy(&lg.ls_addr, &ss, sizeof ss);
    lg.ls_addrlen = len;
    stream_connect();
  }
  log_unlock();
  return 0;
}

/* ---------------------------------------------------------------- writing */

/* Loop thread: what other threads queued gets written. */
static void log_on_wake(uv_async_t *a) {
  (void)a;
  log_lock();
  if (lg.con_fd >= 0 && !lg.con_polling) con_flush();
  file_kick();
  if (lg.ls == LS_UP) stream_flush();
  log_unlock();
}

/* Bind to the loop (first line once conch.loop exists: the loop thread's). */
static void log_attach(void) {
  lg.attached = 1;
  lg.loop_thread = uv_thread_self();
  if (uv_async_init(conch.loop, &lg.wake, log_on_wake) == 0) {
    uv_unref((uv_handle_t *)&lg.wake);
    lg.wake_ok = 1;
  }
}

static void log_kick(void) {
  if (lg.wake_ok) uv_async_send(&lg.wake);
}

void log_vwrite(log_level lvl, const char *file, int line, const char *fmt, va_list ap) {
  int cl = __atomic_load_n(&lg.con_level, __ATOMIC_RELAXED);
  int con_min = cl >= 0 ? cl : conch.log_level;
  int to_con = (int)lvl >= con_min, to_rest = (int)lvl >= conch.log_level;
  if (!to_con && !to_rest) return;
  char msg[LOG_LINE_MAX];
  va_list ap2;
  va_copy(ap2, ap);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  if (m < 0) {
    va_end(ap2);
    return;
  }
  size_t ml = (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
  for (size_t i = 0; i < ml; i++) /* one line: newlines inside a message become spaces */
    if (msg[i] == '\n' || msg[i] == '\r') msg[i] = ' ';
  const char *base = strrchr(file, '/');
  log_rec r = {.lvl = lvl, .src = base ? base + 1 : file, .line = line, .msg = msg, .msglen = ml};
  gettimeofday(&r.tv, NULL);
  char text[LOG_LINE_MAX + 400];
  size_t tn = 0, jn = 0;
  char *json = NULL;
  log_lock();
  if (conch.loop && !lg.attached) log_attach();
  int want_json = lg.esc && ((to_con && lg.con_json) || (to_rest && lg.ls != LS_OFF));
  size_t kv[LOG_KV_MAX];
  if (want_json && (json = malloc(LOG_JSON_MAX))) {
    r.kv = kv;
    r.nkv = logfmt_kv_find(fmt, ap2, msg, ml, kv);
    jn = logfmt_json(json, LOG_JSON_MAX, &r, lg.esc);
  }
  if ((to_con && !lg.con_json) || (to_rest && lg.file_fd >= 0)) tn = logfmt_text(text, sizeof text, &r);
  if (to_con) {
    if (lg.con_json && jn) con_line(json, jn);
    else if (!lg.con_json) con_line(text, tn);
  }
  if (to_rest && tn) file_line(text, tn);
  if (to_rest && jn) stream_line(json, jn);
  if (!on_loop_thread()) log_kick();
  log_unlock();
  va_end(ap2);
  free(json);
}

void log_write(log_level lvl, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(lvl, file, line, fmt, ap);
  va_end(ap);
}
