#!/usr/bin/env bash
# Counts behind docs/internals/profile.md.  Not part of `make check`.
#
# Counts, not times: syscalls, context switches, page faults and CPU time of
# the server's threads per call / per MiB, from perf's software events and
# syscall tracepoints (`perf stat --no-inherit --per-thread -p`: the server's
# own threads, not the children it starts), against the same counts of each
# figure's baseline.  Counts barely move with the load of a shared machine;
# the CPU times do, so several rounds are printed.
#
#   stdout     SIZE bytes of `head -c SIZE /dev/zero` through StartProcess,
#              HTTP/1.1 and h2c, vs `head | cat` (each side under perf stat)
#   roundtrip  N × StartProcess /bin/true, HTTP/1.1 and h2c, per call, with
#              and without cgroups (CONCH_PROC_CGROUPS=0), vs posix_spawn;
#              p50 of the three interleaved in BLOCKS blocks
#   files      GetFileStream / PostFileStream of SIZE bytes on a tmpfs, vs
#              nghttpd → curl h2c (server and client counts)
#   keystroke  SendInput / StreamInput per key vs /health and the bare PTY
#   rss        RSS and glibc's arenas (malloc_stats via gdb) after stdout
#              runs, with a client that stops reading for 0.5 s
#   malloc     the same upload and stdout with glibc's trim/mmap thresholds
#              raised (GLIBC_TUNABLES): page faults and loop CPU
#
# Usage: tests/bench/profile.sh [section...]   (default: all; needs root and perf)
# Environment: SIZE (67108864) N (500) BLOCKS (4) REPS (3); CONCH_INIT_BIN.
set -uo pipefail
cd "$(dirname "$0")/../.."
SIZE=${SIZE:-67108864}
N=${N:-500}
BLOCKS=${BLOCKS:-4}
REPS=${REPS:-3}
BIN=${CONCH_INIT_BIN:-build/dev/conch-init}
[ -n "${CONCH_INIT_BIN:-}" ] || make -s dev >/dev/null
command -v perf >/dev/null || { echo "profile.sh: needs perf (apt-get install linux-perf)"; exit 1; }
perf stat -e raw_syscalls:sys_enter true >/dev/null 2>&1 || { echo "profile.sh: perf cannot read syscall tracepoints (root?)"; exit 1; }
mkdir -p build/bench
CFLAGS="-std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wvla"
cc $CFLAGS -o build/bench/spawn tests/bench/spawn.c tests/bench/stats.c
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2
cc $CFLAGS -o build/bench/keystroke tests/bench/keystroke.c tests/bench/stats.c -lutil
RTT=build/bench/rtt
W=$(mktemp -d /tmp/conch-prof.XXXXXX)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  umount "$W/fs" 2>/dev/null
  rm -rf "$W"
}
trap cleanup EXIT
TOK=prof-$RANDOM$RANDOM
freeport() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
start() { # [env assignments...] → sets PORT and SPID
  PORT=$(freeport)
  env "$@" "$BIN" serve --listen 127.0.0.1:$PORT --token "$TOK" --log-level warn 2>>"$W/server.log" &
  SPID=$!
  PIDS+=("$SPID")
  for _ in $(seq 100); do $RTT --port $PORT --health -n 1 -w 0 >/dev/null 2>&1 && return 0; sleep 0.05; done
  echo "profile.sh: server did not come up"; cat "$W/server.log"; exit 1
}
stop() { kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; }
EV_IO=raw_syscalls:sys_enter,syscalls:sys_enter_read,syscalls:sys_enter_write,syscalls:sys_enter_writev,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_futex,syscalls:sys_enter_brk,syscalls:sys_enter_mmap,syscalls:sys_enter_munmap,syscalls:sys_enter_madvise,context-switches,page-faults,task-clock
# perf stat of the server's threads around a command; prints "thread event count per-unit"
srvstat() { # divisor unit cmd...
  local div=$1 unit=$2; shift 2
  perf stat --no-inherit --per-thread -x, -e $EV_IO -p $SPID -o "$W/srv.txt" & local pp=$!
  sleep 0.3
  "$@"
  sleep 0.1; kill -INT $pp; wait $pp
  awk -F, -v d=$div -v u="$unit" -v pid=$SPID '$2+0 > 0 {
      t = $1; sub(/.*-/, "", t); key = (t == pid ? "loop" : "pool") # the loop runs on the main thread
      v[key "," $4] += $2; if (!((key "," $4) in seen)) { seen[key "," $4] = 1; order[++n] = key "," $4 } }
    END { for (i = 1; i <= n; i++) { split(order[i], a, ","); printf "    %-5s %-30s %12.2f %s\n", a[1], a[2], v[order[i]] / d, u } }' "$W/srv.txt" >&3
}
cmdstat() { # divisor unit label cmd... : the command itself (children included)
  local div=$1 unit=$2 label=$3; shift 3
  perf stat -x, -e $EV_IO -o "$W/cmd.txt" "$@"
  awk -F, -v d=$div -v u="$unit" -v l="$label" 'NF > 2 && $1+0 > 0 { printf "    %-5s %-30s %12.2f %s\n", l, $3, $1 / d, u }' "$W/cmd.txt" >&3
}
MIB=$((SIZE / 1048576))
exec 3>&1 # srvstat and cmdstat report here, whatever the measured command's stdout is

