#!/usr/bin/env bash
# The client side of a Redis decision, counted: what RedisBackend's process (the
# redis_bench load generator: a multi-thread tokio runtime, the real RedisBackend API, default
# options but a long timeout) costs per decision, next to redis-benchmark running the same FCALL
# with the same concurrency against the same private redis-server.
#
# Per contender and concurrency (CONCURRENCY, default "1 64"), two runs of N1 and N2 decisions
# (default 2000 and 6000; redis-benchmark -n) whose difference is the cost of N2 - N1
# decisions, so start-up, connecting and warm-up cancel out:
#   - instructions in user space (valgrind's callgrind; load-independent; the kernel's side of
#     the system calls is not in it; quanta's one-time clock calibration left out; the key's
#     SHA-256 runs in software under valgrind, with SHA-NI natively where the CPU has it),
#   - system calls (strace -c -f; the count, not the time),
#   - CPU time, user + system (perf stat task-clock; timed, so a loaded machine inflates it,
#     but per decision rather than per second).
# usage: scripts/redis-client-count.sh          knobs: CONCURRENCY, N1, N2, ONLY (t or b),
#        BENCH_BIN, CG_KEEP (a directory: the callgrind dumps are kept there, for callgrind_annotate)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

CONCURRENCY="${CONCURRENCY:-1 64}"
N1="${N1:-2000}"
N2="${N2:-6000}"
ONLY="${ONLY:-t b}"
need valgrind valgrind
need strace strace
need taskset util-linux
# BENCH_BIN: another build's redis_bench (e.g. to compare commits); else this tree's.
if [ -n "${BENCH_BIN:-}" ]; then BENCH=$BENCH_BIN; else
  cargo build --release -q -p turnstile-benches --bin redis_bench
  BENCH="${CARGO_TARGET_DIR:-target}/release/redis_bench"
fi
OUT=$(mktemp -d)
start_redis
trap 'stop_redis; rm -rf "$OUT"' EXIT
R=(redis-cli -p "$REDIS_PORT")
# FN and ARGS: the check as RedisBackend sends it (see load_check_call in bench-lib.sh).
load_check_call

run() {  # who c n wrapper...: runs the contender under the wrapper, output to $OUT/o
  local who=$1 c=$2 n=$3; shift 3
  if [ "$who" = t ]; then
    taskset -c "$CLIENT_CPU" "$@" "$BENCH" run --url "redis://127.0.0.1:$REDIS_PORT" \
      --concurrency "$c" --count $(( n / c )) >"$OUT/o" 2>"$OUT/e"
  else
    taskset -c "$CLIENT_CPU" "$@" redis-benchmark -p "$REDIS_PORT" -c "$c" -n "$n" -r 10000 \
      -q fcall "$FN" "${ARGS[@]}" >"$OUT/o" 2>"$OUT/e"
  fi
}
instr() {  # who c n: user-space instructions of the whole process
  run "$1" "$2" "$3" valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p" --trace-children=no
  local f; f=$(ls -t "$OUT"/cg.* | head -1)
  [ -n "${CG_KEEP:-}" ] && { mkdir -p "$CG_KEEP"; cp "$f" "$CG_KEEP/$1-c$2-n$3.cg"; }
  # Less quanta's one-time calibration (turnstile-core's clock, at the first decision): it
  # loops on the clock for a time, so its instructions vary by ±1k per decision between runs.
  local total calib
  total=$(sed -n 's/^summary: \([0-9]*\).*/\1/p' "$f")
  calib=$(callgrind_annotate --auto=no --inclusive=yes --threshold=100 "$f" |
    awk '/quanta::Clock::new \[/ && !n++ { gsub(",", "", $1); print $1 }')
  echo $(( total - ${calib:-0} )); rm -f "$OUT"/cg.*
}
calls() {  # who c n: system calls of every thread
  run "$1" "$2" "$3" strace -f -c -o "$OUT/st"
  awk '$NF == "total" { print $(NF-2) }' "$OUT/st"
}
cpu_ms() {  # who c n: task-clock ms
  run "$1" "$2" "$3" perf stat -x, -e task-clock -o "$OUT/ps"
  awk -F, '/task-clock/ { print $1 }' "$OUT/ps"
}
machine
echo "# client side per decision: (x(N2) - x(N1)) / (N2 - N1), N1=$N1 N2=$N2; load average $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-16s %14s %14s %12s\n' tasks contender "instr/decision" "syscalls/dec" "CPU us/dec"
for c in $CONCURRENCY; do
  for who in $ONLY; do
    name=RedisBackend; [ "$who" = b ] && name=redis-benchmark
    i1=$(instr "$who" "$c" "$N1"); i2=$(instr "$who" "$c" "$N2")
    s1=$(calls "$who" "$c" "$N1"); s2=$(calls "$who" "$c" "$N2")
    t1=$(cpu_ms "$who" "$c" "$N1"); t2=$(cpu_ms "$who" "$c" "$N2")
    awk -v c="$c" -v n="$name" -v i1="$i1" -v i2="$i2" -v s1="$s1" -v s2="$s2" -v t1="$t1" \
      -v t2="$t2" -v d=$(( N2 - N1 )) 'BEGIN { printf("%-6s %-16s %14.0f %14.2f %12.1f\n",
        c, n, (i2 - i1) / d, (s2 - s1) / d, (t2 - t1) * 1000 / d) }'
  done
done
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
