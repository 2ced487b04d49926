#!/usr/bin/env bash
# Chaos run for the Redis backend: fixed-rate load on two `axum_redis` processes sharing one
# Redis, a fault injected mid-run, for each failure policy. Prints one table:
#
#   fault | policy | 503s | failed | over timeout | max admitted / limit per key and window |
#   windows over | recovered after (s)
#
# - 503s: answers the failure policy refused; failed: requests with no HTTP answer at all.
# - over timeout: answers slower than the Redis timeout (100 ms) plus 100 ms of slack.
# - admitted: the most 200s one key got in one fixed window (1 s, aligned to the epoch like the
#   policy) against the exact limit; "windows over" counts key-windows above the limit (the
#   fleet's over-admission while the fallback decided locally on each process).
# - recovered after: seconds from the moment Redis answered PING again to the last 503 or
#   failed request (0: none after it).
#
# Targets only 127.0.0.1; every run is bounded in time and traffic; everything it started is
# stopped on exit. Usage: scripts/chaos.sh [FAULT...] (default: every fault), with
# POLICIES="local open closed", RATE (requests/s, default 400), LIMIT (per key and second,
# default 50) in the environment. Needs redis-server (scripts/test installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

POLICIES=${POLICIES:-"local open closed"}
RATE=${RATE:-400}
LIMIT=${LIMIT:-50}
KEYS=4
RUN_MS=9000
FAULT_AT=3
FAULTS=${*:-"kill-restart client-pause debug-sleep script-flush overload"}

export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
cargo build --release -q -p turnstile-tests --bin loadgen
cargo build --release -q -p turnstile-examples --example axum_redis
BIN=target/release

WORK=$(mktemp -d /tmp/turnstile-chaos.XXXXXX)
PIDS=()
stop_all() {
  for p in "${PIDS[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  PIDS=()
}
cleanup() {
  stop_all
  rm -rf "$WORK"
}
trap cleanup EXIT INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now_ms() { python3 -c 'import time; print(int(time.time() * 1000))'; }
ping() { redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; }
wait_ping() { for _ in $(seq 200); do ping "$1" && return 0; sleep 0.05; done; echo "redis on $1 did not start" >&2; return 1; }
wait_http() { for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$1/" -H 'x-api-key: probe' && return 0; sleep 0.05; done; echo "app on $1 did not start" >&2; return 1; }

start_redis() {
  redis-server --port "$1" --save "" --appendonly no --dir "$WORK" \
    --enable-debug-command local >"$WORK/redis-$1.log" 2>&1 &
  REDIS_PID=$!
  PIDS+=("$REDIS_PID")
  wait_ping "$1"
}

start_app() { # PORT REDIS_PORT POLICY
  "$BIN/examples/axum_redis" --port "$1" --redis-url "redis://127.0.0.1:$2" \
    --prefix "chaos:$RANDOM" --algorithm fixed-window --limit "$LIMIT" --period 1s \
    --key header:x-api-key --failure "$3" >"$WORK/app-$1.log" 2>&1 &
  PIDS+=("$!")
  wait_http "$1"
}

inject() { # FAULT REDIS_PORT; writes the epoch ms at which Redis answered again to $WORK/back
  case "$1" in
    kill-restart)
      { kill -9 "$REDIS_PID" && wait "$REDIS_PID"; } 2>/dev/null || true
      sleep 1; start_redis "$2" ;;
    client-pause)
      redis-cli -p "$2" client pause 1500 all >/dev/null; sleep 1.5 ;;
    debug-sleep)
      redis-cli -p "$2" debug sleep 1 >/dev/null ;;
    script-flush)
      redis-cli -p "$2" script flush >/dev/null ;;
    overload)
      # A burst on top of the steady load: 20x the rate for one second, on one key.
      "$BIN/loadgen" $((RATE * 20)) 1000 1 x-api-key "$WORK/burst.txt" \
        "http://127.0.0.1:$APP1/" "http://127.0.0.1:$APP2/" >/dev/null ;;
    *) echo "unknown fault $1" >&2; return 1 ;;
  esac
  wait_ping "$2"
  now_ms >"$WORK/back"
}

printf '%-13s %-7s %6s %7s %13s %17s %13s %16s\n' fault policy 503s failed "over timeout" "max admitted/limit" "windows over" "recovered after"
for fault in $FAULTS; do
  for policy in $POLICIES; do
    RPORT=$(free_port); start_redis "$RPORT"
    APP1=$(free_port); start_app "$APP1" "$RPORT" "$policy"
    APP2=$(free_port); start_app "$APP2" "$RPORT" "$policy"
    # Let the probes' window pass, then load both apps at a fixed rate.
    sleep 1
    "$BIN/loadgen" "$RATE" "$RUN_MS" "$KEYS" x-api-key "$WORK/load.txt" \
      "http://127.0.0.1:$APP1/" "http://127.0.0.1:$APP2/" >/dev/null &
    LOAD=$!
    sleep "$FAULT_AT"
    inject "$fault" "$RPORT"
    back_ms=$(cat "$WORK/back")
    wait "$LOAD"
    python3 - "$WORK/load.txt" "$LIMIT" "$back_ms" "$fault" "$policy" <<'PY'
import sys
from collections import Counter
path, limit, back_ms, fault, policy = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
admitted = Counter()
refused = failed = slow = 0
last_bad = None
for line in open(path):
    sent, key, status, us = line.split()
    sent, status, us = int(sent), int(status), int(us)
    if status == 200:
        admitted[(key, sent // 1000)] += 1
    if status == 503:
        refused += 1
    if status == 0:
        failed += 1
    if status in (0, 503) and sent >= back_ms:
        last_bad = sent if last_bad is None else max(last_bad, sent)
    if us > 200_000:
        slow += 1
worst = max(admitted.values(), default=0)
over = sum(1 for n in admitted.values() if n > limit)
recover = 0.0 if last_bad is None else (last_bad - back_ms) / 1000
print(f"{fault:<13} {policy:<7} {refused:>6} {failed:>7} {slow:>13} {worst:>9}/{limit:<7} {over:>13} {recover:>15.2f}s")
PY
    stop_all
  done
done