sec_stdout() {
  echo "== stdout: $MIB MiB of head -c through StartProcess (per MiB delivered)"
  start
  $RTT --port $PORT --token "$TOK" -n 1 -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero >/dev/null
  for r in $(seq $REPS); do
    for p in "" --h2; do
      echo "  -- ${p:-HTTP/1.1} round $r (server threads; the client rtt):"
      srvstat $MIB /MiB cmdstat $MIB /MiB rtt $RTT --port $PORT --token "$TOK" $p -n 1 -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero >"$W/o.txt"
      sed -n 's/.*seconds=\([^ ]*\).*mib_s=\([^ ]*\).*/    wall \1 s, \2 MiB\/s/p' "$W/o.txt"
    done
    echo "  -- baseline head | cat round $r (each side):"
    perf stat -x, -e $EV_IO -o "$W/h.txt" head -c $SIZE /dev/zero | perf stat -x, -e $EV_IO -o "$W/c.txt" cat >/dev/null
    awk -F, -v d=$MIB 'NF > 2 && $1+0 > 0 { printf "    head  %-30s %12.2f /MiB\n", $3, $1 / d }' "$W/h.txt"
    awk -F, -v d=$MIB 'NF > 2 && $1+0 > 0 { printf "    cat   %-30s %12.2f /MiB\n", $3, $1 / d }' "$W/c.txt"
    local s e; s=$(date +%s%N); head -c $SIZE /dev/zero | cat >/dev/null; e=$(date +%s%N)
    echo "    wall $(awk -v n=$((e - s)) 'BEGIN{printf "%.4f", n / 1e9}') s"
  done
  stop
}

sec_roundtrip() {
  echo "== round trip: StartProcess /bin/true, N=$N in $BLOCKS blocks (per call)"
  start; local pa=$PORT sa=$SPID
  start CONCH_PROC_CGROUPS=0; local pb=$PORT sb=$SPID
  rm -f "$W"/rt-*.raw
  local nb=$(( (N + BLOCKS - 1) / BLOCKS ))
  for _ in $(seq $BLOCKS); do
    build/bench/spawn -n $nb -w 10 -o "$W/rt-spawn.raw" >/dev/null
    for p in "" --h2; do
      $RTT --port $pa --token "$TOK" $p -n $nb -w 10 -o "$W/rt-cg${p}.raw" -- /bin/true >/dev/null
      $RTT --port $pb --token "$TOK" $p -n $nb -w 10 -o "$W/rt-nocg${p}.raw" -- /bin/true >/dev/null
    done
  done
  local sp50
  sp50=$(sort -n "$W/rt-spawn.raw" | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}')
  for f in spawn cg cg--h2 nocg nocg--h2; do
    sort -n "$W/rt-$f.raw" | awk -v f=$f -v b=$sp50 '{v[NR]=$1} END{m=v[int((NR+1)/2)]; printf "    %-10s n=%d p50_us=%.1f p99_us=%.1f  x%.2f of spawn p50\n", f, NR, m/1e3, v[int(NR*0.99)]/1e3, m/b}'
  done
  for p in "" --h2; do
    SPID=$sa; echo "  -- with cgroups ${p:-HTTP/1.1}:"; srvstat $N /call $RTT --port $pa --token "$TOK" $p -n $N -w 0 -- /bin/true >/dev/null
    SPID=$sb; echo "  -- CONCH_PROC_CGROUPS=0 ${p:-HTTP/1.1}:"; srvstat $N /call $RTT --port $pb --token "$TOK" $p -n $N -w 0 -- /bin/true >/dev/null
  done
  echo "  -- baseline posix_spawn+waitpid (parent and children):"
  cmdstat $N /call spawn build/bench/spawn -n $N -w 0 >/dev/null
  SPID=$sa; stop; SPID=$sb; stop
}

