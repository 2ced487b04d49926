#!/usr/bin/env bash
# Redis: decisions through turnstile's RedisBackend against redis-benchmark running EVALSHA of
# the same script (turnstile_redis::CHECK_SCRIPT) with the same arguments and the same
# concurrency: the ceiling of a one-round-trip design. Then a flood: one key far over its
# limit from 64 tasks, with the backend's deny cache off and on, counting Redis calls per
# decision (INFO commandstats, evalsha calls before and after).
#
# A private redis-server (free port, no persistence) runs on one CPU, the load generators on
# the other. ROUNDS rounds (default 5), the contenders in alternating order; DURATION_MS per
# RedisBackend run (default 4000), REQUESTS per redis-benchmark run (default 40000; 15000 for
# one client).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

ROUNDS="${ROUNDS:-5}"
DURATION_MS="${DURATION_MS:-4000}"
REQUESTS="${REQUESTS:-40000}"
CONCURRENCY="${CONCURRENCY:-1 16 64}"

need taskset util-linux
cargo build --release -q -p turnstile-benches --bin redis_bench
BENCH="${CARGO_TARGET_DIR:-target}/release/redis_bench"
OUT=$(mktemp -d)
start_redis
trap 'stop_redis; rm -rf "$OUT"' EXIT
R=(redis-cli -p "$REDIS_PORT")
"$BENCH" script >"$OUT/check.lua"
SHA=$("${R[@]}" -x SCRIPT LOAD <"$OUT/check.lua")

# The check script's arguments for one all-admitting token bucket, as RedisBackend sends them
# (lua/check.lua's header): KEYS[1] the key's configuration hash; ARGV: time ('' = the
# server's TIME), cost, least TTL, unconfigured mode, op, key base, 1 policy set: tier '', 1
# policy: algorithm 1 (token bucket), limit 1, period 1000 ms, burst 10^9, name "bench". The
# client key is 32 characters, as the backend's hashed keys are; redis-benchmark puts a
# random 12-digit number in place of each __rand_int__ (-r 10000: 10,000 keys).
TAG='00000000000000000000__rand_int__'
ARGS=(1 "turnstile:v1:{$TAG}~cfg" '' 1 0 defaults check "turnstile:v1:{$TAG}" 1 '' 1 1 1 1000 1000000000 bench)

# Proof the invocation is the same decision: both admit, same fields.
"${R[@]}" EVALSHA "$SHA" 1 'turnstile:v1:{probe}~cfg' '' 1 0 defaults check 'turnstile:v1:{probe}' 1 '' 1 1 1 1000 1000000000 bench \
  | sed -n '6,12p' | tr '\n' ' ' | awk '{ if ($6 != 1) { print "the redis-benchmark invocation is not admitted: " $0; exit 1 } }'

evalsha_calls() { "${R[@]}" INFO commandstats | sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\),.*/\1/p' | tr -d '\r' | sed 's/^$/0/'; }
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p"; }

# One measured run, on a quiet machine, retried while disturbed (see bench-lib.sh). Sets
# LINE to "rate p50_us p99_us" and FOREIGN.
turnstile_once() {  # concurrency [extra args]
  local c=$1; shift
  wait_quiet; measure_begin "$REDIS_PID"
  taskset -c "$CLIENT_CPU" "$BENCH" run --url "redis://127.0.0.1:$REDIS_PORT" --concurrency "$c" \
    --duration-ms "$DURATION_MS" "$@" >"$OUT/run.txt"
  measure_end "$REDIS_PID"
  LINE="$(field per_sec <"$OUT/run.txt") $(field p50_us <"$OUT/run.txt") $(field p99_us <"$OUT/run.txt")"
}
benchmark_once() {  # concurrency
  local c=$1 n=$REQUESTS
  [ "$c" = 1 ] && n=$(( REQUESTS * 3 / 8 ))
  wait_quiet; measure_begin "$REDIS_PID"
  taskset -c "$CLIENT_CPU" redis-benchmark -p "$REDIS_PORT" -c "$c" -n "$n" -r 10000 --csv \
    evalsha "$SHA" "${ARGS[@]}" >"$OUT/rb.txt"
  measure_end "$REDIS_PID"
  # "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
  LINE=$(tail -1 "$OUT/rb.txt" | tr -d '"' | awk -F, '{ printf("%s %.1f %.1f\n", $2, $5 * 1000, $7 * 1000) }')
}
keep() {  # file label round: runs $ONCE until undisturbed, appends the kept LINE to file
  local file=$1 label=$2 round=$3 try best best_f=1000000 mark="" a b c
  for try in $(seq "$TRIES"); do
    "${ONCE[@]}"
    if [ "$FOREIGN" -lt "$best_f" ]; then best_f=$FOREIGN; best=$LINE; fi
    [ "$FOREIGN" -le "$FOREIGN_MAX" ] && break
  done
  [ "$best_f" -gt "$FOREIGN_MAX" ] && mark='*'
  echo "$best" >>"$file"
  read -r a b c <<<"$best"
  printf '  round %d  %-34s %9.0f /s  p50 %8.1f us  p99 %8.1f us  (foreign CPU %d%%%s)\n' \
    "$round" "$label" "$a" "$b" "$c" "$best_f" "$mark"
}

