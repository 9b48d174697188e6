/* rtt — StartProcess round-trip / stdout-throughput client (tests/bench/process.sh).
 *
 *   rtt --port P [--host H] [--token T] [--h2] [-n N] [-w W]
 *       [--expect-stdout BYTES] [--window BYTES] [-o FILE] -- CMD [ARG...]
 *   rtt --port P [--h2] [-n N] [-w W] [-o FILE] --health
 *
 * Opens ONE connection (HTTP/1.1 keep-alive over a raw socket, or h2c with
 * prior knowledge through libnghttp2's client API) and makes W untimed, then
 * N timed, sequential calls of a foreground StartProcess{cmd, args} with the
 * Connect streaming proto codec (`application/connect+proto`, one request
 * envelope), reading envelopes until the end-stream one.  Each call must
 * be: HTTP 200, `start{pid>0}` first, `data` events, `end{exit 0, "exited"}`,
 * then the end-stream envelope without an error, and nothing after it.  With
 * --expect-stdout every call must carry exactly that many stdout bytes.
 * --health times `GET /health` instead (a transport-only reference).
 *
 * Output: one stats line (see stats.h) labelled "rtt", followed by
 * `calls=… seconds=… stdout_bytes=… mib_s=… reconnects=…` over the timed
 * calls; -o appends the raw samples (ns) to FILE.  Any failed call prints
 * the reason and exits 1.
 *
 * The token comes from --token or $CONCH_INIT_TOKEN; --user U adds the
 * conch-init-user header (tests/bench/users.sh).
 */
#include "stats.h"

#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <nghttp2/nghttp2.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#define RTT_MAX_MSG (16u * 1024 * 1024 + 1024) /* server's message cap + slack */
#define RTT_RBUF (256u * 1024)                 /* socket read buffer */
#define RTT_HDR_MAX (64u * 1024)               /* response header block */
#define RTT_ERRBODY 1024                       /* kept bytes of a non-stream body */

/* ------------------------------------------------------------ failures */

static char rtt_why[512];

static int rtt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int rtt_fail(const char *fmt, ...) {
  if (rtt_why[0]) return -1; /* keep the first reason */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(rtt_why, sizeof rtt_why, fmt, ap);
  va_end(ap);
  return -1;
}

/* ------------------------------------------------------------ protobuf reading */

struct pb {
  const uint8_t *p, *end;
};

static int pb_varint(struct pb *b, uint64_t *out) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (b->p >= b->end) return -1;
    uint8_t c = *b->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if (!(c & 0x80)) {
      *out = v;
      return 0;
    }
  }
  return -1;
}

/* next field: *num, *wt; for wire type 2 sets *val and *vlen, for 0 sets *u */
static int pb_field(struct pb *b, uint32_t *num, int *wt, const uint8_t **val, size_t *vlen, uint64_t *u) {
  uint64_t key;
  if (pb_varint(b, &key)) return -1;
  *num = (uint32_t)(key >> 3);
  *wt = (int)(key & 7);
  if (*num == 0) return -1;
  switch (*wt) {
    case 0: return pb_varint(b, u);
    case 1:
      if (b->end - b->p < 8) return -1;
      b->p += 8;
      return 0;
    case 5:
      if (b->end - b->p < 4) return -1;
      b->p += 4;
      return 0;
    case 2: {
      uint64_t len;
      if (pb_varint(b, &len) || len > (uint64_t)(b->end - b->p)) return -1;
      *val = b->p;
      *vlen = (size_t)len;
      b->p += len;
      return 0;
    }
    default: return -1;
  }
}

/* ------------------------------------------------------------ event stream */

/* Consumes the response body of one StartProcess call, envelope by envelope.
 * Payloads that arrive whole in one span are parsed in place; others are
 * gathered in `buf` (bounded by RTT_MAX_MSG). */
struct evs {
  uint8_t hdr[5];
  size_t hlen;
  uint32_t plen;
  uint8_t *buf;
  size_t cap, have;
  bool saw_start, saw_end, saw_eos;
  int64_t exit_code;
  char status[64], error[256];
  uint64_t stdout_bytes, stderr_bytes, events;
};

static void evs_reset(struct evs *e) {
  uint8_t *buf = e->buf;
  size_t cap = e->cap;
  memset(e, 0, sizeof *e);
  e->buf = buf;
  e->cap = cap;
}

