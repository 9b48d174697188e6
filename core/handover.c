/* handover — an upgrade in place, both sides of the exec; see handover.h.
 *
 * Trade-offs, briefly:
 * - It waits for the parts' work in flight (a clone in a pool thread must
 *   not vanish with the exec), at most HANDOVER_DRAIN_MS; what is still
 *   out then is not carried.
 * - Only descriptors the state names lose close-on-exec, just before the
 *   exec (and get it back if the exec fails), so nothing else leaks into
 *   the new program; the new program sets it again on each only once the
 *   whole state was restored, so a rollback finds them all open.
 * - The state is one protobuf message handled through its descriptor: the
 *   framework reads and writes only its own four fields, found by name.
 */
#include "core/handover.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"

#define HANDOVER_DRAIN_MS 2000
#define HANDOVER_TICK_MS 1
#define HANDOVER_STATE_MAX (1u << 30) /* what a reader accepts */
#define HANDOVER_PARTS_MAX 8
#define HANDOVER_FDS_MAX 65536

/* One lifecycle, changed only by hs_step (asserts the previous state). */
typedef enum handover_state {
  HS_IDLE,      /* serving */
  HS_DRAINING,  /* frozen, waiting for work in flight */
  HS_SAVING,    /* the state written, the exec under way */
  HS_RESTORING, /* the new program, before it serves */
} handover_state;

static const char *const hs_names[] = {"idle", "draining", "saving", "restoring"};

/* The framework's own fields of the state message. */
typedef struct hs_head {
  uint32_t *format;
  char **version;
  uint64_t *upgrades;
  int32_t *prev_program_fd;
} hs_head;

static struct {
  handover_state state;
  handover_schema schema;
  size_t at_format, at_version, at_upgrades, at_prev; /* offsets in the message */
  int prog_fd;            /* the new program (DRAINING, SAVING) */
  char to[128];
  uv_timer_t tick;
  int tick_init;
  uint64_t began;         /* uv_now at handover_begin */
  int argc;
  char **argv;
  const handover_part *parts[HANDOVER_PARTS_MAX];
  size_t nparts;
  unsigned char abandoned[HANDOVER_PARTS_MAX]; /* the new program: that part gave up (no rollback) */
  int *fds;               /* the descriptors the state names */
  size_t nfds, capfds;
  /* the new program, between handover_load and handover_finish */
  int state_fd, rollback;
  int token_fd; /* --token-fd: the token in a memfd, for a program that cannot read the state */
  ProtobufCMessage *loaded;
} H = {.prog_fd = -1, .state_fd = -1, .token_fd = -1};

#ifdef NDEBUG
const int handover_asserts = 0;
#else
const int handover_asserts = 1;
#endif

static void hs_step(handover_state from, handover_state to) {
  if (H.state != from) {
    LOG_ERROR("handover: transition %s -> %s from state %s refused", hs_names[from], hs_names[to],
              hs_names[H.state]);
    assert(!"illegal handover transition");
    return;
  }
  H.state = to;
}

/* The offset of the schema's field name, which must be a proto3 field of
 * type t without presence (one value, always written when not zero). */
static size_t hs_field_at(const char *name, ProtobufCType t) {
  const ProtobufCFieldDescriptor *f = protobuf_c_message_descriptor_get_field_by_name(H.schema.desc, name);
  if (!f || f->type != t || f->label != PROTOBUF_C_LABEL_NONE) {
    LOG_ERROR("handover: the state message has no field %s of the type the framework needs", name);
    abort(); /* a build that cannot be: tests/unit/test_handover.c */
  }
  return f->offset;
}

static hs_head hs_head_of(ProtobufCMessage *m) {
  char *b = (char *)m;
  return (hs_head){(uint32_t *)(b + H.at_format), (char **)(b + H.at_version), (uint64_t *)(b + H.at_upgrades),
                   (int32_t *)(b + H.at_prev)};
}

