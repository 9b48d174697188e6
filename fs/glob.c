/* fs/glob — Go path.Match port; see glob.h. */
#include "fs/glob.h"

#include "proto/text.h"

#include <stdint.h>
#include <string.h>

/* scanChunk: skip leading stars, then the chunk runs to the next '*'
 * outside a class.  Sets *star, the chunk [*c, *c + *clen), returns the
 * offset of the rest. */
static size_t glob_scan_chunk(const char *p, size_t n, int *star, size_t *cstart, size_t *clen) {
  size_t i = 0;
  *star = 0;
  while (i < n && p[i] == '*') {
    i++;
    *star = 1;
  }
  size_t s = i;
  int inrange = 0;
  for (; i < n; i++) {
    char ch = p[i];
    if (ch == '\\') {
      if (i + 1 < n) i++;
    } else if (ch == '[') {
      inrange = 1;
    } else if (ch == ']') {
      inrange = 0;
    } else if (ch == '*' && !inrange) {
      break;
    }
  }
  *cstart = s;
  *clen = i - s;
  return i;
}

/* getEsc: one (possibly escaped) class character.  0 ok, -1 bad pattern. */
static int glob_get_esc(const char **c, size_t *cn, uint32_t *r) {
  const char *p = *c;
  size_t n = *cn;
  if (n == 0 || p[0] == '-' || p[0] == ']') return -1;
  if (p[0] == '\\') {
    p++;
    n--;
    if (n == 0) return -1;
  }
  size_t w;
  *r = text_utf8_rune((const unsigned char *)p, n, &w);
  if (*r == TEXT_RUNE_ERROR && w == 1) return -1;
  p += w;
  n -= w;
  if (n == 0) return -1;
  *c = p;
  *cn = n;
  return 0;
}

/* matchChunk.  Returns 1 match (rest of the name in rest, restn), 0 no match,
 * -1 bad pattern.  After a mismatch it keeps parsing the chunk to report
 * syntax errors, as Go does. */
static int glob_match_chunk(const char *c, size_t cn, const char *s, size_t sn,
                            const char **rest, size_t *restn) {
  int failed = 0;
  while (cn > 0) {
    if (!failed && sn == 0) failed = 1;
    switch (c[0]) {
      case '[': {
        uint32_t r = 0;
        if (!failed) {
          size_t w;
          r = text_utf8_rune((const unsigned char *)s, sn, &w);
          s += w;
          sn -= w;
        }
        c++;
        cn--;
        int negated = 0;
        if (cn > 0 && c[0] == '^') {
          negated = 1;
          c++;
          cn--;
        }
        int match = 0, nrange = 0;
        for (;;) {
          if (cn > 0 && c[0] == ']' && nrange > 0) {
            c++;
            cn--;
            break;
          }
          uint32_t lo, hi;
          if (glob_get_esc(&c, &cn, &lo) < 0) return -1;
          hi = lo;
          if (c[0] == '-') {
            c++;
            cn--;
            if (glob_get_esc(&c, &cn, &hi) < 0) return -1;
          }
          if (lo <= r && r <= hi) match = 1;
          nrange++;
        }
        if (match == negated) failed = 1;
        break;
      }
      case '?':
        if (!failed) {
          if (s[0] == '/') failed = 1;
          size_t w;
          text_utf8_rune((const unsigned char *)s, sn, &w);
          s += w;
          sn -= w;
        }
        c++;
        cn--;
        break;
      case '\\':
        c++;
        cn--;
        if (cn == 0) return -1;
        /* fall through */
      default:
        if (!failed) {
          if (c[0] != s[0]) failed = 1;
          s++;
          sn--;
        }
        c++;
        cn--;
        break;
    }
  }
  if (failed) return 0;
  *rest = s;
  *restn = sn;
  return 1;
}

int fs_glob_valid(const char *pat, size_t plen) {
  size_t off = 0;
  while (off < plen) {
    int star;
    size_t cs, cl;
    size_t adv = glob_scan_chunk(pat + off, plen - off, &star, &cs, &cl);
    const char *rest;
    size_t restn;
    if (glob_match_chunk(pat + off + cs, cl, "", 0, &rest, &restn) < 0) return 0;
    off += adv;
  }
  return 1;
}

int fs_glob_match(const char *pat, size_t plen, const char *name, size_t nlen) {
  while (plen > 0) {
    int star;
    size_t cs, cl;
    size_t adv = glob_scan_chunk(pat, plen, &star, &cs, &cl);
    const char *chunk = pat + cs;
    pat += adv;
    plen -= adv;
    if (star && cl == 0) return memchr(name, '/', nlen) == NULL ? 1 : 0;
    const char *t;
    size_t tn;
    int ok = glob_match_chunk(chunk, cl, name, nlen, &t, &tn);
    if (ok == 1 && (tn == 0 || plen > 0)) {
      name = t;
      nlen = tn;
      continue;
    }
    if (ok < 0) return -1;
    if (star) {
      int advanced = 0;
      for (size_t i = 0; i < nlen && name[i] != '/'; i++) {
        ok = glob_match_chunk(chunk, cl, name + i + 1, nlen - i - 1, &t, &tn);
        if (ok == 1) {
          if (plen == 0 && tn > 0) continue;
          name = t;
          nlen = tn;
          advanced = 1;
          break;
        }
        if (ok < 0) return -1;
      }
      if (advanced) continue;
    }
    /* No match: still report a syntax error in the rest of the pattern. */
    return fs_glob_valid(pat, plen) ? 0 : -1;
  }
  return nlen == 0 ? 1 : 0;
}
