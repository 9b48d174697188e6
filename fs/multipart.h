/* fs/multipart — a streaming multipart/form-data parser (RFC 7578, RFC
 * 2046 §5.1) for POST /files: bytes in as they come, one event out at a
 * time, so that the caller can stop anywhere (its disk work runs in the
 * pool) and go on later with the rest.  Nothing is buffered but a header
 * line; part data is handed out where it lies in the input.  Untrusted
 * input: every length is bounded, anything malformed is an error with a
 * reason.  Pure; no I/O, no allocation but the part's file name.
 *
 *   fs_mp m;  fs_mp_init(&m, content_type_header, err, sizeof err);
 *   while ((ev = fs_mp_next(&m, p, n, &used, &data, &len)) != FS_MP_NEED) { p += used; n -= used; … }
 */
#ifndef CONCH_FS_MULTIPART_H
#define CONCH_FS_MULTIPART_H

#include <stddef.h>
#include <stdint.h>

#define FS_MP_BOUNDARY_MAX 70   /* RFC 2046 */
#define FS_MP_LINE_MAX 8192     /* one header line */
#define FS_MP_HEADERS_MAX 32    /* header lines of one part */
#define FS_MP_PARTS_MAX 10000

typedef enum fs_mp_state { MP_PREAMBLE, MP_AFTER_DELIM, MP_HEADER, MP_BODY, MP_DONE, MP_FAILED } fs_mp_state;

typedef enum fs_mp_event {
  FS_MP_NEED,     /* all input used: more is needed (or, at the body's end: cut short) */
  FS_MP_PART,     /* a part's headers are complete: filename (or NULL: not a file) */
  FS_MP_DATA,     /* *data, *len: bytes of the current part */
  FS_MP_PART_END, /* the current part is complete */
  FS_MP_END,      /* the closing delimiter: the body is complete (the rest is ignored) */
  FS_MP_ERROR,    /* malformed: the reason in m->err */
} fs_mp_event;

typedef struct fs_mp {
  fs_mp_state state;
  char delim[FS_MP_BOUNDARY_MAX + 4]; /* "\r\n--" boundary */
  size_t dlen;
  size_t match;   /* bytes of delim matched and held back */
  size_t dashes;  /* MP_AFTER_DELIM: '-' seen */
  int lwsp;       /* MP_AFTER_DELIM: transport padding seen */
  int in_part;    /* a part is open (PART given, PART_END not yet) */
  char line[FS_MP_LINE_MAX];
  size_t ll;
  int cr;         /* MP_HEADER: the line ended in '\r' so far */
  unsigned nheaders;
  unsigned nparts;
  char *filename; /* the current part's, malloc'd (NULL: none) */
  char err[128];
} fs_mp;

/* From a Content-Type value: multipart/form-data with a valid boundary.
 * 0, or -1 with the reason in err. */
int fs_mp_init(fs_mp *m, const char *content_type, char *err, size_t errlen);
void fs_mp_free(fs_mp *m);

/* One event from p[0, n): *used bytes were taken (even with an event). */
fs_mp_event fs_mp_next(fs_mp *m, const uint8_t *p, size_t n, size_t *used, const uint8_t **data,
                       size_t *len);

/* A part's file name as it is stored: its last element after '/' or '\'
 * (browsers on Windows send a whole path).  NULL when that is empty, "."
 * or "..". */
const char *fs_mp_basename(const char *filename);

#endif
