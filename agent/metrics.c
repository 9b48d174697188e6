/* metrics — GET /metrics; see metrics.h.  The /proc reads and statvfs run
 * in the pool (statvfs of a stuck disk must not hold the loop); the job
 * is the exchange's handler data and on_abort only marks it. */
#include "agent/metrics.h"

#include <ctype.h>
#include <stdarg.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "server/auth.h"
#include "server/rpcstats.h"
#include "core/daemon.h"
#include "core/log.h"
#include "core/pool.h"
#include "net/service.h"
#include "proc/cgroup.h"
#include "proc/service.h"

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
  int prometheus; /* the text exposition format (api.md §9 "Operators") */
  unsigned long long wl_cur, nfds;
  double cpu_s, start_s; /* the agent's: user+system CPU, start (Unix time) */
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

/* The agent's CPU seconds and start time: /proc/self/stat fields 14, 15
 * and 22 (clock ticks), the boot time from /proc/stat's btime. */
static void metrics_self(metrics_job *m) {
  char buf[1024];
  FILE *f = fopen("/proc/self/stat", "re");
  if (!f) return;
  size_t r = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[r] = 0;
  const char *e = strrchr(buf, ')');
  unsigned long long ut = 0, st = 0, start = 0;
  if (!e || sscanf(e + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d %*d %*d %llu", &ut,
                   &st, &start) != 3)
    return;
  double hz = (double)sysconf(_SC_CLK_TCK);
  m->cpu_s = (double)(ut + st) / hz;
  unsigned long long btime = 0;
  if ((f = fopen("/proc/stat", "re"))) {
    char line[256];
    while (fgets(line, sizeof line, f))
      if (strncmp(line, "btime ", 6) == 0) btime = strtoull(line + 6, NULL, 10);
    fclose(f);
  }
  m->start_s = (double)btime + (double)start / hz;
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    struct dirent *de;
    while ((de = readdir(d)) != NULL) m->nfds += de->d_name[0] != '.';
    closedir(d);
    if (m->nfds) m->nfds--; /* the directory's own */
  }
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
  if (m->prometheus) {
    m->wl_cur = proc_cg_workload_memory_current();
    metrics_self(m);
  }
}

/* ---------------------------------------------------------------- text format 0.0.4 */

#define PROM_MAX (1u << 20)

typedef struct prom {
  char *b;
  size_t n, cap;
  int full;
} prom;

/* (its format is "form": exposition lines, not messages for the API doc) */
static void pr(prom *p, const char *form, ...) __attribute__((format(printf, 2, 3)));
static void pr(prom *p, const char *form, ...) {
  if (p->full) return;
  for (;;) {
    va_list ap;
    va_start(ap, form);
    int k = vsnprintf(p->b + p->n, p->cap - p->n, form, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < p->cap - p->n) {
      p->n += (size_t)k;
      return;
    }
    size_t nc = p->cap * 2;
    char *nb = nc <= PROM_MAX ? realloc(p->b, nc) : NULL;
    if (!nb) {
      p->full = 1;
      return;
    }
    p->b = nb;
    p->cap = nc;
  }
}