void handover_init(const handover_schema *schema, int argc, char **argv) {
  H.schema = *schema;
  H.at_format = hs_field_at("format", PROTOBUF_C_TYPE_UINT32);
  H.at_version = hs_field_at("version", PROTOBUF_C_TYPE_STRING);
  H.at_upgrades = hs_field_at("upgrades", PROTOBUF_C_TYPE_UINT64);
  H.at_prev = hs_field_at("prev_program_fd", PROTOBUF_C_TYPE_INT32);
  H.argc = argc;
  H.argv = argv;
}

int handover_can_read(unsigned n) { return n >= H.schema.format_min && n <= H.schema.format; }
int handover_busy(void) { return H.state != HS_IDLE; }

void handover_add_part(const handover_part *p) {
  if (H.nparts < HANDOVER_PARTS_MAX) H.parts[H.nparts++] = p;
}

void handover_keep_fd(int fd) {
  if (fd <= 2) return;
  if (H.nfds == H.capfds) {
    size_t nc = H.capfds ? H.capfds * 2 : 64;
    int *n = nc <= HANDOVER_FDS_MAX ? realloc(H.fds, nc * sizeof *n) : NULL;
    if (!n) return; /* then it closes with the exec: its owner sees EOF/EBADF */
    H.fds = n;
    H.capfds = nc;
  }
  H.fds[H.nfds++] = fd;
}

static void hs_cloexec_all(int on) {
  for (size_t i = 0; i < H.nfds; i++) {
    int f = fcntl(H.fds[i], F_GETFD);
    if (f >= 0) fcntl(H.fds[i], F_SETFD, on ? (f | FD_CLOEXEC) : (f & ~FD_CLOEXEC));
  }
}

/* Every descriptor the state names: the previous program, then each
 * part's (through handover_keep_fd). */
static void hs_collect_fds(const ProtobufCMessage *st) {
  H.nfds = 0;
  int32_t prev = *hs_head_of((ProtobufCMessage *)st).prev_program_fd;
  if (prev > 0) handover_keep_fd(prev);
  for (size_t i = 0; i < H.nparts; i++)
    if (H.parts[i]->keep_fds && !H.abandoned[i]) H.parts[i]->keep_fds(st); /* (an abandoned one closed its own) */
}

/* argv for the next exec: ours without a previous --handover*, without
 * --token (its value was overwritten in place: a program that cannot read
 * the state would take "xxxx…" for the token) or --token-fd, plus flag fd
 * and, when tokfd >= 0, "--token-fd tokfd" (the current token, for a
 * program that cannot read the state; main.c). */
static char **hs_argv(const char *flag, int fd, char *num, size_t numlen, int tokfd, char *tnum, size_t tnumlen) {
  char **v = calloc((size_t)H.argc + 5, sizeof *v);
  if (!v) return NULL;
  int n = 0;
  for (int i = 0; i < H.argc; i++) {
    if ((strcmp(H.argv[i], "--handover") == 0 || strcmp(H.argv[i], "--handover-rollback") == 0 ||
         strcmp(H.argv[i], "--token") == 0 || strcmp(H.argv[i], "--token-fd") == 0) &&
        i + 1 < H.argc) {
      i++;
      continue;
    }
    if (strncmp(H.argv[i], "--token=", 8) == 0 || strncmp(H.argv[i], "--token-fd=", 11) == 0) continue;
    v[n++] = H.argv[i];
  }
  snprintf(num, numlen, "%d", fd);
  v[n++] = (char *)flag;
  v[n++] = num;
  if (tokfd >= 0) {
    snprintf(tnum, tnumlen, "%d", tokfd);
    v[n++] = "--token-fd";
    v[n++] = tnum;
  }
  v[n] = NULL;
  return v;
}

/* The --token-fd this program was given (a handover's), or -1. */
static int hs_token_fd_arg(void) {
  for (int i = 0; i + 1 < H.argc; i++)
    if (strcmp(H.argv[i], "--token-fd") == 0) {
      char *end;
      long fd = strtol(H.argv[i + 1], &end, 10);
      return *end || fd < 3 || fd > 1 << 20 ? -1 : (int)fd;
    }
  return -1;
}