static void evs_copy_str(char *dst, size_t dsz, const uint8_t *s, size_t n) {
  if (n >= dsz) n = dsz - 1;
  memcpy(dst, s, n);
  dst[n] = 0;
}

static int evs_data(struct evs *e, const uint8_t *p, size_t n) {
  struct pb b = {p, p + n};
  while (b.p < b.end) {
    uint32_t f;
    int wt;
    const uint8_t *v = NULL;
    size_t vl = 0;
    uint64_t u;
    if (pb_field(&b, &f, &wt, &v, &vl, &u)) return rtt_fail("malformed ProcessDataEvent");
    if (wt != 2) continue;
    if (f == 1) e->stdout_bytes += vl;
    else if (f == 2) e->stderr_bytes += vl;
    else if (f == 3) e->stdout_bytes += vl; /* pty output counts as stdout */
  }
  return 0;
}

static int evs_end(struct evs *e, const uint8_t *p, size_t n) {
  struct pb b = {p, p + n};
  while (b.p < b.end) {
    uint32_t f;
    int wt;
    const uint8_t *v = NULL;
    size_t vl = 0;
    uint64_t u = 0;
    if (pb_field(&b, &f, &wt, &v, &vl, &u)) return rtt_fail("malformed ProcessEndEvent");
    if (f == 1 && wt == 0) e->exit_code = (int32_t)(uint32_t)u;
    else if (f == 3 && wt == 2) evs_copy_str(e->status, sizeof e->status, v, vl);
    else if (f == 4 && wt == 2) evs_copy_str(e->error, sizeof e->error, v, vl);
  }
  return 0;
}

static int evs_message(struct evs *e, uint8_t flags, const uint8_t *p, size_t n) {
  if (flags & 0x02) {
    char json[512];
    evs_copy_str(json, sizeof json, p, n);
    e->saw_eos = true;
    if (strstr(json, "\"error\"")) return rtt_fail("stream ended with an error: %s", json);
    return 0;
  }
  e->events++;
  struct pb b = {p, p + n};
  int kinds = 0;
  while (b.p < b.end) {
    uint32_t f;
    int wt;
    const uint8_t *v = NULL;
    size_t vl = 0;
    uint64_t u;
    if (pb_field(&b, &f, &wt, &v, &vl, &u)) return rtt_fail("malformed ProcessEvent");
    if (wt != 2 || f < 1 || f > 4) continue;
    kinds++;
    if (e->saw_end) return rtt_fail("event after the end event");
    if (f == 1) {
      if (e->saw_start || e->events != 1) return rtt_fail("start event is not the first event");
      struct pb s = {v, v + vl};
      int64_t pid = 0;
      while (s.p < s.end) {
        uint32_t sf;
        int swt;
        const uint8_t *sv;
        size_t svl;
        uint64_t su = 0;
        if (pb_field(&s, &sf, &swt, &sv, &svl, &su)) return rtt_fail("malformed ProcessStartEvent");
        if (sf == 1 && swt == 0) pid = (int32_t)(uint32_t)su;
      }
      if (pid <= 0) return rtt_fail("start event without a pid");
      e->saw_start = true;
    } else {
      if (!e->saw_start) return rtt_fail("event before the start event");
      if (f == 2 && evs_data(e, v, vl)) return -1;
      if (f == 3) {
        if (evs_end(e, v, vl)) return -1;
        e->saw_end = true;
      }
    }
  }
  if (kinds != 1) return rtt_fail("ProcessEvent with %d event kinds", kinds);
  return 0;
}

