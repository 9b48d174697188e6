/* log: the JSON form (the message's k=v pairs as keys, through the one
 * escaper); a console that does not take its bytes — whole lines dropped
 * and counted, the note once it drains (no loop yet: what the pipe refuses
 * waits in the queue until the next line); the file written and rotated
 * by a pool job once there is a loop.  stderr is a small pipe here; the
 * harness reports on a copy of the real one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/daemon.h"
#include "core/log.h"
#include "proto/text.h"
#include "test.h"

static int rd; /* the pipe's read end (non-blocking) */

static size_t drain(char *buf, size_t cap) {
  size_t n = 0;
  for (;;) {
    ssize_t r = read(rd, buf + n, cap - 1 - n);
    if (r <= 0) break;
    n += (size_t)r;
    if (n >= cap - 1) break;
  }
  buf[n] = 0;
  return n;
}

TEST(json_form) {
  static char buf[65536];
  log_set_console_json(1);
  LOG_INFO("upload done path=%s bytes=%d", "/a \"b\"", 3);
  LOG_WARN("k=v x=1 2");
  LOG_ERROR("plain\nline");
  log_set_console_json(0);
  drain(buf, sizeof buf);
  char *e1 = strchr(buf, '\n'), *e2 = e1 ? strchr(e1 + 1, '\n') : NULL, *e3 = e2 ? strchr(e2 + 1, '\n') : NULL;
  ASSERT(e3 && e3[1] == 0); /* three lines */
  *e1 = *e2 = *e3 = 0;
  char *l2 = e1, *l3 = e2;
  ASSERT(strncmp(buf, "{\"ts\":\"", 7) == 0 && strstr(buf, "Z\",\"level\":\"info\",\"src\":\"test_log.c:"));
  ASSERT(strstr(buf, "\"sandboxId\":\"sb-\\\"1\\\"\",\"msg\":\"upload done\",\"path\":\"/a \\\"b\\\"\",\"bytes\":\"3\"}"));
  ASSERT(strstr(l2 + 1, "\"level\":\"warn\"") && strstr(l2 + 1, "\"msg\":\"\",\"k\":\"v\",\"x\":\"1 2\"}"));
  ASSERT(strstr(l3 + 1, "\"msg\":\"plain line\"}"));
}

/* Only the format's own words make keys: a file name or command line
 * that says " key=value" stays inside its value, and a reserved or
 * repeated key in the format stays text. */
TEST(json_keys_only_from_the_format) {
  static char buf[65536];
  log_set_console_json(1);
  LOG_INFO("upload name=%s bytes=%d", "f level=error sandboxId=other ts=1999 msg=x bytes=9", 3);
  LOG_INFO("%s", "cmd=rm level=error");
  LOG_INFO("run level=%s cmd=%s cmd=%s", "a", "b", "c");
  log_set_console_json(0);
  drain(buf, sizeof buf);
  char *e1 = strchr(buf, '\n'), *e2 = e1 ? strchr(e1 + 1, '\n') : NULL, *e3 = e2 ? strchr(e2 + 1, '\n') : NULL;
  ASSERT(e3 && e3[1] == 0);
  *e1 = *e2 = *e3 = 0;
  ASSERT(strstr(buf, "\"level\":\"info\",") && strstr(buf, "\"sandboxId\":\"sb-\\\"1\\\"\","));
  ASSERT(strstr(buf, ",\"msg\":\"upload\",\"name\":\"f level=error sandboxId=other ts=1999 msg=x bytes=9\","
                     "\"bytes\":\"3\"}"));
  ASSERT(strstr(e1 + 1, ",\"msg\":\"cmd=rm level=error\"}"));
  ASSERT(strstr(e2 + 1, ",\"msg\":\"run level=a\",\"cmd\":\"b cmd=c\"}"));
  for (char *l = buf; l <= e2 + 1; l = strchr(l, 0) + 1) { /* each reserved key once */
    const char *keys[] = {"\"ts\":", "\"level\":", "\"src\":", "\"sandboxId\":", "\"msg\":"};
    for (int i = 0; i < 5; i++) {
      char *a = strstr(l, keys[i]);
      ASSERT(a && !strstr(a + 1, keys[i]));
    }
  }
}

