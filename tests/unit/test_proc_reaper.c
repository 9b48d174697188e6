/* test_proc_reaper — the one reaper on a real libuv loop: statuses reach the
 * registered owner (many children, so the pid table rehashes), unwatched
 * children and orphans (this process is made a child subreaper) are reaped
 * and counted, and an orphan storm leaves no zombie behind while watched
 * exit codes stay correct. */
#include <dirent.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "proc/reaper.h"
#include "test.h"

#define NCHILD 300

static uv_loop_t *loop;
static int got_status[NCHILD];
static pid_t got_pid[NCHILD], child_pid[NCHILD];
static int ncalls, nwrong;

static void on_exit_cb(pid_t pid, int st, const struct rusage *ru, void *arg) {
  int i = (int)(intptr_t)arg;
  if (got_pid[i]) nwrong++; /* twice */
  got_pid[i] = pid;
  got_status[i] = st;
  ncalls++;
}

static void on_guard(uv_timer_t *t) { uv_stop(loop); }
static int want_calls;
static void on_check(uv_timer_t *t) {
  if (ncalls >= want_calls) uv_stop(loop);
}

/* Run the loop until want calls arrived or ms passed. */
static void run_until(int want, int ms) {
  uv_timer_t guard, check;
  want_calls = want;
  uv_timer_init(loop, &guard);
  uv_timer_init(loop, &check);
  uv_timer_start(&guard, on_guard, (uint64_t)ms, 0);
  uv_timer_start(&check, on_check, 5, 5);
  uv_run(loop, UV_RUN_DEFAULT);
  uv_close((uv_handle_t *)&guard, NULL);
  uv_close((uv_handle_t *)&check, NULL);
  uv_run(loop, UV_RUN_NOWAIT);
}

/* Number of zombie processes whose parent is us. */
static int count_my_zombies(void) {
  DIR *d = opendir("/proc");
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d))) {
    char path[300], buf[512];
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (!f) continue;
    size_t k = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[k] = 0;
    char *rp = strrchr(buf, ')');
    if (!rp) continue;
    char state;
    int ppid;
    if (sscanf(rp + 2, "%c %d", &state, &ppid) == 2 && state == 'Z' && ppid == getpid()) n++;
  }
  closedir(d);
  return n;
}

TEST(dispatch_many) {
  ncalls = nwrong = 0;
  memset(got_pid, 0, sizeof got_pid);
  for (int i = 0; i < NCHILD; i++) {
    pid_t p = fork();
    ASSERT(p >= 0);
    if (p == 0) {
      usleep((useconds_t)(i % 7) * 1000);
      _exit(i % 256);
    }
    child_pid[i] = p;
    ASSERT_EQ(reaper_watch(p, on_exit_cb, (void *)(intptr_t)i), 0);
  }
  run_until(NCHILD, 10000);
  ASSERT_EQ(ncalls, NCHILD);
  ASSERT_EQ(nwrong, 0);
  for (int i = 0; i < NCHILD; i++) {
    ASSERT_EQ(got_pid[i], child_pid[i]);
    ASSERT(WIFEXITED(got_status[i]));
    ASSERT_EQ(WEXITSTATUS(got_status[i]), i % 256);
  }
  ASSERT_EQ(count_my_zombies(), 0);
}

TEST(signal_status) {
  ncalls = 0;
  memset(got_pid, 0, sizeof got_pid);
  pid_t p = fork();
  if (p == 0) {
    pause();
    _exit(0);
  }
  ASSERT_EQ(reaper_watch(p, on_exit_cb, (void *)(intptr_t)0), 0);
  kill(p, SIGKILL);
  run_until(1, 5000);
  ASSERT_EQ(ncalls, 1);
  ASSERT(WIFSIGNALED(got_status[0]));
  ASSERT_EQ(WTERMSIG(got_status[0]), SIGKILL);
}

TEST(unwatched_is_orphan) {
  unsigned long before = reaper_orphans_reaped();
  ncalls = 0;
  pid_t a = fork();
  if (a == 0) _exit(1);
  pid_t b = fork();
  if (b == 0) {
    usleep(20000);
    _exit(2);
  }
  ASSERT_EQ(reaper_watch(a, on_exit_cb, (void *)(intptr_t)0), 0);
  ASSERT_EQ(reaper_watch(b, on_exit_cb, (void *)(intptr_t)1), 0);
  reaper_unwatch(a);
  run_until(1, 5000);
  usleep(50000);
  reaper_reap();
  ASSERT_EQ(ncalls, 1);
  ASSERT_EQ(reaper_orphans_reaped(), before + 1);
  ASSERT_EQ(count_my_zombies(), 0);
}

/* An orphan storm: 200 double-forked sleeps re-parented to us (a
 * subreaper, like PID 1), while watched children exit with known codes. */
