#!/usr/bin/env bash
# ProcessService benchmarks (issue 3).  Not part of `make check`.
#
#   * StartProcess round trip of /bin/true (foreground, proto): HTTP/1.1
#     keep-alive (tests/bench/proc_rtt, p50/p99) and h2c (h2load, one
#     stream at a time: mean/max), against a plain C loop of
#     posix_spawn+waitpid of /bin/true in the same run (the baseline;
#     target ≤ 1.5× the bare spawn);
#   * stdout throughput of `head -c SIZE /dev/zero` through a foreground
#     stream read by curl (HTTP/1.1, into /dev/null), against the same pipeline into `cat >/dev/null`
#     (target ≥ 0.5×).
#
# Usage: tests/bench/process.sh [N] [SIZE_MIB]   (defaults 2000, 1024)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${CONCH_INIT_BIN:-build/dev/conch-init}
N=${1:-2000}
SIZE_MIB=${2:-1024}
[ -x "$BIN" ] || make dev >/dev/null
command -v h2load >/dev/null || { echo "missing h2load (apt-get install nghttp2-client)"; exit 1; }
W=$(mktemp -d /tmp/conch-pbench.XXXXXX)
cleanup() { [ -n "${CIPID:-}" ] && kill "$CIPID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
cc -O2 -o "$W/proc_rtt" tests/bench/proc_rtt.c

PORT=$(/usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
TOK=benchtoken
"$BIN" serve --listen 127.0.0.1:$PORT --token $TOK --log-level warn & CIPID=$!
sleep 0.5

/usr/bin/python3 - "$W" "$SIZE_MIB" <<'PY'
import struct, sys
w, size = sys.argv[1], int(sys.argv[2])
def s(field, b): return bytes([field << 3 | 2, len(b)]) + b
env = lambda p: struct.pack(">BI", 0, len(p)) + p
open(f"{w}/true.env", "wb").write(env(s(1, b"/bin/true")))
open(f"{w}/head.env", "wb").write(env(s(1, b"head") + s(2, b"-c") + s(2, str(size << 20).encode()) + s(2, b"/dev/zero")))
PY

echo "-- StartProcess /bin/true round trip, $N calls (microseconds)"
"$W/proc_rtt" spawn 200 >/dev/null   # warm up
"$W/proc_rtt" h1 $PORT $TOK 200 >/dev/null
read -r b50 b99 bmean < <("$W/proc_rtt" spawn "$N")
read -r h50 h99 hmean < <("$W/proc_rtt" h1 $PORT $TOK "$N")
printf "bare posix_spawn+waitpid  p50 %6d  p99 %6d  mean %6d\n" "$b50" "$b99" "$bmean"
printf "StartProcess HTTP/1.1     p50 %6d  p99 %6d  mean %6d   ratio p50 %.2fx p99 %.2fx\n" \
  "$h50" "$h99" "$hmean" "$(echo "$h50/$b50" | bc -l)" "$(echo "$h99/$b99" | bc -l)"
h2out=$(h2load -n "$N" -c 1 -m 1 -d "$W/true.env" -H 'content-type: application/connect+proto' \
  -H "conch-init-token: $TOK" "http://127.0.0.1:$PORT/pb.ProcessService/StartProcess" 2>&1)
echo "$h2out" | grep -q " 0 failed, 0 errored" || { echo "$h2out"; exit 1; }
read -r _ _ _ h2min h2max h2mean _ < <(echo "$h2out" | grep "time for request:")
to_us() { case $1 in *us) echo "${1%us}";; *ms) echo "${1%ms}*1000" | bc -l;; *s) echo "${1%s}*1000000" | bc -l;; esac; }
printf "StartProcess h2c (h2load) mean %6.0f  max %6.0f   ratio mean %.2fx (vs bare mean)\n" \
  "$(to_us $h2mean)" "$(to_us $h2max)" "$(echo "$(to_us $h2mean)/$bmean" | bc -l)"

echo "-- stdout throughput, $SIZE_MIB MiB of /dev/zero"
t0=$(date +%s.%N); sh -c "head -c $((SIZE_MIB << 20)) /dev/zero | cat >/dev/null"; t1=$(date +%s.%N)
base=$(echo "$t1 - $t0" | bc -l)
t0=$(date +%s.%N)
got=$(curl -s -o /dev/null -w '%{size_download}' -H 'Content-Type: application/connect+proto' \
  -H "conch-init-token: $TOK" --data-binary @"$W/head.env" "http://127.0.0.1:$PORT/pb.ProcessService/StartProcess")
t1=$(date +%s.%N)
strm=$(echo "$t1 - $t0" | bc -l)
printf "pipe into cat            %6.2f s  %7.0f MiB/s\n" "$base" "$(echo "$SIZE_MIB/$base" | bc -l)"
printf "foreground stream (curl) %6.2f s  %7.0f MiB/s   ratio %.2fx  (%d bytes of envelopes)\n" \
  "$strm" "$(echo "$SIZE_MIB/$strm" | bc -l)" "$(echo "$base/$strm" | bc -l)" "$got"
