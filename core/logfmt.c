/* logfmt — a log line's two forms (see logfmt.h). */
#include "core/logfmt.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/daemon.h"

static const char *const log_names[] = {"DEBUG", "INFO", "WARN", "ERROR"};
static const char *const log_lnames[] = {"debug", "info", "warn", "error"};


size_t logfmt_text(char *out, size_t cap, const log_rec *r) {
  struct tm tm;
  gmtime_r(&r->tv.tv_sec, &tm);
  int n = snprintf(out, cap, "%04d-%02d-%02d %02d:%02d:%02d.%03d [%s] %s:%d [%s] %.*s\n", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (int)(r->tv.tv_usec / 1000),
                   log_names[r->lvl], r->src, r->line, conch.sandbox_id[0] ? conch.sandbox_id : "-",
                   (int)r->msglen, r->msg);
  if (n < 0) return 0;
  if ((size_t)n >= cap) {
    out[cap - 1] = '\n';
    return cap;
  }
  return (size_t)n;
}

static int key_char(char c, int first) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (!first && ((c >= '0' && c <= '9') || c == '.' || c == '-'));
}

/* 1 when a "key=" starts at p (key: [A-Za-z_][A-Za-z0-9_.-]*). */
static int key_at(const char *p, const char *end) {
  if (p >= end || !key_char(*p, 1)) return 0;
  while (p < end && key_char(*p, 0)) p++;
  return p < end && *p == '=';
}


static int kv_reserved(const char *k, size_t n) {
  static const char *const r[] = {"ts", "level", "src", "sandboxId", "msg"};
  for (size_t i = 0; i < sizeof r / sizeof r[0]; i++)
    if (strlen(r[i]) == n && memcmp(r[i], k, n) == 0) return 1;
  return 0;
}

/* The key/values are the format's own " key=" words (or a "key=" that
 * starts it): text an argument brings (a command line, a file name) never
 * makes a key, and a reserved or repeated key stays part of the value
 * before it.  Each one's key offset in the formatted message (ml bytes)
 * goes into offs, in order; returns how many. */
int logfmt_kv_find(const char *fmt, va_list ap, const char *msg, size_t ml, size_t *offs) {
  char prefix[LOG_LINE_MAX];
  const char *names[LOG_KV_MAX];
  size_t lens[LOG_KV_MAX];
  size_t fl = strlen(fmt);
  int n = 0;
  for (size_t i = 0; i < fl && n < LOG_KV_MAX && i + 1 < sizeof prefix;) {
    if (fmt[i] == '%') { /* past the conversion: flags, width, precision, length, letter */
      i++;
      if (i < fl && fmt[i] == '%') {
        i++;
        continue;
      }
      while (i < fl && strchr("#0- +'*.0123456789hlLqjzt", fmt[i])) i++;
      if (i < fl) i++;
      continue;
    }
    size_t k = i == 0 ? 0 : i + 1; /* the key's start in fmt */
    if ((i == 0 || fmt[i] == ' ') && key_at(fmt + k, fmt + fl)) {
      const char *eq = strchr(fmt + k, '=');
      size_t kl = (size_t)(eq - (fmt + k));
      int dup = kv_reserved(fmt + k, kl);
      for (int j = 0; j < n && !dup; j++) dup = lens[j] == kl && memcmp(names[j], fmt + k, kl) == 0;
      if (!dup) {
        memcpy(prefix, fmt, k);
        prefix[k] = 0;
        va_list c;
        va_copy(c, ap);
        /* prefix is a leading part of the caller's literal format, cut
         * after a whole conversion: it reads the same arguments */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        int at = vsnprintf(NULL, 0, prefix, c);
#pragma GCC diagnostic pop
        va_end(c);
        /* the same key at that place in the message (not cut off) */
        if (at < 0 || (size_t)at + kl >= ml || memcmp(msg + at, fmt + k, kl + 1) != 0) break;
        names[n] = fmt + k;
        lens[n] = kl;
        offs[n++] = (size_t)at;
      }
    }
    i++;
  }
  return n;
}

/* {"ts":"…Z","level":…,"src":…,"sandboxId":…,"msg":…,"k":"v",…}: the
 * message is what comes before its first key (r->kv), each value runs to
 * the next key's space.  Needs LOG_JSON_MAX of room. */
size_t logfmt_json(char *out, size_t cap, const log_rec *r, size_t (*esc)(char *, const char *, size_t)) {
  if (!esc || cap < LOG_JSON_MAX) return 0;
  struct tm tm;
  gmtime_r(&r->tv.tv_sec, &tm);
  char src[300];
  int sl = snprintf(src, sizeof src, "%s:%d", r->src, r->line);
  if (sl < 0 || (size_t)sl >= sizeof src) sl = (int)sizeof src - 1;
  size_t n = (size_t)snprintf(out, cap, "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",\"level\":\"%s\",\"src\":",
                              tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                              (int)(r->tv.tv_usec / 1000), log_lnames[r->lvl]);
  n += esc(out + n, src, (size_t)sl);
  memcpy(out + n, ",\"sandboxId\":", 13);
  n += 13;
  size_t sidlen = strnlen(conch.sandbox_id, sizeof conch.sandbox_id);
  n += esc(out + n, conch.sandbox_id, sidlen > 255 ? 255 : sidlen);
  memcpy(out + n, ",\"msg\":", 7);
  n += 7;
  const char *m = r->msg;
  size_t me = r->nkv ? (r->kv[0] ? r->kv[0] - 1 : 0) : r->msglen;
  n += esc(out + n, m, me);
  for (int i = 0; i < r->nkv; i++) {
    const char *k = m + r->kv[i];
    const char *eq = memchr(k, '=', r->msglen - r->kv[i]);
    size_t ve = i + 1 < r->nkv ? r->kv[i + 1] - 1 : r->msglen;
    out[n++] = ',';
    n += esc(out + n, k, (size_t)(eq - k));
    out[n++] = ':';
    n += esc(out + n, eq + 1, ve - (size_t)(eq + 1 - m));
  }
  out[n++] = '}';
  out[n++] = '\n';
  return n;
}