/* A memfd that held the state or the token: emptied (its pages freed, not
 * left for a later reader of the descriptor), then closed. */
static void hs_close_wiped(int fd) {
  if (fd < 0) return;
  if (ftruncate(fd, 0) != 0) { /* (a memfd always truncates) */
  }
  close(fd);
}

/* ------------------------------------------------------------------ save */

/* The state into a memfd; -1 on failure. */
static int hs_write_state(const ProtobufCMessage *st) {
  size_t len = protobuf_c_message_get_packed_size(st);
  uint8_t *buf = malloc(len ? len : 1);
  if (!buf) return -1;
  protobuf_c_message_pack(st, buf);
  int fd = memfd_create("conch-handover", MFD_CLOEXEC);
  size_t off = 0;
  while (fd >= 0 && off < len) {
    ssize_t w = write(fd, buf + off, len - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      close(fd);
      fd = -1;
      break;
    }
    off += (size_t)w;
  }
  explicit_bzero(buf, len); /* it holds the token */
  free(buf);
  if (fd >= 0) lseek(fd, 0, SEEK_SET);
  return fd;
}

/* The token in a memfd of its own (serve mode): the next program's token
 * should it not read the state.  -1 when there is none to pass. */
static int hs_token_fd(void) {
  if (conch.is_pid1 || !conch.token_set) return -1;
  int fd = memfd_create("conch-token", MFD_CLOEXEC);
  if (fd >= 0 && write(fd, conch.token, conch.token_len) != (ssize_t)conch.token_len) {
    hs_close_wiped(fd);
    return -1;
  }
  return fd;
}

static void hs_fail_resume(const char *why) {
  LOG_ERROR("upgrade abandoned: %s; this program goes on", why);
  if (H.prog_fd >= 0) close(H.prog_fd);
  H.prog_fd = -1;
  for (size_t i = 0; i < H.nparts; i++)
    if (H.parts[i]->drain) H.parts[i]->drain(0);
  hs_step(HS_SAVING, HS_IDLE);
}