sec_files() {
  command -v nghttpd >/dev/null && command -v curl >/dev/null || { echo "== files: needs nghttpd and curl"; return; }
  echo "== files: $MIB MiB on tmpfs (per MiB)"
  mkdir -p "$W/fs" && mount -t tmpfs -o size=$((MIB * 3 + 64))m tmpfs "$W/fs" || return
  local F=$W/fs
  head -c $SIZE /dev/urandom >"$F/big"
  /usr/bin/python3 - "$F" <<'PY'
import struct, sys
w = sys.argv[1]
def enc(n):
    o = b""
    while True:
        c = n & 0x7f; n >>= 7
        if n: o += bytes([c | 0x80])
        else: return o + bytes([c])
def s(field, b): return bytes([field << 3 | 2]) + enc(len(b)) + b
def env(p): return struct.pack(">BI", 0, len(p)) + p
open(f"{w}/get.env", "wb").write(env(s(1, f"{w}/big".encode())))
with open(f"{w}/big", "rb") as src, open(f"{w}/post.env", "wb") as out:
    first = True
    while True:
        b = src.read(1 << 20)
        if not b: break
        out.write(env((s(1, f"{w}/uploaded".encode()) if first else b"") + s(2, b))); first = False
PY
  start; local cp=$PORT cs=$SPID
  local np; np=$(freeport)
  nghttpd --no-tls -d "$F" $np >/dev/null 2>&1 & local ns=$!; PIDS+=("$ns"); sleep 0.3
  local H=(-H "conch-init-token: $TOK" -H 'Content-Type: application/connect+proto')
  local U=http://127.0.0.1:$cp/pb.FileService
  for r in $(seq $REPS); do
    SPID=$ns; echo "  -- nghttpd -> curl h2c GET, round $r:"
    srvstat $MIB /MiB cmdstat $MIB /MiB curl curl -s --http2-prior-knowledge -o /dev/null http://127.0.0.1:$np/big
    SPID=$cs
    for p in "" --http2-prior-knowledge; do
      local pl=HTTP/1.1; [ -n "$p" ] && pl=h2c
      echo "  -- GetFileStream $pl, round $r:"
      srvstat $MIB /MiB cmdstat $MIB /MiB curl curl -s $p -o /dev/null "${H[@]}" --data-binary @"$F/get.env" $U/GetFileStream
      echo "  -- PostFileStream $pl, round $r:"
      rm -f "$F/uploaded"
      srvstat $MIB /MiB cmdstat $MIB /MiB curl curl -s $p -o /dev/null "${H[@]}" -X POST -T "$F/post.env" $U/PostFileStream
      cmp -s "$F/big" "$F/uploaded" || echo "    UPLOAD MISMATCH"
    done
  done
  stop; SPID=$ns; stop
  umount "$F"
}

sec_keystroke() {
  echo "== keystroke (per key / per call)"
  start
  echo "  -- SendInput:"; srvstat $((N + 50)) /key build/bench/keystroke --port $PORT --token "$TOK" -n $N -w 50
  echo "  -- StreamInput:"; srvstat $((N + 50)) /key build/bench/keystroke --port $PORT --token "$TOK" --stream -n $N -w 50
  echo "  -- GET /health:"; srvstat $((N + 50)) /call $RTT --port $PORT --health -n $N -w 50
  echo "  -- bare PTY (both ends):"; cmdstat $((N + 50)) /key bare build/bench/keystroke --bare -n $N -w 50
  stop
}

sec_rss() {
  echo "== RSS after stdout runs (KiB; glibc arenas from malloc_stats)"
  start
  rss() { awk '/^(Rss|Anonymous):/{printf "%s %s  ", $1, $2}' /proc/$SPID/smaps_rollup; echo; }
  echo "    idle:                $(rss)"
  for p in "" --h2; do
    $RTT --port $PORT --token "$TOK" $p -n 1 -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero >/dev/null
    echo "    after ${p:-h1} stdout: $(rss)"
  done
  for p in "" --h2; do
    # 8 x SIZE, so that the transfer is still running when its client stops
    $RTT --port $PORT --token "$TOK" $p -n 1 -w 0 --expect-stdout $((SIZE * 8)) -- head -c $((SIZE * 8)) /dev/zero >/dev/null & local c=$!
    sleep 0.1; kill -STOP $c; sleep 0.5
    echo "    ${p:-h1} client stopped: $(rss)"
    kill -CONT $c; wait $c
    echo "    just after it:       $(rss)"
  done
  if command -v gdb >/dev/null; then
    : >"$W/server.log"
    gdb -q -p $SPID -batch -ex 'call (void)malloc_stats()' >/dev/null 2>&1
    sed 's/^/    /' "$W/server.log" | grep -v WARN
  fi
  sleep 1.5; echo "    1.5 s later:         $(rss)"
  stop
}