TEST(orphan_storm) {
  ncalls = nwrong = 0;
  memset(got_pid, 0, sizeof got_pid);
  unsigned long before = reaper_orphans_reaped();
  int nstorm = 3, nwatched = 50;
  for (int s = 0; s < nstorm; s++) {
    pid_t p = fork();
    if (p == 0) {
      execl("/bin/sh", "sh", "-c", "for i in $(seq 200); do (sleep 0.01 &) ; done", (char *)NULL);
      _exit(127);
    }
    ASSERT_EQ(reaper_watch(p, on_exit_cb, (void *)(intptr_t)(100 + s)), 0);
  }
  for (int i = 0; i < nwatched; i++) {
    pid_t p = fork();
    if (p == 0) {
      usleep((useconds_t)(i % 10) * 3000);
      _exit(200 + i % 50);
    }
    child_pid[i] = p;
    ASSERT_EQ(reaper_watch(p, on_exit_cb, (void *)(intptr_t)i), 0);
  }
  run_until(nstorm + nwatched, 120000); /* 600 forks take over 20 s in an emulated arm64 guest */
  ASSERT_EQ(ncalls, nstorm + nwatched);
  ASSERT_EQ(nwrong, 0);
  for (int i = 0; i < nwatched; i++) {
    ASSERT_EQ(got_pid[i], child_pid[i]);
    ASSERT_EQ(WEXITSTATUS(got_status[i]), 200 + i % 50);
  }
  for (int s = 0; s < nstorm; s++) ASSERT_EQ(WEXITSTATUS(got_status[100 + s]), 0);
  /* let the last sleeps finish and be reaped by SIGCHLD alone */
  for (int tries = 0; tries < 100; tries++) {
    run_until(1 << 30, 50);
    if (reaper_orphans_reaped() - before >= (unsigned long)(nstorm * 200)) break;
  }
  /* each round orphans its sleep (the subshell is sh's own child) */
  ASSERT(reaper_orphans_reaped() - before >= (unsigned long)(nstorm * 200));
  ASSERT_EQ(count_my_zombies(), 0);
}

TEST(watch_args) {
  ASSERT_NE(reaper_watch(0, on_exit_cb, NULL), 0);
  ASSERT_NE(reaper_watch(-5, on_exit_cb, NULL), 0);
  ASSERT_NE(reaper_watch(5, NULL, NULL), 0);
  /* many fake pids: grow, unwatch in another order, everything consistent */
  for (int i = 1; i <= 5000; i++) ASSERT_EQ(reaper_watch(1000000 + i * 7, on_exit_cb, NULL), 0);
  for (int i = 5000; i >= 1; i -= 2) reaper_unwatch(1000000 + i * 7);
  for (int i = 1; i <= 5000; i++) reaper_unwatch(1000000 + i * 7);
  /* nothing stale left: a real child still dispatches */
  ncalls = 0;
  memset(got_pid, 0, sizeof got_pid);
  pid_t p = fork();
  if (p == 0) _exit(9);
  ASSERT_EQ(reaper_watch(p, on_exit_cb, (void *)(intptr_t)0), 0);
  run_until(1, 5000);
  ASSERT_EQ(ncalls, 1);
  ASSERT_EQ(WEXITSTATUS(got_status[0]), 9);
}

/* A child cloned off the loop that exits before its owner watches it: its
 * status waits in the in-flight slot (not taken for an orphan); a slot
 * claimed while the child still runs watches it. */
TEST(inflight_slots) {
  reaper_inflight early, late, none;
  reaper_inflight_add(&early);
  reaper_inflight_add(&late);
  reaper_inflight_add(&none);
  unsigned long orphans = reaper_orphans_reaped();
  pid_t a = fork();
  if (a == 0) _exit(3);
  __atomic_store_n(&early.pid, a, __ATOMIC_RELEASE); /* what CLONE_PARENT_SETTID does */
  int pfd[2];
  ASSERT_EQ(pipe(pfd), 0);
  pid_t b = fork();
  if (b == 0) {
    char c;
    close(pfd[1]);
    ssize_t k = read(pfd[0], &c, 1); /* until the parent closes its end */
    _exit(k == 0 ? 4 : 5);
  }
  close(pfd[0]);
  __atomic_store_n(&late.pid, b, __ATOMIC_RELEASE);
  for (int i = 0; i < 200 && !early.reaped; i++) {
    usleep(10000);
    reaper_reap();
  }
  ASSERT_EQ(early.reaped, 1);
  ASSERT_EQ(reaper_orphans_reaped(), orphans);
  int st = -1;
  ASSERT_EQ(reaper_inflight_claim(&early, on_exit_cb, (void *)(intptr_t)1, &st), 1);
  ASSERT_EQ(WEXITSTATUS(st), 3);
  ASSERT_EQ(reaper_inflight_claim(&none, on_exit_cb, NULL, &st), 0); /* nothing spawned */
  ncalls = 0;
  memset(got_pid, 0, sizeof got_pid);
  ASSERT_EQ(reaper_inflight_claim(&late, on_exit_cb, (void *)(intptr_t)2, &st), 0); /* watched */
  close(pfd[1]);
  run_until(1, 5000);
  ASSERT_EQ(ncalls, 1);
  ASSERT_EQ(got_pid[2], b);
  ASSERT_EQ(WEXITSTATUS(got_status[2]), 4);
  ASSERT_EQ(reaper_orphans_reaped(), orphans);
}

int main(void) {
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  loop = uv_default_loop();
  if (reaper_init(loop) != 0) return 1;
  RUN(dispatch_many);
  RUN(signal_status);
  RUN(unwatched_is_orphan);
  RUN(orphan_storm);
  RUN(watch_args);
  RUN(inflight_slots);
  return test_summary();
}
