#!/usr/bin/env bash
# ProcessService benchmarks.  Not part of `make check`.
#
#   * StartProcess round trip of /bin/true (foreground, connect+proto, one
#     keep-alive connection, N sequential calls after a warm-up) over
#     HTTP/1.1 and h2c, against N × posix_spawn+waitpid of /bin/true in the
#     same run (tests/bench/spawn.c), the three interleaved in blocks.
#     Target: p50 ≤ 1.5× the bare spawn.
#     GET /health rows show the transport's share of the round trip.
#     The "spaced" rows: the same, one call every GAP ms (a user's pace).
#   * stdout throughput: `head -c SIZE /dev/zero` through a foreground
#     StartProcess stream (client counts and checks the stdout bytes) against
#     `head -c SIZE /dev/zero | cat >/dev/null`, interleaved, best of REPS.
#     Target ≥ 0.5×.  The "bare relay" row, `head | cat | cat`, is what a
#     relay that reads and writes gets with no protocol at all (3
#     processes, 4 copies, as the agent's path: docs/internals/profile.md).
#     The "TCP relay" rows (tests/bench/relay.c) add what the agent's path
#     has and `cat` has not: a loopback socket to a client process, a
#     16-byte header per ≤ 32 KiB message; once with read+write (the
#     agent's copies), once splicing the pipe into the socket (no copy in
#     user space).
#   * idle RSS of conch-init, and after the runs: at once and 1.5 s later.
#
# Usage: tests/bench/process.sh
# Environment: N (2000) WARM (100) calls, interleaved with the baseline in
#   BLOCKS (4) blocks; GAP_NB (10) calls a block GAP (100) ms apart; SIZE bytes (1073741824); REPS (3);
#   CONCH_INIT_BIN (default build/dev/conch-init, rebuilt with `make`);
#   STRICT=1 makes a missed target an exit status of 1.
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/../.."
N=${N:-2000}
WARM=${WARM:-100}
BLOCKS=${BLOCKS:-4}
SIZE=${SIZE:-1073741824}
REPS=${REPS:-3}
GAP=${GAP:-100}
GAP_NB=${GAP_NB:-10}
STRICT=${STRICT:-0}
if [ -z "${CONCH_INIT_BIN:-}" ]; then
  make -s dev >/dev/null
  BIN=build/dev/conch-init
else
  BIN=$CONCH_INIT_BIN
fi
[ -x "$BIN" ] || { echo "process.sh: $BIN is not executable"; exit 1; }

# ---- tools
mkdir -p build/bench
CFLAGS="-std=gnu11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wshadow -Wformat=2 -Wvla"
cc $CFLAGS -o build/bench/spawn tests/bench/spawn.c tests/bench/stats.c
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2
cc $CFLAGS -o build/bench/relay tests/bench/relay.c
RTT=build/bench/rtt

# ---- server
W=$(mktemp -d /tmp/conch-pbench.XXXXXX)
cleanup() {
  if [ -n "${CIPID:-}" ]; then kill "$CIPID" 2>/dev/null || true; wait "$CIPID" 2>/dev/null || true; fi
  rm -rf "$W"
}
trap cleanup EXIT
PORT=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
TOK=bench-$RANDOM$RANDOM
"$BIN" serve --listen 127.0.0.1:$PORT --token "$TOK" --log-level warn 2>"$W/server.log" & CIPID=$!
up=0
for _ in $(seq 100); do
  if $RTT --port $PORT --health -n 1 -w 0 >/dev/null 2>&1; then up=1; break; fi
  kill -0 $CIPID 2>/dev/null || break
  sleep 0.05
done
[ $up = 1 ] || { echo "process.sh: server did not come up"; cat "$W/server.log"; exit 1; }
RSS_IDLE=$(awk '/VmRSS/{print $2}' /proc/$CIPID/status)

# sanity: StartProcess works on this build, over both protocols
for p in "" --h2; do
  if ! $RTT --port $PORT --token "$TOK" $p -n 1 -w 0 --expect-stdout 3 -- echo hi >"$W/sanity" 2>&1; then
    echo "process.sh: StartProcess sanity check failed${p:+ ($p)}:"; cat "$W/sanity"; tail -5 "$W/server.log"; exit 1
  fi
done

kv() { sed -n "s/.*\<$1=\([^ ]*\).*/\1/p" | head -1; }
cpu() { awk '{print $14 + $15}' /proc/$CIPID/stat; }
HZ=$(getconf CLK_TCK)

