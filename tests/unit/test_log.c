/* log: the JSON form (the message's k=v pairs as keys, through the one
 * escaper), and a console that does not take its bytes — whole lines
 * dropped and counted, the note once it drains.  stderr is a small pipe
 * here; the harness reports on a copy of the real one.  No loop: what the
 * pipe refuses waits in the queue until the next line. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
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
  RUN(stalled_console_drops_whole_lines);
  return test_summary();
}
