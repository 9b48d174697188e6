/* text_b64.c — strict base64 (see text.h), on top of libb64.
 *
 * libb64 does the bit shuffling; this file adds what JSON and HTTP2-Settings
 * need and libb64 lacks: the encoder must not wrap lines (libb64 writes '\n'
 * after every 72 characters and at the end), and the decoder must reject anything that is
 * not base64 (libb64 silently skips unknown characters).  So input is
 * validated strictly first, URL-safe characters are mapped to the standard
 * alphabet, and the encoder is fed one 72-character line at a time with a
 * fresh state so the newline lands where the next line overwrites it.
 */
#include "proto/text.h"

#include <b64/cdecode.h>
#include <b64/cencode.h>
#include <string.h>

/* Input bytes per libb64 output line: 72 characters = 18 groups of 3 bytes. */
#define B64_LINE_IN 54
#define B64_LINE_OUT 72

size_t text_b64_encoded_len(size_t n) { return (n + 2) / 3 * 4; }

size_t text_b64_encode(const unsigned char *in, size_t n, char *out) {
  base64_encodestate st;
  char *o = out;
  /* Whole lines straight into out while at least one more byte follows: the
   * '\n' libb64 appends after the line is written at o[72], which is inside
   * out (the rest needs >= 4 more characters) and is overwritten next. */
  while (n > B64_LINE_IN) {
    base64_init_encodestate(&st);
    base64_encode_block((const char *)in, B64_LINE_IN, o, &st);
    o += B64_LINE_OUT;
    in += B64_LINE_IN;
    n -= B64_LINE_IN;
  }
  if (n > 0) {
    /* The last (partial) line through a scratch buffer: up to 72 characters
     * plus libb64's newline(s), which are dropped. */
    char tmp[B64_LINE_OUT + 8];
    base64_init_encodestate(&st);
    int k = base64_encode_block((const char *)in, (int)n, tmp, &st);
    k += base64_encode_blockend(tmp + k, &st);
    for (int i = 0; i < k; i++)
      if (tmp[i] != '\n') *o++ = tmp[i];
  }
  return (size_t)(o - out);
}

static int b64_class(unsigned char c) {
  if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')) return 0;
  if (c == '+' || c == '/') return 1; /* standard only */
  if (c == '-' || c == '_') return 2; /* URL-safe only */
  return -1;
}

long text_b64_decode(const char *in, size_t n, unsigned char *out) {
  size_t pad = 0;
  if (n >= 1 && in[n - 1] == '=') pad = (n >= 2 && in[n - 2] == '=') ? 2 : 1;
  if (pad && n % 4 != 0) return -1;   /* padded input comes in whole quads */
  size_t m = n - pad;
  if (m % 4 == 1) return -1;          /* a single trailing character is never valid */
  int seen = 0;
  for (size_t i = 0; i < m; i++) {
    int c = b64_class((unsigned char)in[i]);
    if (c < 0) return -1;             /* bad character, whitespace, '=' inside */
    seen |= c;
  }
  if (seen == 3) return -1;           /* both alphabets mixed */
  size_t want = m / 4 * 3 + (m % 4 == 3 ? 2 : m % 4 == 2 ? 1 : 0);

  base64_decodestate st;
  base64_init_decodestate(&st);
  size_t got = 0;
  if (!(seen & 2)) {
    /* standard alphabet: straight from the input (in int-sized pieces) */
    for (size_t i = 0; i < m;) {
      size_t k = m - i < ((size_t)1 << 28) ? m - i : ((size_t)1 << 28);
      got += (size_t)base64_decode_block(in + i, (int)k, (char *)out + got, &st);
      i += k;
    }
  } else {
    /* URL-safe: mapped to the standard alphabet through a small buffer */
    char tmp[4096];
    for (size_t i = 0; i < m;) {
      size_t k = m - i < sizeof tmp ? m - i : sizeof tmp;
      for (size_t j = 0; j < k; j++) {
        char c = in[i + j];
        tmp[j] = c == '-' ? '+' : c == '_' ? '/' : c;
      }
      got += (size_t)base64_decode_block(tmp, (int)k, (char *)out + got, &st);
      i += k;
    }
  }
  if (got != want) return -1;         /* cannot happen after validation */
  return (long)got;
}
