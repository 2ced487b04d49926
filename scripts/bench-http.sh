#!/usr/bin/env bash
# HTTP: an axum hello-world alone, behind turnstile's RateLimitLayer (in memory, nothing
# denied; with and without its RateLimit headers) and behind tower_governor's GovernorLayer (without
# and with its x-ratelimit-* headers, `.use_headers()`),
# loaded by wrk on loopback — what a user runs: the release build, the layer's default
# configuration (keyed by peer IP, headers on). The server is pinned to one CPU and wrk to the
# other (taskset -c SERVER_CPU / CLIENT_CPU, 0 and 1 by default; the server's tokio runtime
# then has one worker); ROUNDS rounds (default 9), the stacks in alternating order, DURATION
# each (default 5s) after a 1 s warm-up, CONNECTIONS connections (default 64) from one wrk
# thread. Prints the load average, requests/s
# and p99 latency per stack (median, min-max over rounds) and the paired ratios (same round),
# over the rounds other processes did not disturb (see scripts/bench-lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

ROUNDS="${ROUNDS:-9}"
DURATION="${DURATION:-5s}"
CONNECTIONS="${CONNECTIONS:-64}"
MODES=(bare turnstile turnstile-no-headers tower-governor tower-governor-headers)

need wrk wrk
need taskset util-linux
cargo build --release -q -p turnstile-benches --bin http_server
SERVER="${CARGO_TARGET_DIR:-target}/release/http_server"
OUT=$(mktemp -d)
SERVER_PID=
cleanup() {
  [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$OUT"
}
trap cleanup EXIT

# to_us VALUE: wrk's latency ("812.00us", "1.21ms", "1.02s") in microseconds.
to_us() {
  awk -v v="$1" 'BEGIN {
    n = v + 0
    if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000;
    else if (v ~ /m$/) print n * 60000000; else if (v ~ /s$/) print n * 1000000; else print n }'
}

# once MODE: one wrk run against a fresh server; sets RPS, P99 (us) and FOREIGN.
once() {
  local mode=$1 port log
  log="$OUT/server.log"
  taskset -c "$SERVER_CPU" "$SERVER" --mode "$mode" --port 0 >"$log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 100); do grep -q '^listening on' "$log" && break; sleep 0.05; done
  port=$(sed -n 's/^listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$log")
  [ -n "$port" ] || { echo "server $mode did not start:" >&2; cat "$log" >&2; exit 1; }
  local url="http://127.0.0.1:$port/"
  taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d1s "$url" >/dev/null
  wait_quiet
  measure_begin "$SERVER_PID"
  taskset -c "$CLIENT_CPU" wrk -t1 -c"$CONNECTIONS" -d"$DURATION" --latency "$url" >"$OUT/wrk.txt"
  measure_end "$SERVER_PID"
  kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true; SERVER_PID=
  if grep -q 'Non-2xx' "$OUT/wrk.txt"; then
    echo "$mode: some responses were not 2xx (a limiter denied?):" >&2; cat "$OUT/wrk.txt" >&2; exit 1
  fi
  RPS=$(awk '/^Requests\/sec:/ { print $2 }' "$OUT/wrk.txt")
  P99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$OUT/wrk.txt")")
}

# run MODE ROUND: up to TRIES runs until one had at most FOREIGN_MAX % foreign CPU; appends
# "rps p99_us foreign%" of the kept one to $OUT/MODE.
run() {
  local mode=$1 round=$2 try best_f=1000000 best mark=''
  for try in $(seq "$TRIES"); do
    once "$mode"
    if [ "$FOREIGN" -lt "$best_f" ]; then best_f=$FOREIGN; best="$RPS $P99"; fi
    [ "$FOREIGN" -le "$FOREIGN_MAX" ] && break
  done
  [ "$best_f" -gt "$FOREIGN_MAX" ] && mark='*'
  echo "$best $best_f" >>"$OUT/$mode"
  read -r RPS P99 <<<"$best"
  printf '  round %d  %-22s %10.0f req/s  p99 %8.0f us  (foreign CPU %d%%%s, tries %d)\n' \
    "$round" "$mode" "$RPS" "$P99" "$best_f" "$mark" "$try"
}

machine
echo "# commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# HTTP GET / on loopback: wrk -t1 -c$CONNECTIONS -d$DURATION, server on CPU $SERVER_CPU, wrk on CPU $CLIENT_CPU, $ROUNDS rounds"
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order=("${MODES[@]}"); else order=(); for ((i=${#MODES[@]}-1; i>=0; i--)); do order+=("${MODES[i]}"); done; fi
  for mode in "${order[@]}"; do run "$mode" "$round"; done
done

# The summaries use the undisturbed rounds (foreign CPU <= FOREIGN_MAX, for a ratio: both of
# its runs) when there are at least 3 of them, else every round.
col() {  # file column
  awk -v m="$FOREIGN_MAX" -v c="$2" '{ v[NR] = $c; ok[NR] = ($3 <= m); n += ok[NR] }
    END { for (i = 1; i <= NR; i++) if (n < 3 || ok[i]) print v[i] }' "$1"
}
ratio() {  # a b: paired ratio of requests/s
  paste -d' ' "$OUT/$1" "$OUT/$2" | awk -v m="$FOREIGN_MAX" '{ r[NR] = $1 / $4; ok[NR] = ($3 <= m && $6 <= m); n += ok[NR] }
    END { for (i = 1; i <= NR; i++) if (n < 3 || ok[i]) print r[i] }' | stats %.3f
}
clean() {  # a [b]: how many rounds the summary used
  if [ $# = 1 ]; then col "$OUT/$1" 1 | wc -l
  else paste -d' ' "$OUT/$1" "$OUT/$2" | awk -v m="$FOREIGN_MAX" '{ n += ($3 <= m && $6 <= m) } END { print (n < 3 ? NR : n) }'; fi
}

echo
printf '%-22s %-32s %-28s %s\n' "stack" "requests/s median (min-max)" "p99 us median (min-max)" "rounds used"
for mode in "${MODES[@]}"; do
  printf '%-22s %-32s %-28s %s of %s\n' "$mode" "$(col "$OUT/$mode" 1 | stats)" "$(col "$OUT/$mode" 2 | stats)" "$(clean "$mode")" "$ROUNDS"
done
echo
echo "paired ratios of requests/s (same round), median (min-max), rounds used:"
pr() { printf '  %-40s %-24s %s of %s%s\n' "$1 / $2" "$(ratio "$1" "$2")" "$(clean "$1" "$2")" "$ROUNDS" "${3:-}"; }
pr turnstile bare "   (goal >= 0.95)"
pr turnstile-no-headers bare
pr tower-governor bare
pr tower-governor-headers bare
pr turnstile tower-governor-headers "   (like for like: both send headers)"
pr turnstile-no-headers tower-governor "   (like for like: neither does)"
echo "# load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
