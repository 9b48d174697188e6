/* rtfloor — the floor under a StartProcess round trip (docs/internals/profile.md):
 * the agent's structure with nothing else in it, put side by side with the
 * agent and with posix_spawn+waitpid (tests/bench/spawn.c) by floor.sh.
 *
 *   rtfloor [-m pool|loop|direct] [-1] [-c CGDIR] [-n N] [-w W] [-G GAP_MS] [-o FILE] [PROGRAM]
 *
 * The child is made by the agent's own proc_spawn (proc/spawn.c, linked from
 * build/dev/libconch.a): pipes for stdin/stdout/stderr, clone(CLONE_VM|
 * CLONE_VFORK), signals to default, its own process group, execve.
 *   -m direct  the client spawns and waits itself (waitpid; the pipes closed
 *              after it): proc_spawn's cost against posix_spawn's;
 *   -m pool    a client (this process) and a server (a forked process: one
 *              epoll loop thread, one worker thread) on one TCP loopback
 *              connection.  Per call the client writes a 64-byte request and
 *              waits for two 8-byte answers.  The loop hands the spawn to
 *              the worker (mutex + condition variable, as libuv's pool),
 *              which wakes it back by an eventfd; the loop writes the
 *              "start" answer, polls the two output pipes to their EOF,
 *              reaps when a signalfd says SIGCHLD (waitpid(-1, WNOHANG)) and
 *              writes the "end" answer;
 *   -m loop    the same with the spawn on the loop thread (what the agent's
 *              rule against blocking the loop forbids); the cgroups' mkdir
 *              and rmdir stay in the worker.
 *   -1         the start answer waits and leaves with the end one, one write.
 *   -c CGDIR   each child born in a cgroup of its own below CGDIR (a
 *              writable cgroup v2 directory), as the agent: the worker makes
 *              the next one (mkdir, open) right after a spawn and removes a
 *              command's after its end answer, as the agent's pool does its
 *              spare and rmdir; one not ready at a spawn is made on its path
 *              (direct: made before and removed after the timed part).
 * No HTTP, no protobuf, no bookkeeping: what the agent adds beyond this is
 * its own.  The client times each call from its write (direct: from the
 * spawn) to the end answer (the reap) and prints one stats line (stats.h)
 * labelled "floor-<mode>[-1][-cg]"; -o appends the raw samples (ns).
 */
#include "stats.h"
#include "proc/spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define REQ 64

static const char *prog = "/bin/true";

/* ---- the worker thread: the spawn (-m pool) and the cgroups' mkdir and
 * rmdir (every server mode, as the agent's pool) */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER, idle = PTHREAD_COND_INITIALIZER;
enum { JOB_SPAWN = 1, JOB_NEXT = 2, JOB_RM = 4 };
static int jobs, busy, stopping, job_done_fd; /* jobs, busy, stopping under mu */
struct spawned {
  pid_t pid;
  int out_r, err_r;
  int cg_fd; /* its cgroup (-c), removed after the reap */
  char cg_name[32];
};
static struct spawned job_result;

static void die(const char *what) {
  perror(what);
  exit(1);
}

/* the command's cgroups (-c): the next one made ahead, as the agent's spare */
static int cg_base = -1, cg_next = -1; /* cg_next and its name under mu */
static unsigned cg_seq;
static char cg_next_name[32];
static int rm_fd = -1; /* a cgroup to remove (JOB_RM), under mu */
static char rm_name[32];

static void cg_remove(int fd, const char *name) { /* after the reap: empty */
  if (fd < 0) return;
  close(fd);
  if (unlinkat(cg_base, name, AT_REMOVEDIR)) die("rtfloor: rmdir cgroup");
}

/* Make the next cgroup unless one is ready (the mkdir outside the lock);
 * nothing once stopping. */
