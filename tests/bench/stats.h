/* stats.h — latency statistics shared by the bench tools (rtt, spawn).
 *
 * Samples are nanoseconds; stats_print() sorts them and prints one line of
 * key=value pairs in microseconds (n p50_us p99_us mean_us min_us max_us),
 * the format tests/bench/process.sh parses.  Percentiles are nearest-rank.
 * stats_dump() appends raw samples so runs made in blocks can be pooled.
 */
#ifndef CONCH_BENCH_STATS_H
#define CONCH_BENCH_STATS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

uint64_t stats_now_ns(void);
/* Sleeps ms milliseconds (the -G pause between calls). */
void stats_sleep_ms(uint64_t ms);
/* Sorts v in place. */
void stats_print(FILE *out, const char *label, uint64_t *v, size_t n);
/* Appends the n samples (nanoseconds, one per line) to path; 0 on success. */
int stats_dump(const char *path, const uint64_t *v, size_t n);
/* Parses a positive decimal count into *out; 0 on success. */
int stats_parse_count(const char *s, uint64_t max, uint64_t *out);

/* The timing options every tool takes (getopt letters n: w: G: o:): N
 * timed calls (> 0), W untimed ones first, a GAP_MS pause before each (a
 * user's pace), raw samples appended to FILE. */
typedef struct stats_run {
  uint64_t n, w, gap_ms;
  const char *raw;
} stats_run;
#define STATS_RUN_OPTS "n:w:G:o:"
/* ch one of those: 1 (taken) or -1 (a bad value); any other ch: 0. */
int stats_run_opt(stats_run *r, int ch, const char *arg);

#endif
