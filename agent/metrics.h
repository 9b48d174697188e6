/* metrics — GET /metrics (api.md §9 "HTTP and protocol extras").
 *
 * Token required (api.md §4 checks; failure → 401 with the Connect error
 * JSON {"code":"unauthenticated","message":…}); other methods → 405 with
 * Allow: GET.  The answer, read in the thread pool from /proc and statvfs:
 *
 *   {"ts":<unix s>,"cpuCount":N,"cpuUsedPct":P,"memTotal":B,"memUsed":B,
 *    "diskTotal":B,"diskUsed":B,"processes":N,"connections":N,"agentRss":B,
 *    "workloadMemoryMax":B,"workloadPidsMax":N,"oomKills":N,"version":"V","upgrades":N}
 *
 * cpuCount: online CPUs; cpuUsedPct: non-idle share of /proc/stat's cpu
 * times since the previous /metrics call (since boot for the first);
 * memUsed = MemTotal − MemAvailable; disk of "/" (f_blocks, f_blocks −
 * f_bfree, times f_frsize); processes: the agent's live children (the
 * commands it started, and orphans it adopted as reaper), from /proc;
 * connections: open API connections; agentRss: VmRSS of the agent;
 * workloadMemoryMax, workloadPidsMax: the workload envelope's bounds (0:
 * none); oomKills: /proc/vmstat's oom_kill; version: CONCH_VERSION, the
 * program now serving; upgrades: upgrades in place since boot
 * (conch.upgrades, counted by core/handover.c).
 */
#ifndef CONCH_METRICS_H
#define CONCH_METRICS_H

#include "server/hx.h"

void metrics_serve(hx *x);

#endif