static void cg_make_next(void) {
  char name[32];
  pthread_mutex_lock(&mu);
  int skip = cg_base < 0 || cg_next >= 0 || stopping;
  snprintf(name, sizeof name, "f%d-%u", (int)getpid(), ++cg_seq);
  pthread_mutex_unlock(&mu);
  if (skip) return;
  if (mkdirat(cg_base, name, 0755)) die("rtfloor: mkdir cgroup");
  int fd = openat(cg_base, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) die("rtfloor: open cgroup");
  pthread_mutex_lock(&mu);
  int lost = cg_next >= 0 || stopping; /* the loop and the worker both made one */
  if (!lost) {
    cg_next = fd;
    memcpy(cg_next_name, name, sizeof name);
  }
  pthread_mutex_unlock(&mu);
  if (lost) cg_remove(fd, name);
}

/* The child, in the ready cgroup (none ready: one made on the spawn's
 * path, as the agent's start does when its spare is late). */
static struct spawned spawn_with_pipes(int off_loop) {
  cg_make_next();
  pthread_mutex_lock(&mu);
  struct spawned s = {-1, -1, -1, cg_next, ""};
  memcpy(s.cg_name, cg_next_name, sizeof s.cg_name);
  cg_next = -1;
  pthread_mutex_unlock(&mu);
  char *argv[] = {(char *)prog, NULL};
  pid_t inflight = 0; /* off the loop the loop's reaper owns every wait (spawn.h) */
  proc_spawn_opts o = {.path = prog, .argv = argv, .envp = environ, .cwd = "/",
                       .use_cgroup = s.cg_fd >= 0, .cgroup_fd = s.cg_fd,
                       .inflight_pid = off_loop ? &inflight : NULL};
  proc_spawn_result r;
  char err[256];
  if (proc_spawn(&o, &r, err, sizeof err)) {
    fprintf(stderr, "rtfloor: %s\n", err);
    exit(1);
  }
  s.pid = r.pid;
  s.out_r = r.out_r;
  s.err_r = r.err_r;
  return s;
}

static void job_post(int job) {
  pthread_mutex_lock(&mu);
  jobs |= job;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
}

/* The loop hands over a cgroup to remove (its command reaped). */
static void job_post_rm(int fd, const char *name) {
  if (fd < 0) return;
  pthread_mutex_lock(&mu);
  int slot_busy = rm_fd >= 0;
  if (!slot_busy) {
    rm_fd = fd;
    memcpy(rm_name, name, sizeof rm_name);
    jobs |= JOB_RM;
    pthread_cond_signal(&cv);
  }
  pthread_mutex_unlock(&mu);
  if (slot_busy) cg_remove(fd, name); /* the last one still queued: not expected, a command outlasts an rmdir */
}

static void *worker(void *arg) {
  (void)arg;
  for (;;) {
    pthread_mutex_lock(&mu);
    while (!jobs) pthread_cond_wait(&cv, &mu);
    int take = jobs, fd = rm_fd;
    char name[32];
    memcpy(name, rm_name, sizeof name);
    jobs = 0;
    rm_fd = -1;
    busy = 1;
    pthread_mutex_unlock(&mu);
    if (take & JOB_SPAWN) {
      job_result = spawn_with_pipes(1);
      uint64_t one = 1;
      if (write(job_done_fd, &one, sizeof one) != sizeof one) die("rtfloor: eventfd");
      take |= JOB_NEXT; /* the agent's spare, made after the clone */
    }
    if (take & JOB_RM) cg_remove(fd, name);
    if (take & JOB_NEXT) cg_make_next();
    pthread_mutex_lock(&mu);
    busy = 0;
    pthread_cond_broadcast(&idle);
    pthread_mutex_unlock(&mu);
  }
  return NULL;
}

/* The client is gone: the worker's jobs done, the last spare removed. */
static void serve_stop(void) {
  pthread_mutex_lock(&mu);
  stopping = 1;
  while (jobs || busy) pthread_cond_wait(&idle, &mu);
  cg_remove(cg_next, cg_next_name);
  exit(0);
}