static void hs_exec(void) {
  hs_step(HS_DRAINING, HS_SAVING);
  ProtobufCMessage *st = calloc(1, H.schema.desc->sizeof_message);
  if (!st) {
    hs_fail_resume("out of memory");
    return;
  }
  protobuf_c_message_init(H.schema.desc, st);
  hs_head head = hs_head_of(st);
  *head.format = H.schema.format;
#ifndef CONCH_STATIC /* test seams (tests/integration/test_upgrade*.py): a format the next program cannot read; format 1 */
  const char *fault = getenv("CONCH_FAULT");
  if (fault && strcmp(fault, "handover_format") == 0) *head.format = H.schema.format + 1000;
  if (fault && strcmp(fault, "handover_format_1") == 0) *head.format = 1;
#endif
  *head.version = (char *)CONCH_VERSION;
  *head.upgrades = conch.upgrades + 1;
  if (conch.no_upgrade || conch.init_no_upgrade) { /* disabled since the answer (an init message) */
    free(st);
    hs_fail_resume("upgrade is disabled");
    return;
  }
  *head.prev_program_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
#ifndef CONCH_STATIC /* test seam: /proc/self/exe cannot be opened (tests/integration/test_upgrade_state.py) */
  const char *nofault = getenv("CONCH_FAULT");
  if (nofault && strcmp(nofault, "handover_no_exe") == 0 && *head.prev_program_fd >= 0) {
    close(*head.prev_program_fd);
    *head.prev_program_fd = -1;
    errno = EACCES;
  }
#endif
  if (*head.prev_program_fd < 0) { /* no upgrade without a rollback */
    LOG_ERROR("upgrade: cannot open /proc/self/exe: %s", strerror(errno));
    free(st);
    hs_fail_resume("cannot keep this program for a rollback");
    return;
  }
  size_t saved = 0;
  int ok = 1;
  for (; saved < H.nparts && ok; saved++)
    if (H.parts[saved]->save && H.parts[saved]->save(st) != 0) ok = 0;
  int sfd = ok ? hs_write_state(st) : -1, tfd = sfd >= 0 ? hs_token_fd() : -1;
  if (sfd >= 0) {
    hs_collect_fds(st);
    handover_keep_fd(sfd);
    if (tfd >= 0) handover_keep_fd(tfd);
  }
  for (size_t i = 0; i < saved; i++)
    if (H.parts[i]->save_free) H.parts[i]->save_free(st);
  int prev = *head.prev_program_fd;
  uint64_t upgrades = *head.upgrades;
  free(st);
  if (sfd < 0) {
    if (prev >= 0) close(prev);
    hs_fail_resume(ok ? "cannot write the state" : "out of memory saving the state");
    return;
  }
  char num[16], tnum[16];
  char **argv = hs_argv("--handover", sfd, num, sizeof num, tfd, tnum, sizeof tnum);
  LOG_INFO("upgrade: exec of conch-init %s (from %s) state=%d upgrades=%llu after %llu ms of drain",
           H.to, CONCH_VERSION, sfd, (unsigned long long)upgrades, (unsigned long long)(uv_now(conch.loop) - H.began));
  if (argv) {
    hs_cloexec_all(0);
    extern char **environ;
    fexecve(H.prog_fd, argv, environ);
    int e = errno;
    hs_cloexec_all(1);
    errno = e;
  }
  char why[160];
  snprintf(why, sizeof why, "exec of the new program failed: %s", argv ? strerror(errno) : "out of memory");
  free(argv);
  hs_close_wiped(sfd);
  hs_close_wiped(tfd);
  if (prev >= 0) close(prev);
  hs_fail_resume(why);
}

static void hs_on_tick(uv_timer_t *t) {
  uint64_t waited = uv_now(conch.loop) - H.began;
  int busy = 0;
  for (size_t i = 0; i < H.nparts && !busy; i++)
    if (H.parts[i]->busy && H.parts[i]->busy()) busy = 1;
  if (busy && waited < HANDOVER_DRAIN_MS) return;
  if (busy) LOG_WARN("upgrade: work still in flight after %d ms; going on", HANDOVER_DRAIN_MS);
  uv_timer_stop(t);
  hs_exec();
}

int handover_begin(int prog_fd, const char *to_version) {
  if (H.state != HS_IDLE) {
    errno = EBUSY;
    return -1;
  }
  hs_step(HS_IDLE, HS_DRAINING);
  H.prog_fd = prog_fd;
  snprintf(H.to, sizeof H.to, "%s", to_version ? to_version : "");
  H.began = uv_now(conch.loop);
  for (size_t i = 0; i < H.nparts; i++)
    if (H.parts[i]->drain) H.parts[i]->drain(1);
  if (!H.tick_init) {
    uv_timer_init(conch.loop, &H.tick);
    uv_unref((uv_handle_t *)&H.tick);
    H.tick_init = 1;
  }
  /* from the next loop turn: the answer to Upgrade is written first */
  uv_timer_start(&H.tick, hs_on_tick, HANDOVER_TICK_MS, HANDOVER_TICK_MS);
  return 0;
}

/* --------------------------------------------------------------- restore */

int handover_arg(int argc, char **argv, int *rollback) {
  for (int i = 0; i + 1 < argc; i++) {
    int rb = strcmp(argv[i], "--handover-rollback") == 0;
    if (rb || strcmp(argv[i], "--handover") == 0) {
      char *end;
      long fd = strtol(argv[i + 1], &end, 10);
      if (*end || fd < 3 || fd > 1 << 20) return -1;
      if (rollback) *rollback = rb;
      return (int)fd;
    }
  }
  return -1;
}

/* The state could not be restored: the previous program, with the same
 * state.  Returns only when that is impossible (then this program goes on
 * with what it has). */
