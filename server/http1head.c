/* http1head — the syntax of an HTTP/1.1 request head and the reason
 * phrases of a response's; see http1head.h. */
#include "server/http1head.h"

#include <http_parser.h>
#include <string.h>
#include <strings.h>

/* RFC 9110 token characters: what a field name may hold. */
int h1_is_token(const char *p, size_t n) {
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)p[i];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9')) continue;
    if (!strchr("!#$%&'*+-.^_`|~", ch) || ch == 0) return 0;
  }
  return 1;
}

/* The raw request head, checked before http_parser sees it: it accepts
 * obs-fold continuation lines and lines ended by a bare LF (or CR), which
 * RFC 9112 lets a server reject and which proxies may read differently
 * (request smuggling).  Empty lines before the request line are skipped,
 * as http_parser does.  Returns 0, or -1 with *why set. */
int h1_scan(h1_scan_state *scan, const uint8_t *d, size_t n, const char **why) {
  for (size_t i = 0; i < n && *scan != SC_DONE; i++) {
    uint8_t ch = d[i];
    switch (*scan) {
      case SC_PRE:
        if (ch != '\r' && ch != '\n') *scan = SC_LINE;
        break;
      case SC_LINE:
        if (ch == '\r') *scan = SC_CR;
        else if (ch == '\n') goto bare;
        break;
      case SC_CR:
        if (ch != '\n') goto bare;
        *scan = SC_LSTART;
        break;
      case SC_LSTART:
        if (ch == ' ' || ch == '\t') {
          *why = "Bad Request: obsolete line folding";
          return -1;
        }
        if (ch == '\n') goto bare;
        *scan = ch == '\r' ? SC_ENDCR : SC_LINE;
        break;
      case SC_ENDCR:
        if (ch != '\n') goto bare;
        *scan = SC_DONE;
        break;
      case SC_DONE: break;
    }
  }
  return 0;
bare:
  *why = "Bad Request: line not ended by CRLF";
  return -1;
}

int h1_token_in(const char *list, const char *tok) {
  if (!list) return 0;
  size_t tl = strlen(tok);
  const char *p = list;
  while (*p) {
    while (*p == ' ' || *p == '\t' || *p == ',') p++;
    const char *e = p;
    while (*e && *e != ',') e++;
    const char *te = e;
    while (te > p && (te[-1] == ' ' || te[-1] == '\t')) te--;
    if ((size_t)(te - p) == tl && strncasecmp(p, tok, tl) == 0) return 1;
    p = e;
  }
  return 0;
}

int h1_parse_target(hx *x, const char *url, size_t len) {
  const char *path = url;
  size_t plen = len;
  if (len == 0) return -1;
  if (url[0] != '/') {
    struct http_parser_url u;
    http_parser_url_init(&u);
    if (http_parser_parse_url(url, len, 0, &u) != 0 || !(u.field_set & (1 << UF_PATH))) return -1;
    path = url + u.field_data[UF_PATH].off;
    plen = u.field_data[UF_PATH].len;
    if (u.field_set & (1 << UF_QUERY))
      x->query = hx_strdup(x, url + u.field_data[UF_QUERY].off, u.field_data[UF_QUERY].len);
  } else {
    const char *q = memchr(url, '?', len);
    if (q) {
      plen = (size_t)(q - url);
      x->query = hx_strdup(x, q + 1, len - plen - 1);
    }
  }
  x->path = hx_strdup(x, path, plen);
  return x->path ? 0 : -1;
}


const char *h1_reason(int st) {
  switch (st) {
    case 200: return "OK";
    case 201: return "Created";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 304: return "Not Modified";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    case 505: return "HTTP Version Not Supported";
    case 507: return "Insufficient Storage";
    default: return "Status";
  }
}

