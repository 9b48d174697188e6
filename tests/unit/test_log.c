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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
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

/* The highest "n" of the whole lines in buf[0, *n) (each one a JSON
 * object, else -2); a trailing partial line is kept. */
static int whole_lines(char *buf, size_t *n, int last) {
  char *p = buf, *end = buf + *n, *nl;
  while ((nl = memchr(p, '\n', (size_t)(end - p)))) {
    if (strncmp(p, "{\"ts\":\"", 7) != 0 || nl[-1] != '}') return -2;
    char *k = memmem(p, (size_t)(nl - p), "\"n\":\"", 5);
    if (k) last = atoi(k + 5);
    p = nl + 1;
  }
  memmove(buf, p, (size_t)(end - p));
  *n = (size_t)(end - p);
  return last;
}

static int accept_stream(int ls) {
  int c = -1;
  for (int i = 0; i < 1000 && c < 0; i++) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    c = accept4(ls, NULL, NULL, SOCK_NONBLOCK);
    if (c < 0) usleep(5000);
  }
  return c;
}

/* The host stream resumes at a line's start: 1 MiB kept while nobody
 * listened, a listener that takes it slowly (a small socket buffer: lines
 * go out in pieces) and hangs up while a line is half sent, right after
 * a new line made the queue move its bytes to the front. */
TEST(stream_resumes_at_a_line_start) {
  static char buf[1 << 17], filler[4001];
  char path[] = "/tmp/conch-logstream-XXXXXX";
  int tfd = mkstemp(path);
  ASSERT(tfd >= 0);
  close(tfd);
  unlink(path);
  conch.loop = uv_default_loop();
  uv_timer_t alive;
  uv_timer_init(conch.loop, &alive);
  uv_timer_start(&alive, on_alive, 1000000, 0);
  char spec[128];
  snprintf(spec, sizeof spec, "unix:%s", path);
  ASSERT_EQ(log_stream_set(spec), 0); /* nobody listens yet */
  memset(filler, 'z', 3000);
  int seq = 0;
  for (; seq < 500; seq++) LOG_INFO("stream n=%d %s", seq, filler); /* 1.5 MB: the last 1 MiB kept */
  drain(buf, sizeof buf);
  int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
  struct sockaddr_un un = {.sun_family = AF_UNIX};
  snprintf(un.sun_path, sizeof un.sun_path, "%s", path);
  ASSERT(bind(ls, (struct sockaddr *)&un, sizeof un) == 0 && listen(ls, 4) == 0);
  int c = accept_stream(ls);
  ASSERT(c >= 0);
  for (int fd = 3; fd < 1024; fd++) { /* the agent's end: a small send buffer */
    struct sockaddr_un peer;
    socklen_t pl = sizeof peer;
    if (fd != c && fd != ls && getpeername(fd, (struct sockaddr *)&peer, &pl) == 0 && peer.sun_family == AF_UNIX &&
        strcmp(peer.sun_path, path) == 0) {
      int small = 4096;
      ASSERT(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    }
  }
  size_t n = 0;
  int last = -1;
  for (int i = 0; i < 100000 && last < seq - 8; i++) { /* read all but the last few lines */
    uv_run(conch.loop, UV_RUN_NOWAIT);
    ssize_t r = read(c, buf + n, sizeof buf - n);
    if (r > 0) n += (size_t)r;
    last = whole_lines(buf, &n, last);
    ASSERT(last != -2);
  }
  ASSERT_EQ(last, seq - 8);
  for (int i = 0; i < 10; i++) uv_run(conch.loop, UV_RUN_NOWAIT);
  memset(filler, 'w', 4000);
  LOG_INFO("stream n=%d %s", seq++, filler); /* the queue's end is near its buffer's: moved to the front */
  for (int i = 0; i < 10; i++) uv_run(conch.loop, UV_RUN_NOWAIT);
  close(c);
  c = accept_stream(ls);
  ASSERT(c >= 0);
  n = 0;
  last = -1;
  for (int i = 0; i < 1000 && last < seq - 1; i++) {
    uv_run(conch.loop, UV_RUN_NOWAIT);
    ssize_t r = read(c, buf + n, sizeof buf - n);
    if (r > 0) n += (size_t)r;
    if (n >= 7) ASSERT(strncmp(buf, "{\"ts\":\"", 7) == 0 || last >= 0); /* the first line whole */
    last = whole_lines(buf, &n, last);
    ASSERT(last != -2);
    if (r <= 0) usleep(1000);
  }
  ASSERT_EQ(last, seq - 1);
  close(c);
  ASSERT_EQ(log_stream_set(NULL), 0);
  uv_close((uv_handle_t *)&alive, NULL);
  uv_run(conch.loop, UV_RUN_NOWAIT);
  close(ls);
  unlink(path);
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
  RUN(stream_resumes_at_a_line_start);
  return test_summary();
}