/* ---- the server loop */
static void serve(int lfd, int pool, int one_write) {
  int c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c < 0) die("rtfloor: accept");
  int on = 1;
  setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int sfd = signalfd(-1, &chld, SFD_NONBLOCK | SFD_CLOEXEC);
  job_done_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  if (sfd < 0 || job_done_fd < 0 || ep < 0) die("rtfloor: fds");
  struct epoll_event ev = {.events = EPOLLIN};
  int fds[3] = {c, sfd, job_done_fd};
  for (int i = 0; i < 3; i++) {
    ev.data.fd = fds[i];
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev)) die("rtfloor: epoll_ctl");
  }
  pthread_t t;
  if (pthread_create(&t, NULL, worker, NULL)) die("rtfloor: pthread_create");
  char req[REQ];
  size_t have = 0;
  struct spawned cur = {-1, -1, -1, -1, ""}, run = cur;
  int open_pipes = 0, reaped = 0, start_sent = 0;
  const char ans[16] = "start...end.....";
  for (;;) {
    struct epoll_event evs[8];
    int n = epoll_wait(ep, evs, 8, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) die("rtfloor: epoll_wait");
    for (int i = 0; i < n; i++) {
      int fd = evs[i].data.fd;
      if (fd == c) {
        ssize_t r = read(c, req + have, REQ - have);
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (r <= 0) serve_stop(); /* the client closed (or reset) the connection */
        have += (size_t)r;
        if (have < REQ) continue;
        have = 0;
        if (pool) {
          job_post(JOB_SPAWN);
          continue;
        }
        cur = spawn_with_pipes(0);
      } else if (fd == job_done_fd) {
        uint64_t v;
        if (read(job_done_fd, &v, sizeof v) != sizeof v) continue;
        cur = job_result;
      } else if (fd == sfd) {
        struct signalfd_siginfo si;
        while (read(sfd, &si, sizeof si) == sizeof si) {
        }
        int st;
        while (waitpid(-1, &st, WNOHANG) > 0) reaped = 1;
      } else { /* an output pipe */
        char b[4096];
        ssize_t r = read(fd, b, sizeof b);
        if (r == 0 || (r < 0 && errno != EAGAIN)) {
          epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL);
          close(fd);
          open_pipes--;
        }
      }
      if (cur.pid > 0) { /* the spawn is back: the start answer, the pipes polled */
        ev.data.fd = cur.out_r;
        epoll_ctl(ep, EPOLL_CTL_ADD, cur.out_r, &ev);
        ev.data.fd = cur.err_r;
        epoll_ctl(ep, EPOLL_CTL_ADD, cur.err_r, &ev);
        open_pipes = 2;
        run = cur;
        cur.pid = -1;
        if (!one_write && write(c, ans, 8) != 8) die("rtfloor: write");
        start_sent = 1;
        if (!pool) job_post(JOB_NEXT); /* the spare, in the worker as the agent's pool */
      }
      if (start_sent && reaped && open_pipes == 0) {
        if (write(c, one_write ? ans : ans + 8, one_write ? 16 : 8) <= 0) die("rtfloor: write");
        start_sent = reaped = 0;
        job_post_rm(run.cg_fd, run.cg_name); /* in the worker, after the answer, as the agent's pool */
        run.cg_fd = -1;
      }
    }
  }
}

/* ---- -m direct: spawn and wait, no server (the pipes closed after the wait) */
static int direct(const stats_run *o, const char *label) {
  uint64_t *v = calloc(o->n, sizeof *v);
  if (!v) return 1;
  for (uint64_t i = 0; i < o->w + o->n; i++) {
    if (o->gap_ms) stats_sleep_ms(o->gap_ms);
    uint64_t t0 = stats_now_ns();
    struct spawned s = spawn_with_pipes(0);
    int st;
    while (waitpid(s.pid, &st, 0) < 0)
      if (errno != EINTR) die("rtfloor: waitpid");
    if (i >= o->w) v[i - o->w] = stats_now_ns() - t0;
    close(s.out_r); /* the child is gone: nothing left to read */
    close(s.err_r);
    cg_remove(s.cg_fd, s.cg_name);
    cg_make_next();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rtfloor: %s did not exit 0\n", prog);
      return 1;
    }
  }
  if (o->raw && stats_dump(o->raw, v, o->n)) return 1;
  stats_print(stdout, label, v, o->n);
  return 0;
}

