#!/usr/bin/env bash
# Redis CPU per call counted, not timed: the machine instructions redis-server executes per
# call (valgrind's callgrind, so the figure does not depend on what else the machine runs),
# for turnstile's check through FCALL and through EVALSHA next to the plain GCRA script
# /work/shared/bench/gcra.lua (../shared/bench/gcra.lua; GCRA_LUA overrides it) through
# EVALSHA, with the same all-admitting arguments as scripts/bench-redis-cpu.sh. It
# complements that script's timed usec_per_call (which a loaded machine inflates), never
# replaces it: instructions are not time (a cache miss costs more than an add).
#
# Per script: a private redis-server under callgrind; WARMUP calls (default 5000) so the
# KEYSPACE keys (default 1000) nearly all exist, counters zeroed, CALLS calls (default 5000) with
# redis-benchmark -c 50 -P 16 -r KEYSPACE, counters dumped; instructions / calls. Everything the
# server does per call is in it: reading and parsing the request, the script, the Redis
# commands it makes, the reply.
#
# usage: scripts/redis-cpu-count.sh [NAME...]   (default: every row below)
# knobs: WARMUP, CALLS, KEYSPACE (the -r of redis-benchmark), GCRA_LUA, CHECK_LUA, LIBRARY_LUA,
#        CG_KEEP (a directory: each row's callgrind dumps are kept there as NAME.cg.*, for
#        callgrind_annotate: which C functions the instructions go to)
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

WARMUP="${WARMUP:-5000}"
CALLS="${CALLS:-5000}"
KEYSPACE="${KEYSPACE:-1000}"
find_gcra_lua
need valgrind valgrind
need redis-benchmark redis-tools
cargo build --release -q -p turnstile-benches --bin redis_bench
OUT=$(mktemp -d)
trap 'kill "${PID:-}" 2>/dev/null || true; rm -rf "$OUT"' EXIT
BIN="${CARGO_TARGET_DIR:-target}/release/redis_bench"
# CHECK_LUA and LIBRARY_LUA: another build's EVALSHA script and Function library (whose
# check function is "<library name>_check"), e.g. to compare commits.
if [ -n "${CHECK_LUA:-}" ]; then cp "$CHECK_LUA" "$OUT/check.lua"; else "$BIN" script >"$OUT/check.lua"; fi
if [ -n "${LIBRARY_LUA:-}" ]; then cp "$LIBRARY_LUA" "$OUT/library.lua"; else "$BIN" library >"$OUT/library.lua"; fi

TAG='00000000000000000000__rand_int__'
# The arguments as lua/check.lua's header gives them, one word each here: '+' stands for a
# space and '^' for a line break inside an argument (see unword in bench-lib.sh), '' for an empty one.
HEAD="1 turnstile:v1:{$TAG}:f4 check+defaults+0+1"
declare -A CMD=(
  [empty]="evalsha EMPTY 0"
  [gcra.lua]="evalsha GCRA 1 k:__rand_int__ 1000000 1000000000 1"
  [token-bucket]="fcall FN $HEAD ^1.1.1000.1000000000+p"
  [gcra]="fcall FN $HEAD ^2.1.1000.1000000000+p"
  [leaky-bucket]="fcall FN $HEAD ^3.1.1000.1000000000+p"
  [fixed-window]="fcall FN $HEAD ^4.1000000000.3600000.1000000000+p"
  [sliding-log]="fcall FN $HEAD ^5.1000000000.3600000.1000000000+p"
  [sliding-window]="fcall FN $HEAD ^6.1000000000.3600000.1000000000+p"
  [three-policies]="fcall FN $HEAD ^1.1.1000.1000000000+s^6.1000000000.3600000.1000000000+h^4.100000000.86400000.100000000+d"
  [token-bucket-evalsha]="evalsha CHECK $HEAD ^1.1.1000.1000000000+p"
)
NAMES=("$@")
[ ${#NAMES[@]} -gt 0 ] || NAMES=(empty gcra.lua token-bucket gcra leaky-bucket fixed-window sliding-log sliding-window three-policies token-bucket-evalsha)

count() {  # name: prints instructions per call
  local name=$1 port argv i
  port=$(free_port)
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.%p" --collect-atstart=yes \
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$OUT" \
    --loglevel warning >"$OUT/vg.log" 2>&1 &
  PID=$!
  for _ in $(seq 600); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
  local R=(redis-cli -p "$port")
  local empty gcra check lib
  # Only the row's own script in the EVAL Lua state, as on a server that runs only it
  # (other scripts' code there costs every call more garbage-collector work).
  empty=$("${R[@]}" SCRIPT LOAD 'return 1')
  gcra=$("${R[@]}" -x SCRIPT LOAD <"$GCRA_LUA")
  check=$("${R[@]}" -x SCRIPT LOAD <"$OUT/check.lua")
  "${R[@]}" SCRIPT FLUSH >/dev/null
  case $name in
    empty) "${R[@]}" SCRIPT LOAD 'return 1' >/dev/null ;;
    gcra.lua) "${R[@]}" -x SCRIPT LOAD <"$GCRA_LUA" >/dev/null ;;
    *-evalsha) "${R[@]}" -x SCRIPT LOAD <"$OUT/check.lua" >/dev/null ;;
  esac
  lib=$("${R[@]}" -x FUNCTION LOAD REPLACE <"$OUT/library.lua")
  local c=${CMD[$name]}
  c=${c/EMPTY/$empty}; c=${c/GCRA/$gcra}; c=${c/CHECK/$check}; c=${c/FN/${lib}_check}
  read -r -a argv <<<"$c"
  unword "${argv[@]}"; argv=("${ARGV_OUT[@]}")
  redis-benchmark -p "$port" -c 50 -n "$WARMUP" -P 16 -r "$KEYSPACE" -q "${argv[@]}" >/dev/null
  callgrind_control -z "$PID" >/dev/null 2>&1
  "${R[@]}" CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$port" -c 50 -n "$CALLS" -P 16 -r "$KEYSPACE" -q "${argv[@]}" >/dev/null
  local calls
  calls=$("${R[@]}" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_${argv[0]}:calls=\([0-9]*\).*/\1/p")
  rm -f "$OUT"/cg.*
  callgrind_control -d "$PID" >/dev/null 2>&1
  local ir
  ir=$(cat "$OUT"/cg.* | awk "/^summary:/ { s += \$2 } END { print s }")
  if [ -n "${CG_KEEP:-}" ]; then mkdir -p "$CG_KEEP"; for f in "$OUT"/cg.*; do cp "$f" "$CG_KEEP/$name.${f##*/}"; done; fi
  kill "$PID"; wait "$PID" 2>/dev/null || true; PID=
  # The dump holds the instructions since the zeroing: the measured calls, plus the
  # CONFIG RESETSTAT and INFO around them (a few thousand instructions, under 0.1 %).
  awk -v ir="$ir" -v n="$calls" -v name="$name" 'BEGIN { printf "%-22s %10.0f instructions per call (%d calls)\n", name, ir / n, n }'
}

echo "# redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') under callgrind; redis-benchmark -c 50 -n $CALLS -P 16 -r $KEYSPACE after $WARMUP warm-up calls"
for name in "${NAMES[@]}"; do count "$name"; done
