/* stats.c — see stats.h. */
#include "stats.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

uint64_t stats_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int stats_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return (x > y) - (x < y);
}

/* nearest-rank percentile: the smallest sample with at least p% at or below it */
static uint64_t stats_pct(const uint64_t *v, size_t n, unsigned p) {
  size_t rank = (n * p + 99) / 100;
  if (rank == 0) rank = 1;
  return v[rank - 1];
}

void stats_print(FILE *out, const char *label, uint64_t *v, size_t n) {
  if (n == 0) {
    fprintf(out, "%s n=0\n", label);
    return;
  }
  qsort(v, n, sizeof *v, stats_cmp);
  long double sum = 0;
  for (size_t i = 0; i < n; i++) sum += v[i];
  fprintf(out, "%s n=%zu p50_us=%.1f p99_us=%.1f mean_us=%.1f min_us=%.1f max_us=%.1f\n", label, n,
          stats_pct(v, n, 50) / 1e3, stats_pct(v, n, 99) / 1e3, (double)(sum / n / 1e3),
          v[0] / 1e3, v[n - 1] / 1e3);
}

int stats_parse_count(const char *s, uint64_t max, uint64_t *out) {
  char *end;
  errno = 0;
  if (!s || *s < '0' || *s > '9') return -1;
  unsigned long long x = strtoull(s, &end, 10);
  if (errno || *end || x > max) return -1;
  *out = x;
  return 0;
}

int stats_dump(const char *path, const uint64_t *v, size_t n) {
  FILE *f = fopen(path, "a");
  if (!f) {
    perror(path);
    return -1;
  }
  for (size_t i = 0; i < n; i++) fprintf(f, "%llu\n", (unsigned long long)v[i]);
  if (fclose(f) != 0) {
    perror(path);
    return -1;
  }
  return 0;
}

void stats_sleep_ms(uint64_t ms) {
  struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

int stats_run_opt(stats_run *r, int ch, const char *arg) {
  switch (ch) {
    case 'n': return stats_parse_count(arg, 100000000, &r->n) || r->n == 0 ? -1 : 1;
    case 'w': return stats_parse_count(arg, 100000000, &r->w) ? -1 : 1;
    case 'G': return stats_parse_count(arg, 60000, &r->gap_ms) ? -1 : 1;
    case 'o': r->raw = arg; return 1;
    default: return 0;
  }
}