/* ---- the client (the parent process; the server is its child) */
static int client(int port, const stats_run *o, const char *label) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a)) die("rtfloor: connect");
  int on = 1;
  setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
  uint64_t *v = calloc(o->n, sizeof *v);
  if (!v) die("rtfloor: calloc"); /* exits: the socket closes and the server stops */
  char req[REQ] = "call", ans[16];
  for (uint64_t i = 0; i < o->w + o->n; i++) {
    if (o->gap_ms) stats_sleep_ms(o->gap_ms);
    uint64_t t0 = stats_now_ns();
    if (write(s, req, REQ) != REQ) die("rtfloor: client write");
    size_t got = 0;
    while (got < 16) {
      ssize_t r = read(s, ans + got, 16 - got);
      if (r <= 0) die("rtfloor: client read");
      got += (size_t)r;
    }
    if (memcmp(ans, "start...end.....", 16) != 0) {
      fprintf(stderr, "rtfloor: bad answer\n");
      exit(1);
    }
    if (i >= o->w) v[i - o->w] = stats_now_ns() - t0;
  }
  close(s); /* the server ends here */
  if (o->raw && stats_dump(o->raw, v, o->n)) return 1;
  stats_print(stdout, label, v, o->n);
  return 0;
}

int main(int argc, char **argv) {
  stats_run o = {.n = 2000, .w = 100};
  const char *mode = "pool";
  int one_write = 0, ch;
  while ((ch = getopt(argc, argv, "m:1c:" STATS_RUN_OPTS "h")) != -1) {
    int t = stats_run_opt(&o, ch, optarg);
    if (t < 0) goto usage;
    if (t > 0) continue;
    switch (ch) {
      case 'm': mode = optarg; break;
      case 'c':
        cg_base = open(optarg, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (cg_base < 0) die(optarg);
        break;
      case '1': one_write = 1; break;
      default: goto usage;
    }
  }
  if (argc - optind > 1 || (strcmp(mode, "pool") && strcmp(mode, "loop") && strcmp(mode, "direct"))) goto usage;
  if (optind < argc) prog = argv[optind];
  char label[32];
  snprintf(label, sizeof label, "floor-%s%s%s", mode, one_write ? "-1" : "", cg_base >= 0 ? "-cg" : "");
  cg_make_next();
  if (!strcmp(mode, "direct")) {
    int rc = direct(&o, label);
    cg_remove(cg_next, cg_next_name);
    return rc;
  }
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (lfd < 0 || bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) ||
      getsockname(lfd, (struct sockaddr *)&a, &al))
    die("rtfloor: listen");
  pid_t srv = fork(); /* the server a process of its own, its children the commands */
  if (srv < 0) die("rtfloor: fork");
  if (srv == 0) {
    /* SIGCHLD only through the signalfd, as the agent (blocked before any thread) */
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    pthread_sigmask(SIG_BLOCK, &chld, NULL);
    serve(lfd, !strcmp(mode, "pool"), one_write); /* exits when the client's connection closes */
  }
  close(lfd);
  int rc = client(ntohs(a.sin_port), &o, label);
  int st; /* the server ends when the connection closes (its spare cgroup removed) */
  waitpid(srv, &st, 0);
  return rc ? rc : !WIFEXITED(st) || WEXITSTATUS(st);
usage:
  fprintf(stderr, "usage: rtfloor [-m pool|loop|direct] [-1] [-c CGDIR] [-n N] [-w W] [-G GAP_MS] [-o FILE] [PROGRAM]\n");
  return 2;
}