static int evs_feed(struct evs *e, const uint8_t *p, size_t n) {
  while (n > 0) {
    if (e->saw_eos) return rtt_fail("%zu bytes after the end-stream envelope", n);
    if (e->hlen < 5) {
      size_t k = 5 - e->hlen < n ? 5 - e->hlen : n;
      memcpy(e->hdr + e->hlen, p, k);
      e->hlen += k;
      p += k;
      n -= k;
      if (e->hlen < 5) return 0;
      e->plen = (uint32_t)e->hdr[1] << 24 | (uint32_t)e->hdr[2] << 16 | (uint32_t)e->hdr[3] << 8 | e->hdr[4];
      if (e->hdr[0] & ~0x03u) return rtt_fail("unknown envelope flags 0x%02x", e->hdr[0]);
      if (e->hdr[0] & 0x01) return rtt_fail("compressed envelope (none was negotiated)");
      if (e->plen > RTT_MAX_MSG) return rtt_fail("envelope of %u bytes", e->plen);
      e->have = 0;
      if (e->plen == 0) {
        e->hlen = 0;
        if (evs_message(e, e->hdr[0], p, 0)) return -1;
        continue;
      }
    }
    if (e->have == 0 && n >= e->plen) { /* whole payload in this span: parse in place */
      size_t k = e->plen;
      e->hlen = 0;
      if (evs_message(e, e->hdr[0], p, k)) return -1;
      p += k;
      n -= k;
      continue;
    }
    if (e->cap < e->plen) {
      uint8_t *nb = realloc(e->buf, e->plen);
      if (!nb) return rtt_fail("out of memory");
      e->buf = nb;
      e->cap = e->plen;
    }
    size_t k = e->plen - e->have < n ? e->plen - e->have : n;
    memcpy(e->buf + e->have, p, k);
    e->have += k;
    p += k;
    n -= k;
    if (e->have == e->plen) {
      e->hlen = 0;
      e->have = 0;
      if (evs_message(e, e->hdr[0], e->buf, e->plen)) return -1;
    }
  }
  return 0;
}

/* called when the body is complete */
static int evs_finish(struct evs *e, uint64_t expect_stdout, bool check_stdout) {
  if (e->hlen || e->have) return rtt_fail("body ends inside an envelope");
  if (!e->saw_eos) return rtt_fail("no end-stream envelope");
  if (!e->saw_start) return rtt_fail("no start event");
  if (!e->saw_end) return rtt_fail("no end event");
  if (e->exit_code != 0 || strcmp(e->status, "exited") != 0)
    return rtt_fail("process ended with exit_code=%lld status=\"%s\" error=\"%s\"", (long long)e->exit_code,
                    e->status, e->error);
  if (check_stdout && e->stdout_bytes != expect_stdout)
    return rtt_fail("stdout carried %llu bytes, expected %llu", (unsigned long long)e->stdout_bytes,
                    (unsigned long long)expect_stdout);
  return 0;
}

/* ------------------------------------------------------------ one call's response sink */

struct call {
  /* request */
  bool health;
  const char *path, *method;
  const uint8_t *body;
  size_t blen;
  /* response */
  int status;
  bool ctype_ok;
  struct evs *ev;
  char errbody[RTT_ERRBODY + 1];
  size_t errlen;
};

static int call_body(struct call *c, const uint8_t *p, size_t n) {
  if (c->status == 200 && !c->health) {
    if (!c->ctype_ok) return rtt_fail("200 response without Content-Type application/connect+proto");
    return evs_feed(c->ev, p, n);
  }
  size_t k = RTT_ERRBODY - c->errlen < n ? RTT_ERRBODY - c->errlen : n;
  memcpy(c->errbody + c->errlen, p, k);
  c->errlen += k;
  c->errbody[c->errlen] = 0;
  return 0;
}

static int call_done(struct call *c, uint64_t expect_stdout, bool check_stdout) {
  if (c->health) {
    static const char want[] = "{\"status\":\"OK\",\"message\":\"OK\"}";
    if (c->status != 200 || strcmp(c->errbody, want) != 0)
      return rtt_fail("/health answered %d: %s", c->status, c->errbody);
    return 0;
  }
  if (c->status != 200) return rtt_fail("HTTP status %d: %s", c->status, c->errbody);
  return evs_finish(c->ev, expect_stdout, check_stdout);
}

static bool ctype_is_connect_proto(const char *v, size_t n) {
  static const char want[] = "application/connect+proto";
  size_t wl = sizeof want - 1;
  return n >= wl && strncasecmp(v, want, wl) == 0 && (n == wl || v[wl] == ';' || v[wl] == ' ');
}

/* ------------------------------------------------------------ socket */