TEST(stalled_console_drops_whole_lines) {
  static char buf[1 << 20];
  char line[101];
  memset(line, 'y', 100);
  line[100] = 0;
  ASSERT_EQ(log_dropped(LOG_DEST_CONSOLE), 0);
  for (int i = 0; i < 2000; i++) LOG_INFO("n=%04d %s", i, line); /* ~290 KB into a 4 KiB pipe */
  unsigned long long dropped = log_dropped(LOG_DEST_CONSOLE);
  ASSERT(dropped > 1000 && dropped < 2000);
  size_t got = 0;
  int note = 0;
  for (int round = 0; round < 200 && !note; round++) {
    got += drain(buf + got, sizeof buf - got);
    note = strstr(buf, "log lines dropped") != NULL;
    if (!note) LOG_INFO("tick");
  }
  ASSERT(note);
  got += drain(buf + got, sizeof buf - got);
  /* every line whole; the kept ones in order, then the note with the count */
  int last = -1, lines = 0;
  for (char *p = buf, *nl; (nl = strchr(p, '\n')); p = nl + 1, lines++) {
    *nl = 0;
    ASSERT(strncmp(p, "20", 2) == 0 && strstr(p, "[sb-\"1\"] "));
    char *n = strstr(p, "] n=");
    if (n) {
      int k = atoi(n + 4);
      ASSERT(k > last && strlen(n + 9) == 100);
      last = k;
    }
    char *d = strstr(p, "[WARN] log.c:");
    if (d) {
      char *c = strstr(d, "] ");
      c = strstr(c + 2, "] ") + 2; /* past the sandbox id */
      ASSERT_EQ(strtoull(c, NULL, 10), log_dropped(LOG_DEST_CONSOLE)); /* the ticks dropped too */
      ASSERT(strtoull(c, NULL, 10) >= dropped);
    }
  }
  ASSERT(lines > 20);
}

/* Does dir hold a name ending in suffix?  Its path into out. */
static int find_suffix(const char *dir, const char *suffix, char *out, size_t n) {
  DIR *d = opendir(dir);
  struct dirent *de;
  int found = 0;
  while (d && !found && (de = readdir(d)) != NULL) {
    size_t l = strlen(de->d_name), sl = strlen(suffix);
    if (l > sl && strcmp(de->d_name + l - sl, suffix) == 0) {
      snprintf(out, n, "%s/%s", dir, de->d_name);
      found = 1;
    }
  }
  if (d) closedir(d);
  return found;
}

static int file_has(const char *path, const char *text) {
  static char buf[4096];
  int fd = open(path, O_RDONLY);
  if (fd < 0) return 0;
  off_t size = lseek(fd, 0, SEEK_END);
  ssize_t r = pread(fd, buf, sizeof buf - 1, size > (off_t)sizeof buf - 1 ? size - (off_t)sizeof buf + 1 : 0);
  close(fd);
  buf[r > 0 ? r : 0] = 0;
  return r > 0 && memmem(buf, (size_t)r, text, strlen(text)) != NULL;
}

static void on_alive(uv_timer_t *t) { (void)t; }

/* With the loop: the file is written by a pool job, which renames it at
 * 10 MiB and opens the path anew (0600). */
TEST(file_written_and_rotated_in_the_pool) {
  static char buf[1 << 16];
  char dir[] = "/tmp/conch-logtest-XXXXXX", path[128], rotated[300];
  ASSERT(mkdtemp(dir));
  snprintf(path, sizeof path, "%s/conch-init.log", dir);
  int fd = open(path, O_CREAT | O_WRONLY, 0644);
  ASSERT(fd >= 0 && ftruncate(fd, (10 << 20) - 10) == 0);
  close(fd);
  ASSERT_EQ(log_open_file(path), 0);
  struct stat st;
  ASSERT(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600);
  conch.loop = uv_default_loop();
  uv_timer_t alive; /* the loop runs while something holds it (the agent's listener does) */
  uv_timer_init(conch.loop, &alive);
  uv_timer_start(&alive, on_alive, 1000000, 0);
  LOG_INFO("the line past 10 MiB");
  for (int i = 0; i < 500 && !find_suffix(dir, ".log.1", rotated, sizeof rotated); i++) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    usleep(10000);
    drain(buf, sizeof buf);
  }
  ASSERT(find_suffix(dir, ".log.1", rotated, sizeof rotated));
  ASSERT(file_has(rotated, "the line past 10 MiB"));
  LOG_INFO("the first line of the new file");
  for (int i = 0; i < 500 && !file_has(path, "the first line of the new file"); i++) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    usleep(10000);
  }
  ASSERT(file_has(path, "the first line of the new file") && !file_has(path, "past 10 MiB"));
  ASSERT(stat(path, &st) == 0 && (st.st_mode & 07777) == 0600 && st.st_size < 4096);
  uv_close((uv_handle_t *)&alive, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
  unlink(rotated);
  unlink(path);
  rmdir(dir);
}

int main(void) {
  int saved = dup(STDERR_FILENO), p[2];
  FILE *real = fdopen(saved, "w");
  if (!real || pipe(p) != 0) return 1;
  setvbuf(real, NULL, _IONBF, 0);
  fcntl(p[1], F_SETPIPE_SZ, 4096);
  dup2(p[1], STDERR_FILENO);
  close(p[1]);
  rd = p[0];
  fcntl(rd, F_SETFL, O_NONBLOCK);
  stderr = real;
  snprintf(conch.sandbox_id, sizeof conch.sandbox_id, "sb-\"1\"");
  log_set_json_escaper(text_json_string);
  RUN(json_form);
  RUN(json_keys_only_from_the_format);
  RUN(stalled_console_drops_whole_lines);
  RUN(file_written_and_rotated_in_the_pool);
  return test_summary();
}
