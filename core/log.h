/* log — the one log format of conch-init (boot.md §8).
 *
 *   YYYY-MM-DD HH:MM:SS.mmm [LEVEL] <source>:<line> [<sandboxId>] <msg> k=v …
 *
 * Always to stderr (the console); once log_open_file() succeeded also to a
 * file, rotated at 10 MiB to <YYYYMMDD-HHMMSS>.log.<n> beside it.  Never log
 * the token.  Callers write the message and the k=v pairs in one format:
 *     LOG_INFO("upload done path=%s bytes=%zu", p, n);
 */
#ifndef CONCH_LOG_H
#define CONCH_LOG_H

#include <stdarg.h>

typedef enum log_level { LOG_LVL_DEBUG, LOG_LVL_INFO, LOG_LVL_WARN, LOG_LVL_ERROR } log_level;

void log_write(log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void log_vwrite(log_level lvl, const char *file, int line, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* Also append to this file (created 0644).  Returns 0 or -errno. */
int log_open_file(const char *path);
/* The log file of the previous program (upgrade in place): fd, its path. */
void log_adopt_file(int fd, const char *path);
/* Minimum level written (default INFO; CONCH_LOG_LEVEL=debug lowers it). */
void log_set_level(log_level lvl);

#define LOG_DEBUG(...) log_write(LOG_LVL_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_INFO(...)  log_write(LOG_LVL_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_WARN(...)  log_write(LOG_LVL_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define LOG_ERROR(...) log_write(LOG_LVL_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
