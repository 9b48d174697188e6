/* metrics — GET /metrics; see metrics.h.  The /proc reads and statvfs run
 * in the pool (statvfs of a stuck disk must not hold the loop); the job
 * is the exchange's handler data and on_abort only marks it. */
#include "agent/metrics.h"

#include <ctype.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "server/auth.h"
#include "core/daemon.h"
#include "core/pool.h"
#include "net/service.h"
#include "proc/cgroup.h"

typedef struct metrics_job {
  pool_job job; /* first */
  hx *x;        /* NULL once the peer went away */
  pid_t self;
  unsigned long long prev_busy, prev_total; /* loop's last sample */
  unsigned long long busy, total;
  long cpus;
  unsigned long long mem_total, mem_used, disk_total, disk_used, rss;
  unsigned procs;
  long long ts;
  unsigned long long wl_mem, wl_pids, oom_kills; /* api.md §9 */
} metrics_job;

/* "cpu  user nice system idle iowait irq softirq steal …" */
static void metrics_cpu(metrics_job *m) {
  FILE *f = fopen("/proc/stat", "re");
  if (!f) return;
  unsigned long long v[8] = {0};
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4],
             &v[5], &v[6], &v[7]) >= 4) {
    unsigned long long idle = v[3] + v[4], total = 0;
    for (int i = 0; i < 8; i++) total += v[i];
    m->total = total;
    m->busy = total - idle;
  }
  fclose(f);
}

/* A "<key>: N kB" value of a /proc file, in bytes (0 when absent). */
static unsigned long long metrics_kb(const char *path, const char *key) {
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  char line[256];
  size_t kl = strlen(key);
  unsigned long long v = 0;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtoull(line + kl + 1, NULL, 10) * 1024;
      break;
    }
  }
  fclose(f);
  return v;
}

/* OOM kills since boot, every cgroup's and the global killer's: /proc/vmstat's oom_kill. */
static unsigned long long metrics_oom_kills(void) {
  FILE *f = fopen("/proc/vmstat", "re");
  if (!f) return 0;
  char line[128];
  unsigned long long v = 0;
  while (fgets(line, sizeof line, f))
    if (strncmp(line, "oom_kill ", 9) == 0) {
      v = strtoull(line + 9, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

/* Live (not zombie) children of the agent: /proc/<pid>/stat fields 3 and 4. */
static unsigned metrics_children(pid_t self) {
  DIR *d = opendir("/proc");
  if (!d) return 0;
  unsigned n = 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)de->d_name[0])) continue;
    char p[300], buf[512];
    snprintf(p, sizeof p, "/proc/%s/stat", de->d_name);
    FILE *f = fopen(p, "re");
    if (!f) continue;
    size_t r = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[r] = 0;
    const char *e = strrchr(buf, ')'); /* the command name may hold anything */
    char state;
    int ppid;
    if (e && sscanf(e + 1, " %c %d", &state, &ppid) == 2 && ppid == self && state != 'Z' &&
        state != 'X')
      n++;
  }
  closedir(d);
  return n;
}

static void metrics_work(pool_job *j) {
  metrics_job *m = (metrics_job *)j;
  m->ts = (long long)time(NULL);
  m->cpus = sysconf(_SC_NPROCESSORS_ONLN);
  metrics_cpu(m);
  unsigned long long total = metrics_kb("/proc/meminfo", "MemTotal");
  unsigned long long avail = metrics_kb("/proc/meminfo", "MemAvailable");
  m->mem_total = total;
  m->mem_used = total > avail ? total - avail : 0;
  struct statvfs sv;
  if (statvfs("/", &sv) == 0) {
    m->disk_total = (unsigned long long)sv.f_blocks * sv.f_frsize;
    m->disk_used = (unsigned long long)(sv.f_blocks - sv.f_bfree) * sv.f_frsize;
  }
  m->rss = metrics_kb("/proc/self/status", "VmRSS");
  m->procs = metrics_children(m->self);
  m->wl_mem = proc_cg_workload_memory_max();
  m->wl_pids = proc_cg_workload_pids_max();
  m->oom_kills = metrics_oom_kills();
}

static void metrics_abort(hx *x) {
  metrics_job *m = x->hdata;
  if (m) m->x = NULL;
}

static const hx_handler metrics_handler = {.on_abort = metrics_abort};

static void metrics_done(pool_job *j, int canceled) {
  metrics_job *m = (metrics_job *)j;
  hx *x = m->x;
  if (!x) {
    free(m);
    return;
  }
  if (canceled) {
    hx_simple(x, 503, "text/plain; charset=utf-8", "metrics unavailable\n", NULL, 0);
    free(m);
    return;
  }
  double pct = 0;
  unsigned long long db = m->busy - m->prev_busy, dt = m->total - m->prev_total;
  if (m->total > m->prev_total && m->busy >= m->prev_busy) pct = 100.0 * (double)db / (double)dt;
  if (pct > 100) pct = 100;
  if (m->total) {
    conch.metrics_cpu_busy = m->busy;
    conch.metrics_cpu_total = m->total;
  }
  char body[768];
  snprintf(body, sizeof body,
           "{\"ts\":%lld,\"cpuCount\":%ld,\"cpuUsedPct\":%.2f,\"memTotal\":%llu,\"memUsed\":%llu,"
           "\"diskTotal\":%llu,\"diskUsed\":%llu,\"processes\":%u,\"connections\":%u,"
           "\"agentRss\":%llu,\"workloadMemoryMax\":%llu,\"workloadPidsMax\":%llu,\"oomKills\":%llu,"
           "\"version\":\"%s\",\"upgrades\":%llu,\"relaysHeld\":%zu,\"relaysReset\":%llu}",
           m->ts, m->cpus, pct, m->mem_total, m->mem_used, m->disk_total, m->disk_used, m->procs,
           conch.nconns, m->rss, m->wl_mem, m->wl_pids, m->oom_kills, CONCH_VERSION, conch.upgrades,
           net_relays_held(), net_relays_reset());
  hx_simple(x, 200, "application/json", body, NULL, 0);
  free(m);
}

void metrics_serve(hx *x) {
  if (strcmp(x->method, "GET") != 0) {
    hx_header allow = {"allow", "GET"};
    hx_simple(x, 405, "text/plain; charset=utf-8", "405 method not allowed\n", &allow, 1);
    return;
  }
  const char *amsg;
  if (auth_check_hx(x, &amsg) != RPC_OK) {
    char body[256];
    snprintf(body, sizeof body, "{\"code\":\"unauthenticated\",\"message\":\"%s\"}", amsg);
    hx_simple(x, 401, "application/json", body, NULL, 0);
    return;
  }
  hx_authed(x);
  metrics_job *m = calloc(1, sizeof *m);
  if (!m) {
    hx_simple(x, 503, "text/plain; charset=utf-8", "out of memory\n", NULL, 0);
    return;
  }
  m->x = x;
  m->self = getpid();
  m->prev_busy = conch.metrics_cpu_busy;
  m->prev_total = conch.metrics_cpu_total;
  hx_set_handler(x, &metrics_handler, m);
  pool_submit(&m->job, metrics_work, metrics_done);
}