machine
echo "# redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on CPU $SERVER_CPU (port $REDIS_PORT, no persistence); clients on CPU $CLIENT_CPU; $ROUNDS rounds"
echo "# check script sha $SHA; 10,000 keys; one all-admitting token bucket (1/s, burst 10^9)"
for c in $CONCURRENCY; do
  echo "concurrency $c:"
  for round in $(seq "$ROUNDS"); do
    if [ $((round % 2)) = 1 ]; then order="t b"; else order="b t"; fi
    for who in $order; do
      if [ "$who" = t ]; then
        ONCE=(turnstile_once "$c"); keep "$OUT/t$c" "RedisBackend ($c tasks, pool $c)" "$round"
      else
        ONCE=(benchmark_once "$c"); keep "$OUT/b$c" "redis-benchmark EVALSHA (-c $c)" "$round"
      fi
    done
  done
done

# The flood: one key, 10 per second, 64 tasks; deny cache off, then on (alternating).
FLOOD_C="${FLOOD_CONCURRENCY:-64}"
flood_once() {  # on|off
  local before after
  wait_quiet; before=$(evalsha_calls); measure_begin "$REDIS_PID"
  taskset -c "$CLIENT_CPU" "$BENCH" run --url "redis://127.0.0.1:$REDIS_PORT" --concurrency "$FLOOD_C" \
    --duration-ms "$DURATION_MS" --flood --deny-cache "$1" >"$OUT/run.txt"
  measure_end "$REDIS_PID"; after=$(evalsha_calls)
  # The warm-up's calls are in the difference too: count the decisions of the warm-up as
  # the backend saw them (its own call count covers the measured part only).
  local d calls
  d=$(field decisions <"$OUT/run.txt"); calls=$(field backend_redis_calls <"$OUT/run.txt")
  LINE="$(field per_sec <"$OUT/run.txt") $(awk -v c="$calls" -v d="$d" 'BEGIN { printf("%.5f", c / d) }') $(field p99_us <"$OUT/run.txt") $((after - before)) $calls $d"
}
echo "flood: one key, token bucket 10 per second, $FLOOD_C tasks, ${DURATION_MS} ms:"
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order="off on"; else order="on off"; fi
  for dc in $order; do
    ONCE=(flood_once "$dc")
    for try in $(seq "$TRIES"); do "${ONCE[@]}"; [ "$FOREIGN" -le "$FOREIGN_MAX" ] && break; done
    echo "$LINE" >>"$OUT/flood-$dc"
    read -r rate cpd p99 info_calls calls d <<<"$LINE"
    printf '  round %d  deny cache %-3s %10.0f decisions/s  %.5f Redis calls/decision (%d calls / %d decisions; INFO commandstats: %d evalsha incl. warm-up)  p99 %.1f us  (foreign CPU %d%%)\n' \
      "$round" "$dc" "$rate" "$cpd" "$calls" "$d" "$info_calls" "$p99" "$FOREIGN"
  done
done

echo
echo "RedisBackend vs redis-benchmark EVALSHA of the same script (median (min-max) over rounds):"
printf '%-6s %-36s %-36s %-24s %-24s %-22s\n' tasks "RedisBackend decisions/s" "redis-benchmark EVALSHA/s" "p50 us (RB | r-b)" "p99 us (RB | r-b)" "paired ratio RB/r-b"
for c in $CONCURRENCY; do
  printf '%-6s %-36s %-36s %-24s %-24s %-22s\n' "$c" \
    "$(cut -d' ' -f1 "$OUT/t$c" | stats)" "$(cut -d' ' -f1 "$OUT/b$c" | stats)" \
    "$(cut -d' ' -f2 "$OUT/t$c" | stats %.0f | cut -d' ' -f1) | $(cut -d' ' -f2 "$OUT/b$c" | stats %.0f | cut -d' ' -f1)" \
    "$(cut -d' ' -f3 "$OUT/t$c" | stats %.0f | cut -d' ' -f1) | $(cut -d' ' -f3 "$OUT/b$c" | stats %.0f | cut -d' ' -f1)" \
    "$(paste -d' ' "$OUT/t$c" "$OUT/b$c" | awk '{ print $1 / $4 }' | stats %.3f)"
done
echo "  goal: RedisBackend >= 0.90 of redis-benchmark's EVALSHA rate at 64 tasks"
echo
echo "flood ($FLOOD_C tasks on one key):"
for dc in off on; do
  printf '  deny cache %-3s  decisions/s %-30s Redis calls/decision %-28s p99 us %s\n' "$dc" \
    "$(cut -d' ' -f1 "$OUT/flood-$dc" | stats)" "$(cut -d' ' -f2 "$OUT/flood-$dc" | stats %.5f)" "$(cut -d' ' -f3 "$OUT/flood-$dc" | stats %.0f)"
done
printf '  cut in Redis calls per decision (off / on, paired): %s   (goal >= 10)\n' \
  "$(paste -d' ' "$OUT/flood-off" "$OUT/flood-on" | awk '{ print $2 / $8 }' | stats %.0f)"
printf '  decisions/s (on / off, paired): %s\n' \
  "$(paste -d' ' "$OUT/flood-on" "$OUT/flood-off" | awk '{ print $1 / $7 }' | stats %.1f)"