# ---- round trip: baseline and calls interleaved in BLOCKS blocks (the load
# of a shared machine drifts), statistics over the pooled samples
NB=$(( (N + BLOCKS - 1) / BLOCKS ))
WB=$(( WARM / BLOCKS > 10 ? WARM / BLOCKS : 10 ))
N=$(( NB * BLOCKS ))
h1_out="" h2_out=""
for _ in $(seq $BLOCKS); do
  build/bench/spawn -n $NB -w $WB -o "$W/spawn.raw" >/dev/null
  h1_out+=$($RTT --port $PORT --token "$TOK" -n $NB -w $WB -o "$W/h1.raw" -- /bin/true)$'\n'
  h2_out+=$($RTT --port $PORT --token "$TOK" --h2 -n $NB -w $WB -o "$W/h2.raw" -- /bin/true)$'\n'
done
pool() { # raw samples (ns) → a stats line like the tools print (nearest-rank percentiles)
  sort -n "$1" | awk '{v[NR] = $1; s += $1}
    function pct(p,  r) { r = int((NR * p + 99) / 100); if (r < 1) r = 1; return v[r] / 1e3 }
    END { printf "pooled n=%d p50_us=%.1f p99_us=%.1f mean_us=%.1f min_us=%.1f max_us=%.1f\n",
          NR, pct(50), pct(99), s / NR / 1e3, v[1] / 1e3, v[NR] / 1e3 }'
}
spawn_out=$(pool "$W/spawn.raw")
rt1_out=$(pool "$W/h1.raw")
rt2_out=$(pool "$W/h2.raw")
# the same at a user's pace: one call alone every GAP ms (the kernel's
# cgroup migration waits for an RCU grace period unless another ran just
# before it, so back-to-back calls hide what a lone command costs)
gs_out="" g1_out=""
for _ in $(seq $BLOCKS); do
  gs_out=$(build/bench/spawn -n $GAP_NB -w 2 -G $GAP -o "$W/gspawn.raw")
  g1_out=$($RTT --port $PORT --token "$TOK" -n $GAP_NB -w 2 -G $GAP -o "$W/gh1.raw" -- /bin/true)
done
gspawn_out=$(pool "$W/gspawn.raw")
grt1_out=$(pool "$W/gh1.raw")
hh1_out=$($RTT --port $PORT -n $N -w $WARM --health)
hh2_out=$($RTT --port $PORT --h2 -n $N -w $WARM --health)
for o in "$h1_out" "$h2_out"; do
  if echo "$o" | grep -q 'reconnects=[1-9]'; then echo "WARNING: the server closed a keep-alive connection during the run"; fi
done
sp50=$(echo "$spawn_out" | kv p50_us)
sp99=$(echo "$spawn_out" | kv p99_us)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a / b}'; }
missed=0
row() { # label, stats output, compare to spawn?
  local p50 p99 mean r50="" r99=""
  p50=$(echo "$2" | kv p50_us); p99=$(echo "$2" | kv p99_us); mean=$(echo "$2" | kv mean_us)
  if [ "$3" = 1 ]; then r50=$(ratio "$p50" "$sp50"); r99=$(ratio "$p99" "$sp99"); fi
  local mark=""
  if [ "$4" = 1 ]; then
    if awk -v r="$r50" 'BEGIN{exit !(r <= 1.5)}'; then mark=ok; else mark=MISS; missed=1; fi
  fi
  printf '%-44s %9s %9s %9s %8s %8s %6s\n' "$1" "$p50" "$p99" "$mean" "$r50" "$r99" "$mark"
}
echo
printf '%-44s %9s %9s %9s %8s %8s %6s\n' "round trip, us (N=$N in $BLOCKS blocks)" p50 p99 mean "x p50" "x p99" "<=1.5x"
row "posix_spawn+waitpid /bin/true (baseline)" "$spawn_out" 1 0
row "StartProcess /bin/true HTTP/1.1 keep-alive" "$rt1_out" 1 1
row "StartProcess /bin/true h2c" "$rt2_out" 1 1
row "GET /health HTTP/1.1 (transport only)" "$hh1_out" 1 0
row "GET /health h2c (transport only)" "$hh2_out" 1 0
sp50=$(echo "$gspawn_out" | kv p50_us)
sp99=$(echo "$gspawn_out" | kv p99_us)
printf '%-44s\n' "spaced: one call every $GAP ms (n=$(( GAP_NB * BLOCKS )))"
row "posix_spawn+waitpid /bin/true (baseline)" "$gspawn_out" 1 0
row "StartProcess /bin/true HTTP/1.1 keep-alive" "$grt1_out" 1 1