static void pr_head(prom *p, const char *name, const char *type, const char *help) {
  pr(p, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* "/pb.ProcessService/StartProcess" → service and method labels. */
static void pr_route(prom *p, const char *path) {
  const char *s = path[0] == '/' ? path + 1 : path, *sl = strchr(s, '/');
  if (!sl) sl = s + strlen(s);
  pr(p, "service=\"%.*s\",method=\"%s\"", (int)(sl - s), s, *sl ? sl + 1 : "");
}

static char *metrics_prometheus(const metrics_job *m) {
  prom p = {.b = malloc(16384), .cap = 16384};
  if (!p.b) return NULL;
  p.b[0] = 0;
  pr_head(&p, "conch_rpc_requests_total", "counter", "RPC calls ended, by route and code.");
  for (size_t i = 0; i < conch.nroutes; i++) {
    const rpcstats_route *r = rpcstats_route_at(i);
    for (int c = 0; c < RPCSTATS_CODES; c++) {
      if (!r->codes[c]) continue;
      pr(&p, "conch_rpc_requests_total{");
      pr_route(&p, conch.routes[i]->path);
      pr(&p, ",code=\"%s\"} %llu\n", rpc_code_name((rpc_code)c), (unsigned long long)r->codes[c]);
    }
  }
  pr_head(&p, "conch_rpc_duration_seconds", "histogram", "Duration of unary RPC calls, arrival to end.");
  for (size_t i = 0; i < conch.nroutes; i++) {
    const rpcstats_route *r = rpcstats_route_at(i);
    if (conch.routes[i]->kind != RPC_UNARY || !r->count) continue; /* a series once it has a call */
    unsigned long long cum = 0;
    for (int b = 0; b <= RPCSTATS_BUCKETS; b++) {
      cum += r->bucket[b];
      pr(&p, "conch_rpc_duration_seconds_bucket{");
      pr_route(&p, conch.routes[i]->path);
      if (b < RPCSTATS_BUCKETS) pr(&p, ",le=\"%g\"} %llu\n", rpcstats_le[b], cum);
      else pr(&p, ",le=\"+Inf\"} %llu\n", cum);
    }
    pr(&p, "conch_rpc_duration_seconds_sum{");
    pr_route(&p, conch.routes[i]->path);
    pr(&p, "} %.9f\n", (double)r->sum_ns / 1e9);
    pr(&p, "conch_rpc_duration_seconds_count{");
    pr_route(&p, conch.routes[i]->path);
    pr(&p, "} %llu\n", (unsigned long long)r->count);
  }
  pr_head(&p, "conch_processes_started_total", "counter", "Processes started by this program.");
  pr(&p, "conch_processes_started_total %llu\n", (unsigned long long)proc_started_total());
  pr_head(&p, "conch_processes_running", "gauge", "Started processes whose leader runs.");
  pr(&p, "conch_processes_running %u\n", proc_running());
  pr_head(&p, "conch_process_oom_kills_total", "counter", "OOM kills since boot (/proc/vmstat oom_kill).");
  pr(&p, "conch_process_oom_kills_total %llu\n", m->oom_kills);
  pr_head(&p, "conch_upgrades_total", "counter", "Upgrades in place since boot.");
  pr(&p, "conch_upgrades_total %llu\n", conch.upgrades);
  pr_head(&p, "conch_log_lines_dropped_total", "counter", "Log lines dropped because a destination did not take them.");
  for (int d = 0; d < LOG_NDEST; d++)
    pr(&p, "conch_log_lines_dropped_total{dest=\"%s\"} %llu\n", log_dest_name((log_dest)d),
       log_dropped((log_dest)d));
  pr_head(&p, "conch_connections_open", "gauge", "Open API connections.");
  pr(&p, "conch_connections_open %u\n", conch.nconns);
  pr_head(&p, "conch_connections_refused_total", "counter", "API connections closed at once: past the cap.");
  pr(&p, "conch_connections_refused_total %llu\n", conch.conns_refused);
  pr_head(&p, "conch_memory_budget_held_bytes", "gauge", "Memory held on behalf of clients (CONCH_MEM_BUDGET).");
  pr(&p, "conch_memory_budget_held_bytes %zu\n", conch.held);
  unsigned ports;
  uint64_t relayed, steered;
  net_forward_counts(&ports, &relayed, &steered);
  pr_head(&p, "conch_forwarded_ports", "gauge", "Loopback listeners forwarded to the sandbox address.");
  pr(&p, "conch_forwarded_ports %u\n", ports);
  pr_head(&p, "conch_forwarded_connections_total", "counter", "Forwarded connections, by how.");
  pr(&p, "conch_forwarded_connections_total{mode=\"steered\"} %llu\n", (unsigned long long)steered);
  pr(&p, "conch_forwarded_connections_total{mode=\"relayed\"} %llu\n", (unsigned long long)relayed);
  pr_head(&p, "conch_workload_memory_bytes", "gauge", "Memory of the workload envelope (memory.current; 0 without).");
  pr(&p, "conch_workload_memory_bytes %llu\n", m->wl_cur);
  pr_head(&p, "conch_build_info", "gauge", "The program serving.");
  pr(&p, "conch_build_info{version=\"%s\"} 1\n", CONCH_VERSION);
  pr_head(&p, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.");
  pr(&p, "process_resident_memory_bytes %llu\n", m->rss);
  pr_head(&p, "process_open_fds", "gauge", "Number of open file descriptors.");
  pr(&p, "process_open_fds %llu\n", m->nfds);
  pr_head(&p, "process_cpu_seconds_total", "counter", "Total user and system CPU time spent in seconds.");
  pr(&p, "process_cpu_seconds_total %.2f\n", m->cpu_s);
  pr_head(&p, "process_start_time_seconds", "gauge", "Start time of the process since unix epoch in seconds.");
  pr(&p, "process_start_time_seconds %.2f\n", m->start_s);
  if (p.full) {
    free(p.b);
    return NULL;
  }
  return p.b;
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
  if (m->prometheus) {
    char *text = metrics_prometheus(m);
    if (text) hx_simple(x, 200, "text/plain; version=0.0.4; charset=utf-8", text, NULL, 0);
    else hx_simple(x, 503, "text/plain; charset=utf-8", "out of memory\n", NULL, 0);
    free(text);
    free(m);
    return;
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

/* The text format: ?format=prometheus, or an Accept that names text/plain
 * (Prometheus sends it; curl by default does not). */
static int metrics_wants_text(const hx *x) {
  for (const char *q = x->query; q && *q;) {
    const char *amp = strchr(q, '&');
    size_t l = amp ? (size_t)(amp - q) : strlen(q);
    if (l == 17 && memcmp(q, "format=prometheus", 17) == 0) return 1;
    q = amp ? amp + 1 : NULL;
  }
  const char *a = hx_get(x, "accept");
  return a && strstr(a, "text/plain") != NULL;
}

void metrics_serve(hx *x) {
  if (strcmp(x->method, "GET") != 0) {
    hx_header allow = {"allow", "GET"};
    hx_simple(x, 405, "text/plain; charset=utf-8", "405 method not allowed\n", &allow, 1);
    return;
  }
  const char *amsg;
  if (auth_check_hx_bearer(x, &amsg) != RPC_OK) {
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
  m->prometheus = metrics_wants_text(x);
  m->prev_busy = conch.metrics_cpu_busy;
  m->prev_total = conch.metrics_cpu_total;
  hx_set_handler(x, &metrics_handler, m);
  pool_submit(&m->job, metrics_work, metrics_done);
}
