/* log: a console that is a regular file is written by a pool job, never
 * on the loop (the file's disk may be slow): with the pool's one thread
 * held, a line logged stays queued until the thread is free.  A program
 * of its own: the console is set up once, from stderr as it is. */
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "core/pool.h"
#include "test.h"

static int gate[2];
static char path[] = "/tmp/conch-logcon-XXXXXX";

static void hold_work(pool_job *j) {
  (void)j;
  char c;
  ssize_t r = read(gate[0], &c, 1); /* until the test lets go */
  (void)r;
}
static void hold_done(pool_job *j, int canceled) {
  (void)j;
  (void)canceled;
}

static off_t size_of(void) {
  struct stat st;
  return stat(path, &st) == 0 ? st.st_size : -1;
}

static void on_alive(uv_timer_t *t) { (void)t; }

TEST(regular_file_console_written_in_the_pool) {
  conch.loop = uv_default_loop();
  uv_timer_t alive;
  uv_timer_init(conch.loop, &alive);
  uv_timer_start(&alive, on_alive, 1000000, 0);
  static pool_job hold;
  ASSERT(pipe(gate) == 0);
  pool_submit(&hold, hold_work, hold_done);
  for (int i = 0; i < 50; i++) uv_run(conch.loop, UV_RUN_NOWAIT);
  LOG_INFO("the console line");
  usleep(50000);
  off_t held = size_of();
  ASSERT(write(gate[1], "x", 1) == 1);
  ASSERT_EQ(held, 0); /* not written by the loop thread */
  for (int i = 0; i < 500 && size_of() == 0; i++) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  int fd = open(path, O_RDONLY);
  char buf[512] = {0};
  ASSERT(fd >= 0 && read(fd, buf, sizeof buf - 1) > 0);
  close(fd);
  ASSERT(strstr(buf, "[INFO] test_log_console_file.c:") && strstr(buf, "the console line\n"));
  uv_close((uv_handle_t *)&alive, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
}

int main(void) {
  setenv("UV_THREADPOOL_SIZE", "1", 1); /* one runner: held by the test's job */
  int saved = dup(STDERR_FILENO);
  FILE *real = fdopen(saved, "w");
  int fd = mkstemp(path);
  if (!real || fd < 0) return 1;
  setvbuf(real, NULL, _IONBF, 0);
  dup2(fd, STDERR_FILENO);
  close(fd);
  stderr = real;
  RUN(regular_file_console_written_in_the_pool);
  unlink(path);
  return test_summary();
}
