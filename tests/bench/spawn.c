/* spawn — baseline for the StartProcess round-trip benchmark.
 *
 *   spawn [-n N] [-w W] [-o FILE] [PROGRAM]   (defaults: 2000, 100, /bin/true)
 *
 * W untimed, then N timed iterations of posix_spawn(PROGRAM) + waitpid; each
 * child must exit 0.  Prints one stats line (see stats.h) labelled "spawn";
 * -o appends the raw samples (ns) to FILE.
 */
#include "stats.h"

#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

static int spawn_one(const char *prog) {
  char *argv[] = {(char *)prog, NULL};
  pid_t pid;
  int rc = posix_spawn(&pid, prog, NULL, NULL, argv, environ);
  if (rc != 0) {
    fprintf(stderr, "spawn: posix_spawn %s: %s\n", prog, strerror(rc));
    return -1;
  }
  int st;
  while (waitpid(pid, &st, 0) < 0) {
    if (errno != EINTR) {
      perror("spawn: waitpid");
      return -1;
    }
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "spawn: %s did not exit 0 (status 0x%x)\n", prog, st);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  stats_run o = {.n = 2000, .w = 100};
  int ch;
  while ((ch = getopt(argc, argv, STATS_RUN_OPTS "h")) != -1)
    if (stats_run_opt(&o, ch, optarg) <= 0) goto usage;
  if (argc - optind > 1) goto usage;
  const char *prog = optind < argc ? argv[optind] : "/bin/true";
  uint64_t *v = calloc(o.n, sizeof *v);
  if (!v) return 1;
  for (uint64_t i = 0; i < o.w + o.n; i++) {
    if (o.gap_ms) stats_sleep_ms(o.gap_ms);
    uint64_t t0 = stats_now_ns();
    if (spawn_one(prog)) return 1;
    if (i >= o.w) v[i - o.w] = stats_now_ns() - t0;
  }
  if (o.raw && stats_dump(o.raw, v, o.n)) return 1;
  stats_print(stdout, "spawn", v, o.n);
  free(v);
  return 0;
usage:
  fprintf(stderr, "usage: spawn [-n N] [-w W] [-G GAP_MS] [-o FILE] [PROGRAM]\n");
  return 2;
}
