/* log — see log.h.  State lives in the daemon context (conch.log_*). */
#include "core/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include "core/daemon.h"

#define LOG_ROTATE_BYTES (10u * 1024 * 1024)

static const char *const log_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};

void log_set_level(log_level lvl) { conch.log_level = (int)lvl; }

int log_open_file(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  FILE *f = fdopen(fd, "a");
  if (!f) {
    int e = errno;
    close(fd);
    return -e;
  }
  struct stat st;
  conch.log_file_bytes = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  if (conch.log_file) fclose(conch.log_file);
  conch.log_file = f;
  snprintf(conch.log_path, sizeof conch.log_path, "%s", path);
  return 0;
}

void log_adopt_file(int fd, const char *path) {
  FILE *f = fdopen(fd, "a");
  if (!f) return;
  struct stat st;
  conch.log_file_bytes = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  if (conch.log_file) fclose(conch.log_file);
  conch.log_file = f;
  snprintf(conch.log_path, sizeof conch.log_path, "%s", path);
}

/* Rename the full log to <dir>/<YYYYMMDD-HHMMSS>.log.<n> and start anew. */
static void log_rotate(void) {
  char dir[512], stamp[32], dst[600];
  snprintf(dir, sizeof dir, "%s", conch.log_path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = 0; else snprintf(dir, sizeof dir, ".");
  time_t now = time(NULL);
  struct tm tm;
  gmtime_r(&now, &tm);
  strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
  for (int n = 1; n < 1000; n++) {
    snprintf(dst, sizeof dst, "%s/%s.log.%d", dir, stamp, n);
    if (access(dst, F_OK) != 0) break;
  }
  fclose(conch.log_file);
  conch.log_file = NULL;
  if (rename(conch.log_path, dst) != 0) { /* keep appending to the old one */ }
  char path[512];
  snprintf(path, sizeof path, "%s", conch.log_path);
  log_open_file(path);
}

void log_vwrite(log_level lvl, const char *file, int line, const char *fmt, va_list ap) {
  if ((int)lvl < conch.log_level) return;
  char buf[4096];
  struct timeval tv;
  gettimeofday(&tv, NULL);
  struct tm tm;
  gmtime_r(&tv.tv_sec, &tm);
  const char *base = strrchr(file, '/');
  base = base ? base + 1 : file;
  int n = snprintf(buf, sizeof buf, "%04d-%02d-%02d %02d:%02d:%02d.%03d [%s] %s:%d [%s] ",
                   tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                   tm.tm_sec, (int)(tv.tv_usec / 1000), log_names[lvl], base, line,
                   conch.sandbox_id[0] ? conch.sandbox_id : "-");
  if (n < 0) return;
  if ((size_t)n < sizeof buf) {
    int m = vsnprintf(buf + n, sizeof buf - (size_t)n, fmt, ap);
    if (m > 0) n += m;
  }
  if ((size_t)n >= sizeof buf - 1) n = (int)sizeof buf - 2;
  /* one line: newlines inside a message become spaces */
  for (int i = 0; i < n; i++)
    if (buf[i] == '\n' || buf[i] == '\r') buf[i] = ' ';
  buf[n++] = '\n';
  ssize_t w = write(STDERR_FILENO, buf, (size_t)n);
  (void)w;
  if (conch.log_file) {
    fwrite(buf, 1, (size_t)n, conch.log_file);
    fflush(conch.log_file);
    conch.log_file_bytes += (size_t)n;
    if (conch.log_file_bytes >= LOG_ROTATE_BYTES) log_rotate();
  }
}

void log_write(log_level lvl, const char *file, int line, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  log_vwrite(lvl, file, line, fmt, ap);
  va_end(ap);
}