static void hs_rollback(const char *why) {
  hs_head head = H.loaded ? hs_head_of(H.loaded) : (hs_head){0};
  int prev = H.loaded ? *head.prev_program_fd : -1;
  LOG_ERROR("upgrade: cannot restore the state: %s", why);
  if (H.rollback || prev <= 0 || H.state_fd < 0) {
    LOG_ERROR("upgrade: no rollback possible (%s); serving without the old state",
              H.rollback ? "this is the rollback" : "no previous program");
    return;
  }
  char num[16], tnum[16];
  char **argv = hs_argv("--handover-rollback", H.state_fd, num, sizeof num, H.token_fd, tnum, sizeof tnum);
  lseek(H.state_fd, 0, SEEK_SET);
  LOG_ERROR("upgrade: rolling back to the previous program (conch-init %s)", *head.version);
  extern char **environ;
  if (argv) fexecve(prev, argv, environ);
  LOG_ERROR("upgrade: rollback exec failed: %s", strerror(errno));
  free(argv);
}

/* Part i could not restore (early or late): the previous program takes
 * over (no return), or, when none can, part i gives up what it did not
 * take and the others go on: the program serves what was restored. */
static void hs_part_failed(const ProtobufCMessage *st, size_t i, const char *why) {
  hs_rollback(why);
  LOG_ERROR("upgrade: part %s abandoned: %s", H.parts[i]->name, why);
  H.abandoned[i] = 1;
  if (H.parts[i]->abandon) H.parts[i]->abandon(st);
}

/* No state at all: every descriptor the previous program handed over
 * (none of ours lacks close-on-exec at this point) is closed, so that a
 * fresh start can bind its listeners again; the state is closed. */
static void hs_no_state(void) {
  int max = (int)sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > HANDOVER_FDS_MAX) max = HANDOVER_FDS_MAX;
  int n = 0;
  for (int fd = 3; fd < max; fd++) {
    int f = fcntl(fd, F_GETFD);
    if (f >= 0 && !(f & FD_CLOEXEC)) {
      if (fd == H.state_fd || fd == H.token_fd) hs_close_wiped(fd);
      else close(fd);
      n++;
    }
  }
  H.state_fd = H.token_fd = -1;
  LOG_ERROR("upgrade: no state: a fresh start (%d inherited descriptors closed)", n);
  hs_step(HS_RESTORING, HS_IDLE);
}

static void hs_free_loaded(void) {
  if (!H.loaded) return;
  protobuf_c_message_free_unpacked(H.loaded, NULL); /* (the daemon part wiped its token) */
  H.loaded = NULL;
}

static int hs_read_all(int fd, uint8_t **out, size_t *n) {
  struct stat sb;
  if (fstat(fd, &sb) != 0 || sb.st_size < 0 || (uint64_t)sb.st_size > HANDOVER_STATE_MAX) return -1;
  size_t len = (size_t)sb.st_size, off = 0;
  uint8_t *b = malloc(len ? len : 1);
  if (!b) return -1;
  while (off < len) {
    ssize_t r = pread(fd, b + off, len - off, (off_t)off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      free(b);
      return -1;
    }
    off += (size_t)r;
  }
  *out = b;
  *n = len;
  return 0;
}

