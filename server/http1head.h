/* http1head — the syntax of an HTTP/1.1 request head, checked apart from
 * the connection's lifecycle (http1.c): the raw lines, field names, token
 * lists and the request target; and the reason phrase of a status. */
#ifndef CONCH_HTTP1HEAD_H
#define CONCH_HTTP1HEAD_H

#include <stddef.h>
#include <stdint.h>

#include "server/hx.h"

/* What h1_scan has seen of the raw request head. */
typedef enum h1_scan_state { SC_PRE, SC_LINE, SC_CR, SC_LSTART, SC_ENDCR, SC_DONE } h1_scan_state;

/* The raw request head, checked before http_parser sees it (obs-fold, bare
 * LF or CR): 0, or -1 with *why set.  *scan goes on across calls. */
int h1_scan(h1_scan_state *scan, const uint8_t *d, size_t n, const char **why);
/* RFC 9110 token characters: what a field name may hold. */
int h1_is_token(const char *p, size_t n);
/* 1 when the comma-separated list holds tok (case-insensitive). */
int h1_token_in(const char *list, const char *tok);
/* The request target into x->path (and x->query): origin or absolute form.
 * 0, or -1 when it is not one. */
int h1_parse_target(hx *x, const char *url, size_t len);
/* The reason phrase of a status ("Status" for one not listed). */
const char *h1_reason(int status);

#endif
