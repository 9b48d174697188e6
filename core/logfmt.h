/* logfmt — a log line's two forms, the text line (boot.md §8) and the JSON
 * object of the host stream and --log-format json (api.md §9
 * "Operators"), and where a message's key/values are.  Used by log.c. */
#ifndef CONCH_LOGFMT_H
#define CONCH_LOGFMT_H

#include <stdarg.h>
#include <stddef.h>
#include <sys/time.h>

#define LOG_LINE_MAX 4096
#define LOG_JSON_MAX (LOG_LINE_MAX * 6 + 512)
#define LOG_KV_MAX 16

typedef struct log_rec {
  struct timeval tv;
  int lvl; /* log_level */
  const char *src; /* base name */
  int line;
  const char *msg;
  size_t msglen;
  const size_t *kv; /* where each key/value's key starts in msg (kv_find) */
  int nkv;
} log_rec;

/* "YYYY-MM-DD HH:MM:SS.mmm [LEVEL] src:line [sandboxId] msg\n" into out. */
size_t logfmt_text(char *out, size_t cap, const log_rec *r);
/* The key offsets of msg (formatted from fmt and ap) into offs. */
int logfmt_kv_find(const char *fmt, va_list ap, const char *msg, size_t ml, size_t *offs);
/* The JSON object and its newline, through the JSON escaper esc; needs
 * LOG_JSON_MAX of room (0 without). */
size_t logfmt_json(char *out, size_t cap, const log_rec *r, size_t (*esc)(char *, const char *, size_t));

#endif