int handover_load(int fd, int rollback, char *err, size_t errn) {
  hs_step(HS_IDLE, HS_RESTORING);
  H.state_fd = fd;
  H.rollback = rollback;
  int tfd = hs_token_fd_arg(), tf = tfd >= 0 ? fcntl(tfd, F_GETFD) : -1;
  H.token_fd = tf >= 0 && !(tf & FD_CLOEXEC) ? tfd : -1; /* inherited, not one of ours */
  uint8_t *buf = NULL;
  size_t len = 0;
#ifndef CONCH_STATIC /* test seam: the state cannot be read (tests/integration/test_upgrade_state.py) */
  const char *rfault = getenv("CONCH_FAULT");
  int unreadable = !rollback && rfault && strcmp(rfault, "handover_unreadable") == 0;
#else
  int unreadable = 0;
#endif
  if (unreadable || hs_read_all(fd, &buf, &len) != 0) {
    snprintf(err, errn, "cannot read the state (fd %d)", fd);
    if (!unreadable) hs_rollback(err);
    hs_no_state();
    return -1;
  }
  H.loaded = protobuf_c_message_unpack(H.schema.desc, NULL, len, buf);
  explicit_bzero(buf, len); /* it holds the token */
  free(buf);
  if (!H.loaded) {
    snprintf(err, errn, "the state does not parse");
    hs_rollback(err);
    hs_no_state();
    return -1;
  }
  hs_head head = hs_head_of(H.loaded);
  int readable = handover_can_read(*head.format);
#ifndef CONCH_STATIC
  /* the old program reads back what it wrote itself (the test of a format
   * the new one cannot read rolls back to it) */
  const char *fault = getenv("CONCH_FAULT");
  if (rollback && fault && strcmp(fault, "handover_format") == 0) readable = 1;
#endif
  if (!readable) {
    snprintf(err, errn, "state format %u is not one this program reads (%u to %u)", *head.format,
             H.schema.format_min, H.schema.format);
    hs_rollback(err);
    hs_free_loaded();
    hs_no_state();
    return -1;
  }
  conch.upgrades = *head.upgrades - (rollback && *head.upgrades ? 1 : 0); /* a rollback is no upgrade */
  for (size_t i = 0; i < H.nparts; i++)
    if (H.parts[i]->restore_early && H.parts[i]->restore_early(conch.loop, H.loaded) != 0) {
      snprintf(err, errn, "%s: cannot restore its early state", H.parts[i]->name);
      hs_part_failed(H.loaded, i, err);
    }
  return 0;
}

int handover_finish(char *err, size_t errn) {
  ProtobufCMessage *st = H.loaded;
  if (!st) return -1;
  hs_head head = hs_head_of(st);
  uint64_t now = uv_hrtime() / 1000000u; /* CLOCK_MONOTONIC: the clock the state's times are on */
  for (size_t i = 0; i < H.nparts; i++) /* each on its own: one that fails leaves the others */
    if (!H.abandoned[i] && H.parts[i]->restore && H.parts[i]->restore(st, now, err, errn) != 0) {
      char why[600];
      snprintf(why, sizeof why, "%s: %s", H.parts[i]->name, err);
      hs_part_failed(st, i, why);
    }
#ifndef CONCH_STATIC /* test seam: the rollback path (tests/integration/test_upgrade.py) */
  const char *fault = getenv("CONCH_FAULT");
  if (!H.rollback && fault && strcmp(fault, "handover_restore") == 0) {
    snprintf(err, errn, "CONCH_FAULT=handover_restore");
    hs_rollback(err);
  }
#endif
  /* committed: from here on the state is ours */
  hs_collect_fds(st);
  hs_cloexec_all(1);
  if (*head.prev_program_fd > 0) close(*head.prev_program_fd);
  hs_close_wiped(H.state_fd);
  H.state_fd = -1;
  hs_close_wiped(H.token_fd);
  H.token_fd = -1;
  for (size_t i = 0; i < H.nparts; i++)
    if (H.parts[i]->resume) H.parts[i]->resume(); /* (an abandoned part starts what it took) */
  if (H.rollback)
    LOG_WARN("upgrade rolled back: conch-init %s goes on with its state pid=%d upgrades=%llu", CONCH_VERSION,
             (int)getpid(), conch.upgrades);
  else
    LOG_INFO("upgraded in place: conch-init %s -> %s pid=%d upgrades=%llu (state format %u)", *head.version,
             CONCH_VERSION, (int)getpid(), conch.upgrades, *head.format);
  hs_free_loaded();
  hs_step(HS_RESTORING, HS_IDLE);
  return 0;
}