sec_malloc() {
  local T=glibc.malloc.trim_threshold=268435456:glibc.malloc.top_pad=16777216:glibc.malloc.mmap_threshold=33554432
  echo "== malloc thresholds: default vs GLIBC_TUNABLES=$T"
  echo "   (two servers side by side, rounds interleaved with the baseline; medians over 2 x REPS + 2 rounds)"
  mkdir -p "$W/fs" && mount -t tmpfs -o size=$((MIB * 3 + 64))m tmpfs "$W/fs" || return
  local F=$W/fs
  head -c $SIZE /dev/urandom >"$F/big"
  /usr/bin/python3 - "$F" <<'PY'
import struct, sys
w = sys.argv[1]
def enc(n):
    o = b""
    while True:
        c = n & 0x7f; n >>= 7
        if n: o += bytes([c | 0x80])
        else: return o + bytes([c])
def s(field, b): return bytes([field << 3 | 2]) + enc(len(b)) + b
with open(f"{w}/big", "rb") as src, open(f"{w}/post.env", "wb") as out:
    first = True
    while True:
        b = src.read(1 << 20)
        if not b: break
        m = (s(1, f"{w}/uploaded".encode()) if first else b"") + s(2, b)
        out.write(struct.pack(">BI", 0, len(m)) + m); first = False
PY
  start; local pa=$PORT sa=$SPID
  start GLIBC_TUNABLES=$T; local pb=$PORT sb=$SPID
  local H=(-H "conch-init-token: $TOK" -H 'Content-Type: application/connect+proto')
  one() { # label server-pid cmd... → "label seconds faults loop-ms"
    local l=$1 sp=$2; shift 2
    perf stat --no-inherit -x, -e page-faults,task-clock -p $sp -o "$W/m.txt" & local pp=$!
    sleep 0.2
    local s e; s=$(date +%s%N); "$@" >/dev/null; e=$(date +%s%N)
    sleep 0.05; kill -INT $pp; wait $pp
    echo "$l $(( (e - s) / 1000 )) $(awk -F, '/page-faults/{f=$1} /task-clock/{t=$1} END{print f, t}' "$W/m.txt")"
  }
  : >"$W/m.all"
  # stdout first: an upload frees big mmapped chunks, which raises glibc's
  # dynamic trim threshold for good and hides the churn of a fresh daemon
  local s e m p sp pp
  for _ in $(seq $((REPS * 2 + 2))); do
    s=$(date +%s%N); head -c $SIZE /dev/zero | cat >/dev/null; e=$(date +%s%N)
    echo "baseline-head-cat $(( (e - s) / 1000 )) 0 0" >>"$W/m.all"
    for m in default tuned; do
      sp=$sa pp=$pa; [ $m = tuned ] && sp=$sb pp=$pb
      for p in h1 h2; do
        one "$m-stdout-$p" $sp $RTT --port $pp --token "$TOK" $([ $p = h2 ] && echo --h2) -n 1 -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero >>"$W/m.all"
      done
    done
  done
  for _ in $(seq $((REPS * 2 + 2))); do
    for m in default tuned; do
      sp=$sa pp=$pa; [ $m = tuned ] && sp=$sb pp=$pb
      rm -f "$F/uploaded"
      one "$m-post-h1" $sp curl -s -o /dev/null "${H[@]}" -X POST -T "$F/post.env" http://127.0.0.1:$pp/pb.FileService/PostFileStream >>"$W/m.all"
    done
  done
  sort "$W/m.all" | awk -v mib=$MIB '
    { k = $1; n[k]++; w[k, n[k]] = $2; f[k, n[k]] = $3; c[k, n[k]] = $4 }
    function med(a, k,   i, j, t, v, m) { m = n[k]; for (i = 1; i <= m; i++) v[i] = a[k, i]
      for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
      return m % 2 ? v[(m + 1) / 2] : (v[m / 2] + v[m / 2 + 1]) / 2 }
    END { for (k in n) printf "    %-22s n=%d wall %8.1f ms  page faults %8.1f /MiB  loop CPU %5.2f ms/MiB\n", k, n[k], med(w, k) / 1e3, med(f, k) / mib, med(c, k) / mib }' | sort
  echo "    RSS after: default $(awk '/VmRSS/{print $2}' /proc/$sa/status) KiB, tuned $(awk '/VmRSS/{print $2}' /proc/$sb/status) KiB (1.5 s later: trimmed)"
  sleep 1.5
  echo "    RSS 1.5 s later: default $(awk '/VmRSS/{print $2}' /proc/$sa/status) KiB, tuned $(awk '/VmRSS/{print $2}' /proc/$sb/status) KiB"
  SPID=$sa; stop; SPID=$sb; stop
  umount "$F"
}

secs=("$@")
[ ${#secs[@]} -gt 0 ] || secs=(stdout roundtrip files keystroke rss malloc)
echo "profile.sh: $(date -u '+%F %T') UTC, $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
for s in "${secs[@]}"; do "sec_$s"; done