# ---- stdout throughput
MIB=$(awk -v s=$SIZE 'BEGIN{printf "%.0f", s / 1048576}')
# the baseline, the relays and both protocols interleaved, REPS rounds, best
# of each; "cpu s/GiB": CPU time of all this machine's CPUs (/proc/stat)
# over the transfer per GiB, the least of the rounds — with two CPUs a
# pipeline cannot run faster than 2 CPUs ÷ that cost
declare -A best=() cost=()
c1=0 c2=0
busy() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8}' /proc/stat; }
mn() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.6f", a < b ? a : b}'; }
note() { # key seconds busy_ticks → best wall, least CPU per GiB
  local c
  c=$(awk -v b="$3" -v hz=$HZ -v s=$SIZE 'BEGIN{printf "%.3f", b / hz / (s / 1073741824)}')
  best[$1]=$(mn "${best[$1]:-999999}" "$2")
  cost[$1]=$(mn "${cost[$1]:-999999}" "$c")
}
pipeline() { # key command: time a shell pipeline
  local s e b0
  b0=$(busy); s=$(date +%s.%N)
  bash -c "$2" >/dev/null
  e=$(date +%s.%N)
  note "$1" "$(awk -v s=$s -v e=$e 'BEGIN{printf "%.6f", e - s}')" $(( $(busy) - b0 ))
}
thru() { # key protocol-flag: one transfer; adds the server's CPU ticks to c1/c2
  local c0 b0 out
  c0=$(cpu); b0=$(busy)
  out=$($RTT --port $PORT --token "$TOK" $2 -n 1 -w 0 --expect-stdout $SIZE -- head -c $SIZE /dev/zero)
  note "$1" "$(echo "$out" | kv seconds)" $(( $(busy) - b0 ))
  if [ "$1" = h1 ]; then c1=$((c1 + $(cpu) - c0)); else c2=$((c2 + $(cpu) - c0)); fi
}
for _ in $(seq $REPS); do
  pipeline pipe "head -c $SIZE /dev/zero | cat >/dev/null"
  pipeline relay "head -c $SIZE /dev/zero | cat | cat >/dev/null"
  pipeline rw "head -c $SIZE /dev/zero | build/bench/relay -m rw"
  pipeline splice "head -c $SIZE /dev/zero | build/bench/relay -m splice"
  thru h1 ""
  thru h2 --h2
done
cpu1=$(awk -v c=$c1 -v hz=$HZ -v r=$REPS 'BEGIN{printf "%.2f", c / hz / r}')
cpu2=$(awk -v c=$c2 -v hz=$HZ -v r=$REPS 'BEGIN{printf "%.2f", c / hz / r}')
trow() { # label key server-cpu target?
  local r mark="" t=${best[$2]}
  r=$(awk -v b=${best[pipe]} -v t=$t 'BEGIN{printf "%.2f", b / t}')
  if [ "$4" = 1 ]; then
    if awk -v r="$r" 'BEGIN{exit !(r >= 0.5)}'; then mark=ok; else mark=MISS; missed=1; fi
  fi
  printf '%-44s %9.3f %9.0f %9s %9.2f %8s %8s\n' "$1" "$t" "$(awk -v m=$MIB -v t=$t 'BEGIN{print m / t}')" "$3" "${cost[$2]}" "$r" "$mark"
}
echo
printf '%-44s %9s %9s %9s %9s %8s %8s\n' "stdout throughput, $MIB MiB (best of $REPS)" seconds "MiB/s" "srv cpu" "cpu s/GiB" "ratio" ">=0.5x"
trow "head | cat >/dev/null (baseline)" pipe "" 0
trow "head | cat | cat >/dev/null (a bare relay)" relay "" 0
trow "TCP relay, read+write (relay.c -m rw)" rw "" 0
trow "TCP relay, splice (relay.c -m splice)" splice "" 0
trow "StartProcess stdout HTTP/1.1" h1 "$cpu1" 1
trow "StartProcess stdout h2c" h2 "$cpu2" 1

RSS_AFTER=$(awk '/VmRSS/{print $2}' /proc/$CIPID/status)
# the daemon gives freed heap back 1 s after a connection closes (conn.c's
# trim timer), so both: at once, and once that has run
sleep 1.5
RSS_SETTLED=$(awk '/VmRSS/{print $2}' /proc/$CIPID/status)
echo
echo "conch-init RSS: idle ${RSS_IDLE} KiB, after the runs ${RSS_AFTER} KiB, 1.5 s later ${RSS_SETTLED} KiB"
if grep -q . "$W/server.log"; then echo "server log (warn and above):"; tail -5 "$W/server.log"; fi
[ "$STRICT" = 1 ] && [ $missed = 1 ] && exit 1
exit 0
