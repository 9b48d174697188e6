#!/usr/bin/env bash
# tests/bench/floor.sh — the StartProcess round trip against its floor
# (docs/internals/profile.md).  Not part of `make check`.
#
# Interleaved in BLOCKS blocks of N/BLOCKS calls each (the load of a shared
# machine drifts; statistics over the pooled samples; the order turns each block):
#   spawn       posix_spawn+waitpid of /bin/true in one process (process.sh's baseline)
#   direct      rtfloor -m direct: the agent's own proc_spawn + waitpid, no server
#   direct-cg   the same, each child born in a fresh cgroup (the kernel's cost of one)
#   pool        rtfloor -m pool: the agent's structure and nothing else — a
#               server process whose loop hands the spawn to a worker thread,
#               polls the pipes, reaps by signalfd, answers in two writes
#   pool-cg     the same with a fresh cgroup per command, made ahead: the
#               agent's floor
#   pool-cg-1   the same, start and end answered in one write
#   loop-cg     pool-cg with the spawn on the loop thread (the rule forbids it)
#   agent       conch-init serve, StartProcess /bin/true over HTTP/1.1 (rtt)
#   agent-nocg  the same with CONCH_PROC_CGROUPS=0
# Prints p50/p99 and each p50 ÷ spawn's; then the same again at a user's
# pace, GAP_N calls a block, one every GAP ms (GAP=0: left out).  The cgroups are made below
# a directory of this shell's own cgroup in the cgroup2 hierarchy; without a
# writable one the -cg rows are left out (said so).
#
# Usage: tests/bench/floor.sh     Environment: N (1000) BLOCKS (4) GAP (100) GAP_N (10);
#   CONCH_INIT_BIN (default build/dev/conch-init; build/dev/libconch.a is made either way).
set -euo pipefail
cd "$(dirname "$0")/../.."
N=${N:-1000} BLOCKS=${BLOCKS:-4} GAP=${GAP:-100} GAP_N=${GAP_N:-10}
make -s dev >/dev/null; BIN=${CONCH_INIT_BIN:-build/dev/conch-init}
mkdir -p build/bench
CFLAGS="-std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wvla"
cc $CFLAGS -o build/bench/spawn tests/bench/spawn.c tests/bench/stats.c
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2
cc $CFLAGS -I. -o build/bench/rtfloor tests/bench/rtfloor.c tests/bench/stats.c build/dev/libconch.a -lpthread
W=$(mktemp -d /tmp/conch-floor.XXXXXX)
PIDS=()
MNT=$(findmnt -n -t cgroup2 -o TARGET | head -1 || true)
CG=
if [ -n "$MNT" ]; then
  CG=$MNT$(awk -F: '$1 == 0 {print $3}' /proc/self/cgroup)/conch-floor-$$
  CG=${CG//\/\//\/}
  mkdir "$CG" 2>/dev/null && [ -e "$CG/cgroup.procs" ] || { rmdir "$CG" 2>/dev/null; CG=; }
fi
cleanup() {
  set +e
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$W"; [ -z "$CG" ] || rmdir "$CG"/*/ "$CG" 2>/dev/null || [ ! -d "$CG" ] || echo "floor.sh: $CG left behind"
}
trap cleanup EXIT
TOK=floor-$RANDOM$RANDOM
freeport() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
start() { # [env...] → PORT
  PORT=$(freeport)
  env "$@" "$BIN" serve --listen 127.0.0.1:$PORT --token "$TOK" --log-level error 2>>"$W/server.log" &
  PIDS+=($!)
  for _ in $(seq 100); do build/bench/rtt --port $PORT --health -n 1 -w 0 >/dev/null 2>&1 && return; sleep 0.05; done
  echo "floor.sh: server did not come up"; cat "$W/server.log"; exit 1
}
start; PA=$PORT
start CONCH_PROC_CGROUPS=0; PB=$PORT

run() { # tag calls gap_ms set
  local t=$1 n=$2 g=$3 o="$W/$4-$1.raw" f=build/bench/rtfloor
  case $t in
    spawn) build/bench/spawn -n $n -w 10 -G $g -o "$o" ;;
    direct) $f -m direct -n $n -w 10 -G $g -o "$o" ;;
    direct-cg) $f -m direct -c "$CG" -n $n -w 10 -G $g -o "$o" ;;
    pool) $f -m pool -n $n -w 10 -G $g -o "$o" ;;
    pool-cg) $f -m pool -c "$CG" -n $n -w 10 -G $g -o "$o" ;;
    pool-cg-1) $f -m pool -1 -c "$CG" -n $n -w 10 -G $g -o "$o" ;;
    loop-cg) $f -m loop -c "$CG" -n $n -w 10 -G $g -o "$o" ;;
    agent) build/bench/rtt --port $PA --token "$TOK" -n $n -w 10 -G $g -o "$o" -- /bin/true ;;
    agent-nocg) build/bench/rtt --port $PB --token "$TOK" -n $n -w 10 -G $g -o "$o" -- /bin/true ;;
  esac >/dev/null
}
TAGS="spawn direct pool agent-nocg"
if [ -n "$CG" ]; then TAGS="$TAGS direct-cg pool-cg pool-cg-1 loop-cg agent"
else echo "floor.sh: no writable cgroup2 directory: the -cg rows and the agent with cgroups left out"; fi
p50() { sort -n "$1" | awk '{v[NR]=$1} END{printf "%.1f", v[int((NR+1)/2)]/1e3}'; }
p99() { sort -n "$1" | awk '{v[NR]=$1} END{i=int(NR*0.99); if(i<1)i=1; printf "%.1f", v[i]/1e3}'; }
table() { # set n gap
  local s=$1 n=$2 nb=$(( ($2 + BLOCKS - 1) / BLOCKS )) g=$3
  for b in $(seq $BLOCKS); do
    # the order turns each block, so that no tag always follows the same one
    set -- $TAGS; local k=$(( (b - 1) % $# )); local order=("${@:k+1}" "${@:1:k}")
    for t in "${order[@]}"; do run $t $nb $g $s; done
  done
  local sp
  sp=$(p50 "$W/$s-spawn.raw")
  printf '%-16s %8s %8s %8s\n' "$s (n=$n)" p50_us p99_us "÷ spawn"
  for t in $TAGS; do
    local m; m=$(p50 "$W/$s-$t.raw")
    printf '%-16s %8s %8s %8.2f\n' "$t" "$m" "$(p99 "$W/$s-$t.raw")" "$(awk -v m="$m" -v b="$sp" 'BEGIN{print m / b}')"
  done
}
echo "floor.sh: $(date -u '+%F %T') UTC, $(uname -r), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $BIN"
table back $N 0
[ "$GAP" = 0 ] || { echo; table spaced $((GAP_N * BLOCKS)) $GAP; }