static int tcp_connect(const char *host, const char *port) {
  struct addrinfo hints = {0}, *res, *ai;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  int rc = getaddrinfo(host, port, &hints, &res);
  if (rc) return rtt_fail("getaddrinfo %s:%s: %s", host, port, gai_strerror(rc));
  int fd = -1;
  for (ai = res; ai; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return rtt_fail("connect %s:%s: %s", host, port, strerror(errno));
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

static int write_all(int fd, const uint8_t *p, size_t n) {
  while (n > 0) {
    ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0) {
      if (errno == EINTR) continue;
      return rtt_fail("send: %s", strerror(errno));
    }
    p += k;
    n -= (size_t)k;
  }
  return 0;
}

/* ------------------------------------------------------------ HTTP/1.1 */

static const char *rtt_user; /* --user: the conch-init-user header, or NULL */

struct h1 {
  const char *host, *port, *token;
  int fd;
  uint8_t *rb;
  size_t roff, rlen; /* unread bytes are rb[roff, rlen) */
  unsigned reconnects;
};

/* read more bytes; 0 on success, -1 on error/EOF */
static int h1_fill(struct h1 *h) {
  if (h->roff > 0 && (h->roff == h->rlen || h->rlen > RTT_RBUF / 2)) {
    memmove(h->rb, h->rb + h->roff, h->rlen - h->roff);
    h->rlen -= h->roff;
    h->roff = 0;
  }
  if (h->rlen == RTT_RBUF) return rtt_fail("HTTP/1.1 line or header block too long");
  for (;;) {
    ssize_t k = recv(h->fd, h->rb + h->rlen, RTT_RBUF - h->rlen, 0);
    if (k > 0) {
      h->rlen += (size_t)k;
      return 0;
    }
    if (k == 0) return rtt_fail("server closed the connection mid-response");
    if (errno != EINTR) return rtt_fail("recv: %s", strerror(errno));
  }
}

/* a CRLF-terminated line at rb+roff: returns its length (without CRLF), reading as needed */
static ssize_t h1_line(struct h1 *h, size_t max) {
  for (;;) {
    uint8_t *s = h->rb + h->roff;
    size_t avail = h->rlen - h->roff;
    uint8_t *nl = memchr(s, '\n', avail);
    if (nl) {
      size_t len = (size_t)(nl - s);
      if (len == 0 || s[len - 1] != '\r') return rtt_fail("HTTP/1.1 line not terminated by CRLF");
      return (ssize_t)(len - 1);
    }
    if (avail > max) return rtt_fail("HTTP/1.1 line longer than %zu bytes", max);
    if (h1_fill(h)) return -1;
  }
}

static int h1_open(struct h1 *h) {
  if (h->fd >= 0) close(h->fd);
  h->fd = tcp_connect(h->host, h->port);
  h->roff = h->rlen = 0;
  return h->fd < 0 ? -1 : 0;
}

static int h1_call(struct h1 *h, struct call *c) {
  char head[8192];
  int hl;
  if (c->health)
    hl = snprintf(head, sizeof head, "GET /health HTTP/1.1\r\nHost: %s:%s\r\n\r\n", h->host, h->port);
  else
    hl = snprintf(head, sizeof head,
                  "POST %s HTTP/1.1\r\nHost: %s:%s\r\nconch-init-token: %s\r\n%s%s%s"
                  "Content-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\n"
                  "Content-Length: %zu\r\n\r\n",
                  c->path, h->host, h->port, h->token, rtt_user ? "conch-init-user: " : "",
                  rtt_user ? rtt_user : "", rtt_user ? "\r\n" : "", c->blen);
  if (hl < 0 || (size_t)hl >= sizeof head) return rtt_fail("request head too long");
  if (write_all(h->fd, (const uint8_t *)head, (size_t)hl)) return -1;
  if (c->blen && write_all(h->fd, c->body, c->blen)) return -1;

  /* status line and headers */
  ssize_t ll = h1_line(h, RTT_HDR_MAX);
  if (ll < 0) return -1;
  char *s = (char *)h->rb + h->roff;
  if (ll < 12 || strncmp(s, "HTTP/1.1 ", 9) != 0) return rtt_fail("bad status line");
  c->status = atoi(s + 9);
  h->roff += (size_t)ll + 2;
  bool chunked = false, close_after = false;
  long long clen = -1;
  size_t hdr_total = (size_t)ll;
  for (;;) {
    ll = h1_line(h, RTT_HDR_MAX);
    if (ll < 0) return -1;
    hdr_total += (size_t)ll + 2;
    if (hdr_total > RTT_HDR_MAX) return rtt_fail("response header block over 64 KiB");
    char *l = (char *)h->rb + h->roff;
    h->roff += (size_t)ll + 2;
    if (ll == 0) break;
    char *colon = memchr(l, ':', (size_t)ll);
    if (!colon) return rtt_fail("header line without a colon");
    size_t nl = (size_t)(colon - l);
    char *v = colon + 1;
    size_t vl = (size_t)(l + ll - v);
    while (vl && (*v == ' ' || *v == '\t')) v++, vl--;
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t')) vl--;
    if (nl == 17 && strncasecmp(l, "transfer-encoding", nl) == 0) {
      if (vl == 7 && strncasecmp(v, "chunked", 7) == 0) chunked = true;
      else return rtt_fail("unsupported Transfer-Encoding");
    } else if (nl == 14 && strncasecmp(l, "content-length", nl) == 0) {
      char tmp[32];
      if (vl == 0 || vl >= sizeof tmp) return rtt_fail("bad Content-Length");
      memcpy(tmp, v, vl);
      tmp[vl] = 0;
      uint64_t x;
      if (stats_parse_count(tmp, (uint64_t)1 << 50, &x)) return rtt_fail("bad Content-Length");
      clen = (long long)x;
    } else if (nl == 12 && strncasecmp(l, "content-type", nl) == 0) {
      c->ctype_ok = ctype_is_connect_proto(v, vl);
    } else if (nl == 10 && strncasecmp(l, "connection", nl) == 0) {
      if (vl == 5 && strncasecmp(v, "close", 5) == 0) close_after = true;
    }
  }
  if (c->status >= 100 && c->status < 200) return rtt_fail("unexpected interim response %d", c->status);

  /* body */
  if (chunked) {
    for (;;) {
      ll = h1_line(h, 1024);
      if (ll < 0) return -1;
      char *l = (char *)h->rb + h->roff;
      uint64_t size = 0;
      int digits = 0;
      for (ssize_t i = 0; i < ll && l[i] != ';' && l[i] != ' ' && l[i] != '\t'; i++, digits++) {
        int d = (l[i] >= '0' && l[i] <= '9')   ? l[i] - '0'
                : (l[i] >= 'a' && l[i] <= 'f') ? l[i] - 'a' + 10
                : (l[i] >= 'A' && l[i] <= 'F') ? l[i] - 'A' + 10
                                               : -1;
        if (d < 0 || digits >= 15) return rtt_fail("bad chunk size line");
        size = size * 16 + (uint64_t)d;
      }
      if (digits == 0) return rtt_fail("bad chunk size line");
      h->roff += (size_t)ll + 2;
      if (size == 0) break;
      while (size > 0) {
        if (h->roff == h->rlen && h1_fill(h)) return -1;
        size_t avail = h->rlen - h->roff;
        size_t k = avail < size ? avail : (size_t)size;
        if (call_body(c, h->rb + h->roff, k)) return -1;
        h->roff += k;
        size -= k;
      }
      while (h->rlen - h->roff < 2)
        if (h1_fill(h)) return -1;
      if (h->rb[h->roff] != '\r' || h->rb[h->roff + 1] != '\n') return rtt_fail("chunk data not followed by CRLF");
      h->roff += 2;
    }
    for (;;) { /* trailers */
      ll = h1_line(h, RTT_HDR_MAX);
      if (ll < 0) return -1;
      h->roff += (size_t)ll + 2;
      if (ll == 0) break;
    }
  } else if (clen >= 0) {
    uint64_t left = (uint64_t)clen;
    while (left > 0) {
      if (h->roff == h->rlen && h1_fill(h)) return -1;
      size_t avail = h->rlen - h->roff;
      size_t k = avail < left ? avail : (size_t)left;
      if (call_body(c, h->rb + h->roff, k)) return -1;
      h->roff += k;
      left -= k;
    }
  } else {
    return rtt_fail("response %d has neither chunked encoding nor Content-Length", c->status);
  }
  if (h->roff != h->rlen) return rtt_fail("%zu unexpected bytes after the response", h->rlen - h->roff);
  if (close_after) { /* honour it, and count it: keep-alive was expected */
    h->reconnects++;
    if (h1_open(h)) return -1;
  }
  return 0;
}

/* ------------------------------------------------------------ h2c */

struct h2 {
  int fd;
  nghttp2_session *s;
  struct call *c;
  int32_t sid;
  bool closed;
  uint32_t close_code;
  size_t boff;
  uint8_t *rb;
};

static int h2_on_header(nghttp2_session *s, const nghttp2_frame *f, const uint8_t *name, size_t nl,
                        const uint8_t *value, size_t vl, uint8_t flags, void *ud) {
  struct h2 *h = ud;
  if (f->hd.stream_id != h->sid || f->hd.type != NGHTTP2_HEADERS) return 0;
  if (nl == 7 && memcmp(name, ":status", 7) == 0) {
    char tmp[8];
    if (vl >= sizeof tmp) return 0;
    memcpy(tmp, value, vl);
    tmp[vl] = 0;
    /* a trailer block carries no :status; only the first sets it */
    if (!h->c->status) h->c->status = atoi(tmp);
  } else if (nl == 12 && memcmp(name, "content-type", 12) == 0) {
    h->c->ctype_ok = ctype_is_connect_proto((const char *)value, vl);
  }
  return 0;
}

static int h2_on_data(nghttp2_session *s, uint8_t flags, int32_t sid, const uint8_t *data, size_t len, void *ud) {
  struct h2 *h = ud;
  if (sid != h->sid) return 0;
  if (call_body(h->c, data, len)) return NGHTTP2_ERR_CALLBACK_FAILURE;
  return 0;
}

static int h2_on_close(nghttp2_session *s, int32_t sid, uint32_t code, void *ud) {
  struct h2 *h = ud;
  if (sid == h->sid) {
    h->closed = true;
    h->close_code = code;
  }
  return 0;
}

static ssize_t h2_read_body(nghttp2_session *s, int32_t sid, uint8_t *buf, size_t len, uint32_t *flags,
                            nghttp2_data_source *src, void *ud) {
  struct h2 *h = ud;
  size_t k = h->c->blen - h->boff < len ? h->c->blen - h->boff : len;
  memcpy(buf, h->c->body + h->boff, k);
  h->boff += k;
  if (h->boff == h->c->blen) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return (ssize_t)k;
}

static int h2_flush(struct h2 *h) {
  for (;;) {
    const uint8_t *d;
    ssize_t n = nghttp2_session_mem_send(h->s, &d);
    if (n < 0) return rtt_fail("nghttp2_session_mem_send: %s", nghttp2_strerror((int)n));
    if (n == 0) return 0;
    if (write_all(h->fd, d, (size_t)n)) return -1;
  }
}

static int h2_open(struct h2 *h, const char *host, const char *port, int32_t window) {
  nghttp2_session_callbacks *cb;
  if (nghttp2_session_callbacks_new(&cb)) return rtt_fail("nghttp2: out of memory");
  nghttp2_session_callbacks_set_on_header_callback(cb, h2_on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(cb, h2_on_data);
  nghttp2_session_callbacks_set_on_stream_close_callback(cb, h2_on_close);
  int rc = nghttp2_session_client_new(&h->s, cb, h);
  nghttp2_session_callbacks_del(cb);
  if (rc) return rtt_fail("nghttp2_session_client_new: %s", nghttp2_strerror(rc));
  nghttp2_settings_entry iv[] = {{NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
                                 {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, (uint32_t)window}};
  if ((rc = nghttp2_submit_settings(h->s, NGHTTP2_FLAG_NONE, iv, 2)) ||
      (rc = nghttp2_session_set_local_window_size(h->s, NGHTTP2_FLAG_NONE, 0, window)))
    return rtt_fail("nghttp2 settings: %s", nghttp2_strerror(rc));
  h->fd = tcp_connect(host, port);
  if (h->fd < 0) return -1;
  return h2_flush(h); /* client preface + SETTINGS */
}

static int h2_call(struct h2 *h, struct call *c, const char *authority, const char *token) {
#define NV(n, v) {(uint8_t *)(n), (uint8_t *)(v), sizeof(n) - 1, strlen(v), NGHTTP2_NV_FLAG_NONE}
  nghttp2_nv hdrs[] = {
      NV(":method", c->method), NV(":scheme", "http"), NV(":authority", authority), NV(":path", c->path),
      NV("content-type", "application/connect+proto"), NV("connect-protocol-version", "1"),
      NV("conch-init-token", token), NV("conch-init-user", rtt_user ? rtt_user : ""),
  };
#undef NV
  h->c = c;
  h->closed = false;
  h->close_code = 0;
  h->boff = 0;
  nghttp2_data_provider dp = {.source = {.ptr = NULL}, .read_callback = h2_read_body};
  size_t nh = c->health ? 4 : sizeof hdrs / sizeof hdrs[0] - (rtt_user ? 0 : 1);
  h->sid = nghttp2_submit_request(h->s, NULL, hdrs, nh, c->health ? NULL : &dp, h);
  if (h->sid < 0) return rtt_fail("nghttp2_submit_request: %s", nghttp2_strerror(h->sid));
  while (!h->closed) {
    if (h2_flush(h)) return -1;
    if (!nghttp2_session_want_read(h->s)) return rtt_fail("h2 session ended before the stream closed");
    ssize_t k = recv(h->fd, h->rb, RTT_RBUF, 0);
    if (k == 0) return rtt_fail("server closed the h2 connection mid-stream");
    if (k < 0) {
      if (errno == EINTR) continue;
      return rtt_fail("recv: %s", strerror(errno));
    }
    ssize_t r = nghttp2_session_mem_recv(h->s, h->rb, (size_t)k);
    if (r < 0) return rtt_fail("nghttp2_session_mem_recv: %s", nghttp2_strerror((int)r));
  }
  if (h2_flush(h)) return -1; /* WINDOW_UPDATEs etc. */
  if (h->close_code != NGHTTP2_NO_ERROR) return rtt_fail("stream reset with h2 error %u", h->close_code);
  return 0;
}

/* ------------------------------------------------------------ request bytes */

static size_t put_varint(uint8_t *o, uint64_t v) {
  size_t n = 0;
  do {
    o[n] = (uint8_t)(v & 0x7f);
    v >>= 7;
    if (v) o[n] |= 0x80;
    n++;
  } while (v);
  return n;
}

/* envelope{flags 0, StartProcessRequest{1: cmd, 2: args…}} in a new buffer */
static uint8_t *build_request(char **argv, int argc, size_t *len) {
  size_t cap = 5;
  for (int i = 0; i < argc; i++) cap += 11 + strlen(argv[i]);
  uint8_t *b = malloc(cap);
  if (!b) return NULL;
  size_t n = 5;
  for (int i = 0; i < argc; i++) {
    size_t sl = strlen(argv[i]);
    b[n++] = (uint8_t)((i == 0 ? 1 : 2) << 3 | 2);
    n += put_varint(b + n, sl);
    memcpy(b + n, argv[i], sl);
    n += sl;
  }
  uint32_t pl = (uint32_t)(n - 5);
  b[0] = 0;
  b[1] = (uint8_t)(pl >> 24);
  b[2] = (uint8_t)(pl >> 16);
  b[3] = (uint8_t)(pl >> 8);
  b[4] = (uint8_t)pl;
  *len = n;
  return b;
}

/* ------------------------------------------------------------ main */

static const char usage[] =
    "usage: rtt --port P [--host H] [--token T] [--user U] [--h2] [-n N] [-w W] [-G GAP_MS]\n"
    "           [--expect-stdout BYTES] [--window BYTES] [-o FILE] -- CMD [ARG...]\n"
    "       rtt --port P [--host H] [--h2] [-n N] [-w W] [-o FILE] --health\n";

int main(int argc, char **argv) {
  const char *host = "127.0.0.1", *port = NULL, *token = getenv("CONCH_INIT_TOKEN");
  bool use_h2 = false, health = false, check_stdout = false;
  uint64_t expect = 0, window = 4u << 20;
  stats_run o = {.n = 2000, .w = 100};
  static const struct option opts[] = {
      {"host", required_argument, NULL, 'H'}, {"port", required_argument, NULL, 'p'},
      {"token", required_argument, NULL, 't'}, {"h2", no_argument, NULL, '2'},
      {"health", no_argument, NULL, 'g'},     {"expect-stdout", required_argument, NULL, 'e'},
      {"window", required_argument, NULL, 'W'}, {"help", no_argument, NULL, 'h'},
      {"user", required_argument, NULL, 'u'},
      {NULL, 0, NULL, 0}};
  int ch;
  while ((ch = getopt_long(argc, argv, "+" STATS_RUN_OPTS "h", opts, NULL)) != -1) {
    int t = stats_run_opt(&o, ch, optarg);
    if (t < 0) goto usage;
    if (t > 0) continue;
    switch (ch) {
      case 'H': host = optarg; break;
      case 'p': port = optarg; break;
      case 't': token = optarg; break;
      case 'u': rtt_user = optarg; break;
      case '2': use_h2 = true; break;
      case 'g': health = true; break;
      case 'e':
        if (stats_parse_count(optarg, UINT64_MAX / 2, &expect)) goto usage;
        check_stdout = true;
        break;
      case 'W':
        if (stats_parse_count(optarg, 0x7fffffff, &window) || window < 65535) goto usage;
        break;
      case 'h': fputs(usage, stdout); return 0;
      default: goto usage;
    }
  }
  if (!port || (health ? optind != argc : optind >= argc)) goto usage;
  if (!health && (!token || !*token)) {
    fprintf(stderr, "rtt: no token (--token or $CONCH_INIT_TOKEN)\n");
    return 2;
  }
  if (!token) token = "";

  size_t blen = 0;
  uint8_t *body = NULL;
  if (!health && !(body = build_request(argv + optind, argc - optind, &blen))) return 1;
  struct evs ev = {0};
  uint64_t *v = calloc(o.n, sizeof *v);
  uint8_t *rb = malloc(RTT_RBUF);
  char authority[300], where[64] = "";
  snprintf(authority, sizeof authority, "%s:%s", host, port);
  struct h1 c1 = {.host = host, .port = port, .token = token, .fd = -1, .rb = rb};
  struct h2 c2 = {.fd = -1, .rb = rb};
  uint64_t total_ns = 0, total_stdout = 0;
  int rc = 1;
  if (!v || !rb) {
    rtt_fail("out of memory");
    goto out;
  }
  if (use_h2 ? h2_open(&c2, host, port, (int32_t)window) : h1_open(&c1)) goto out;

  for (uint64_t i = 0; i < o.w + o.n; i++) {
    struct call c = {.health = health,
                     .path = health ? "/health" : "/pb.ProcessService/StartProcess",
                     .method = health ? "GET" : "POST",
                     .body = body,
                     .blen = blen,
                     .ev = &ev};
    evs_reset(&ev);
    if (o.gap_ms) stats_sleep_ms(o.gap_ms);
    uint64_t t0 = stats_now_ns();
    if ((use_h2 ? h2_call(&c2, &c, authority, token) : h1_call(&c1, &c)) ||
        call_done(&c, expect, check_stdout)) {
      snprintf(where, sizeof where, "call %llu%s: ", (unsigned long long)(i < o.w ? i + 1 : i - o.w + 1),
               i < o.w ? " (warm-up)" : "");
      goto out;
    }
    uint64_t dt = stats_now_ns() - t0;
    if (i >= o.w) {
      v[i - o.w] = dt;
      total_ns += dt;
      total_stdout += ev.stdout_bytes;
    }
  }
  if (o.raw && stats_dump(o.raw, v, o.n)) {
    rtt_fail("cannot write %s", o.raw);
    goto out;
  }
  stats_print(stdout, "rtt", v, o.n);
  printf("calls=%llu seconds=%.6f stdout_bytes=%llu mib_s=%.1f reconnects=%u\n", (unsigned long long)o.n,
         total_ns / 1e9, (unsigned long long)total_stdout,
         total_ns ? total_stdout / 1048576.0 / (total_ns / 1e9) : 0.0, c1.reconnects);
  rc = 0;
out:
  if (rc) fprintf(stderr, "rtt: %s%s\n", where, rtt_why[0] ? rtt_why : "failed");
  if (c2.s) nghttp2_session_del(c2.s);
  if (c1.fd >= 0) close(c1.fd);
  if (c2.fd >= 0) close(c2.fd);
  free(ev.buf);
  free(v);
  free(rb);
  free(body);
  return rc;
usage:
  fputs(usage, stderr);
  return 2;
}
