/* log — the one log format of conch-init (boot.md §8, api.md §9 "Operators").
 *
 *   YYYY-MM-DD HH:MM:SS.mmm [LEVEL] <source>:<line> [<sandboxId>] <msg> k=v …
 *
 * Destinations: the console (stderr), the log file once log_open_file()
 * succeeded (rotated at 10 MiB to <YYYYMMDD-HHMMSS>.log.<n> beside it), and
 * the host stream once log_stream_set() named one (one JSON object a line:
 * ts, level, src, sandboxId, msg and the message's k=v pairs).
 *
 * No log call ever blocks the loop: each destination has a bounded queue
 * (LOG_QUEUE_MAX) that drains as the destination takes bytes — the console
 * non-blocking (libuv watches it), the file written and rotated in the
 * thread pool, the stream a non-blocking socket.  Past the bound whole
 * lines are dropped and counted; the first line through afterwards is
 * preceded by "<n> log lines dropped".  While the stream is not connected
 * it keeps the newest LOG_STREAM_KEEP bytes (older lines dropped) and
 * sends them first once it is.
 *
 * Never log the token.  Callers write the message and the k=v pairs in one
 * format:  LOG_INFO("upload done path=%s bytes=%zu", p, n);
 * Loop thread or not: a line logged from another thread is queued and the
 * loop is woken to write it.
 */
#ifndef CONCH_LOG_H
#define CONCH_LOG_H

#include <stdarg.h>
#include <stddef.h>

typedef enum log_level { LOG_LVL_DEBUG, LOG_LVL_INFO, LOG_LVL_WARN, LOG_LVL_ERROR } log_level;

/* The destinations, as /metrics names them (conch_log_lines_dropped_total{dest}). */
typedef enum log_dest { LOG_DEST_CONSOLE, LOG_DEST_FILE, LOG_DEST_STREAM, LOG_NDEST } log_dest;

#define LOG_QUEUE_MAX (64u << 10)
#define LOG_STREAM_KEEP (1u << 20)

void log_write(log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void log_vwrite(log_level lvl, const char *file, int line, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* Also append to this file (created 0600; an existing one is made 0600).
 * Returns 0 or -errno. */
int log_open_file(const char *path);
/* The log file of the previous program (upgrade in place): fd, its path. */
int log_adopt_file(int fd, const char *path);
/* The log file's descriptor, -1 when none (handed over on upgrade). */
int log_file_fd(void);
/* Minimum level written (default INFO; CONCH_LOG_LEVEL=debug lowers it). */
void log_set_level(log_level lvl);
/* "debug", "info", "warn", "error" → 0..3; -1 for anything else. */
int log_level_parse(const char *s);
/* Minimum level of the console alone; -1: the same as log_set_level's. */
void log_set_console_level(int lvl);
/* 1: console lines in the stream's JSON form (serve --log-format json). */
void log_set_console_json(int on);
/* The one JSON string escaper (proto/text.h's text_json_string), set by
 * the program at start: core/ includes nothing above it.  Until it is set
 * the JSON forms are not written. */
void log_set_json_escaper(size_t (*esc)(char *out, const char *s, size_t n));
/* Stream every line to "vsock:CID:PORT", "unix:PATH" or "tcp:IP:PORT"
 * (numeric IPv4 or [IPv6]); reconnects with backoff.  NULL or "" stops it.
 * Returns 0, or -EINVAL for a malformed spec. */
int log_stream_set(const char *spec);
/* Lines dropped at a destination since start (/metrics). */
unsigned long long log_dropped(log_dest d);
const char *log_dest_name(log_dest d);

#define LOG_DEBUG(...) log_write(LOG_LVL_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...)  log_write(LOG_LVL_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...)  log_write(LOG_LVL_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) log_write(LOG_LVL_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
