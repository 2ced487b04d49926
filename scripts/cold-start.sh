#!/usr/bin/env bash
# Cold start under a burst (issue 25, fault 3): two fresh `axum_redis` processes sharing one
# Redis, fixed window LIMIT per 60 s per key, the local fallback on failure; the moment both
# ports accept connections, BURST requests on one key over 50 ms, to both in turn. Prints what
# the burst got, once per run: exactly LIMIT admitted means every request was decided by
# Redis; more means some were decided by a process alone (its first calls timed out).
#
# Each run starts from a Redis whose Function library was flushed, so the warm-up loads it.
# Usage: scripts/cold-start.sh, with RUNS (default 6), LIMIT (default 5), BURST (default 100)
# and TIMEOUT_MS (the apps' Redis timeout, default 100) in the environment. Targets only
# 127.0.0.1; everything it started is killed on exit. Needs redis-server, redis-cli, python3.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNS=${RUNS:-6}
LIMIT=${LIMIT:-5}
BURST=${BURST:-100}
TIMEOUT_MS=${TIMEOUT_MS:-100}

export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
cargo build --release -q -p turnstile-tests --bin loadgen
cargo build --release -q -p turnstile-examples --example axum_redis
WORK=$(mktemp -d /tmp/turnstile-cold.XXXXXX)
TARGET=${CARGO_TARGET_DIR:-target}/release
mkdir -p "$WORK/bin"
cp "$TARGET/loadgen" "$TARGET/examples/axum_redis" "$WORK/bin/"
BIN=$WORK/bin

PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
answers() { redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; }
accepts() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# wait_until SECONDS WHAT COMMAND...: polls every 2 ms; fails after SECONDS.
wait_until() {
  local secs=$1 what=$2 i
  shift 2
  for i in $(seq $((secs * 500))); do "$@" && return 0; sleep 0.002; done
  echo "$what: not within ${secs}s" >&2
  return 1
}

R=$(free_port)
mkdir -p "$WORK/redis"
(cd "$WORK/redis" && exec redis-server --port "$R" --bind 127.0.0.1 --save "" --appendonly no \
  >"$WORK/redis.log" 2>&1) &
PIDS+=("$!")
wait_until 10 "redis on $R starts" answers "$R"

for run in $(seq "$RUNS"); do
  redis-cli -p "$R" function flush >/dev/null
  A=$(free_port)
  B=$(free_port)
  prefix="cold:$run:$RANDOM"
  apps=()
  for port in "$A" "$B"; do
    "$BIN/axum_redis" --port "$port" --redis-url "redis://127.0.0.1:$R" \
      --redis-timeout "${TIMEOUT_MS}ms" --prefix "$prefix" --algorithm fixed-window \
      --limit "$LIMIT" --period 60s --key header:x-api-key --failure local \
      >"$WORK/app-$port.log" 2>&1 &
    PIDS+=("$!")
    apps+=("$!")
  done
  # No request before the burst: the apps are as cold as a fresh deployment.
  wait_until 10 "app on $A accepts" accepts "$A"
  wait_until 10 "app on $B accepts" accepts "$B"
  "$BIN/loadgen" $((BURST * 20)) 50 1 x-api-key "$WORK/burst.txt" \
    "http://127.0.0.1:$A/" "http://127.0.0.1:$B/" >/dev/null
  awk -v run="$run" -v limit="$LIMIT" '{ n[$3]++ } END {
    printf "run %s: %d admitted (limit %d), %d denied, %d 503, %d other\n",
      run, n[200], limit, n[429], n[503], NR - n[200] - n[429] - n[503] }' "$WORK/burst.txt"
  for p in "${apps[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
done
