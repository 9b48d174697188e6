#!/usr/bin/env bash
# tests/bench/ab.sh OLD_BIN NEW_BIN [ROUNDS] — two conch-init binaries side
# by side on the user-visible RPC figures, rounds alternating (old, new /
# new, old) so that a drift of the shared machine's load hits both:
#   * unary rate: h2load -c10 -m10, N ListFiles calls (JSON, a dir of 10 files),
#     and the same of one small file (files.sh's "ListFiles of that file")
#   * a big answer: h2load -c2 -m1, N10K ListFiles of 10 000 entries (JSON),
#     identity and gzip (files.sh's last rows)
#   * RPC latency: StartProcess{/bin/true} round trip p50 over h2c (rtt.c),
#     back to back and at a user's pace (NGAP calls, one every 100 ms)
#   * transport latency: GET /health p50, HTTP/1.1 and h2c (rtt.c)
# Prints the median of each figure over ROUNDS (default 7), new ÷ old, and
# the median of the rounds' own new ÷ old (RAW=FILE keeps every sample).
# Used to judge whether a special allocator, cache or memo earns its keep
# (docs/internals/README.md: at least 10 % on one of these).
set -u
cd "$(dirname "$0")/../.."
OLD=$1 NEW=$2 ROUNDS=${3:-7} N=${N:-20000} NRTT=${NRTT:-2000} NGAP=${NGAP:-20} N10K=${N10K:-100}
for t in h2load; do command -v $t >/dev/null || { echo "missing $t (nghttp2-client)"; exit 1; }; done
mkdir -p build/bench
CFLAGS="-O2 -std=gnu11 -D_GNU_SOURCE -Wall"
cc $CFLAGS -o build/bench/rtt tests/bench/rtt.c tests/bench/stats.c -lnghttp2 || exit 1
W=$(mktemp -d); trap 'kill $PO $PN 2>/dev/null; rm -rf "$W"' EXIT
mkdir "$W/d"; for i in 0 1 2 3 4 5 6 7 8 9; do echo "$i" > "$W/d/f$i"; done
printf '{"path": "%s", "depth": 1}' "$W/d" > "$W/list.json"
printf '{"path": "%s"}' "$W/d/f0" > "$W/list1.json"
mkdir "$W/k"; (cd "$W/k" && seq -f 'file-%05g.txt' 0 9999 | xargs touch)
printf '{"path": "%s"}' "$W/k" > "$W/list10k.json"
port() { /usr/bin/python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
TOK=benchtoken
start() { local bin=$1 p=$2; "$bin" serve --listen 127.0.0.1:$p --token $TOK --log-level warn & }
PTO=$(port); start "$OLD" $PTO; PO=$!
PTN=$(port); start "$NEW" $PTN; PN=$!
sleep 0.5
rate() { # port body [h2load options...]
  local p=$1 b=$2; shift 2
  h2load -n $N -c 10 -m 10 "$@" -d "$b" -H 'content-type: application/json' \
  -H 'connect-protocol-version: 1' -H "conch-init-token: $TOK" http://127.0.0.1:$p/pb.FileService/ListFiles \
  2>/dev/null | awk '/^finished in/{gsub(",","");print $4}'; }
p50() { awk '{for(i=1;i<=NF;i++) if ($i ~ /^p50_us=/) {sub("p50_us=","",$i); print $i}}'; }
proc() { CONCH_INIT_TOKEN=$TOK build/bench/rtt --port $1 --h2 -n $NRTT -w 100 -- /bin/true | p50; }
procgap() { CONCH_INIT_TOKEN=$TOK build/bench/rtt --port $1 --h2 -n $NGAP -w 2 -G 100 -- /bin/true | p50; }
health() { build/bench/rtt --port $1 $2 -n $NRTT -w 100 --health | p50; }
one() { # port tag
  echo "$2 rate $(rate $1 "$W/list.json")" >> "$W/res"
  echo "$2 one $(rate $1 "$W/list1.json")" >> "$W/res"
  echo "$2 id10k $(rate $1 "$W/list10k.json" -n $N10K -c 2 -m 1)" >> "$W/res"
  echo "$2 gz10k $(rate $1 "$W/list10k.json" -n $N10K -c 2 -m 1 -H 'accept-encoding: gzip')" >> "$W/res"
  echo "$2 proc $(proc $1)" >> "$W/res"
  echo "$2 gap $(procgap $1)" >> "$W/res"
  echo "$2 h1 $(health $1 '')" >> "$W/res"
  echo "$2 h2 $(health $1 --h2)" >> "$W/res"
}
for r in $(seq 1 $ROUNDS); do
  if [ $((r % 2)) = 1 ]; then one $PTO old; one $PTN new; else one $PTN new; one $PTO old; fi
done
med() { grep "^$1 $2 " "$W/res" | awk '{print $3}' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
[ -n "${RAW:-}" ] && cp "$W/res" "$RAW"
# the median of the per-round ratios too: a round's pair ran back to back
pmed() { paste <(grep "^old $1 " "$W/res" | awk '{print $3}') <(grep "^new $1 " "$W/res" | awk '{print $3}') |
  awk '{print $2 / $1}' | sort -g | awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)]}'; }
printf '%-44s %10s %10s %8s %8s\n' "median of $ROUNDS rounds" old new "new/old" "paired"
for f in "rate:ListFiles rate, h2load -c10 -m10 (req/s)" "one:ListFiles of one file, same (req/s)" \
         "id10k:ListFiles 10 000 entries, -c2 -m1 (req/s)" "gz10k:the same with gzip (req/s)" "proc:StartProcess /bin/true p50, h2c (us)" \
         "gap:StartProcess p50, one every 100 ms (us)" \
         "h1:GET /health p50, HTTP/1.1 (us)" "h2:GET /health p50, h2c (us)"; do
  k=${f%%:*}; o=$(med old $k); n=$(med new $k)
  printf '%-44s %10s %10s %8s %8s\n' "${f#*:}" "$o" "$n" "$(echo "scale=3; $n / $o" | bc)" "$(pmed $k)"
done
