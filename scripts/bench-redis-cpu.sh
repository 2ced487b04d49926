#!/usr/bin/env bash
# Redis CPU per decision of each single-policy turnstile call next to the plain GCRA script
# /work/shared/bench/gcra.lua (../shared/bench/gcra.lua from the repository; GCRA_LUA
# overrides the path), used verbatim, measured the same way in the same run, as
# ../shared/bench/README.md describes:
#   CONFIG RESETSTAT; redis-benchmark -c 50 -n N -P 16 -r 10000 <command> ...;
#   INFO commandstats -> cmdstat_<command> usec_per_call
# turnstile's calls go as RedisBackend sends them on Redis 7: FCALL of the check function of
# its Function library (turnstile_redis::library(), loaded once with FUNCTION LOAD), measured
# with cmdstat_fcall; gcra.lua with EVALSHA (cmdstat_evalsha). Extra rows: the gcra policy and
# the three policies through turnstile's EVALSHA script (CHECK_SCRIPT: what Redis before 7, or
# ScriptMode::Eval, runs), and three policies on one request through FCALL (a token bucket
# per second, a sliding window per hour, a fixed window of 10^8 per day).
# Every policy admits everything, so the writing path is measured: buckets 1 per second with
# a burst of 10^9 (as gcra.lua's ARGS 1000000 1000000000 1), windows 10^9 per hour. A script
# that only returns 1 gives the floor, and "defs-only" (the composed script's definitions,
# then return 1) what an EVALSHA of turnstile's script pays before deciding anything (FCALL
# pays it once, at FUNCTION LOAD). ROUNDS rounds (default 5), scripts in alternating order;
# REQUESTS calls each (default 100000); ROWS="name ..." runs only those rows beside gcra.lua.
# Each EVALSHA row runs with only its own script in the server's Lua state (SCRIPT FLUSH, then
# SCRIPT LOAD of that one script, before every run), as on a server that runs only it: a Lua
# state that also holds other scripts' code makes every call pay more garbage-collector work
# (about 2% of gcra.lua's call with turnstile's EVALSHA script loaded beside it). FCALL runs
# in the Functions engine's own Lua state, which holds only turnstile's library.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

ROUNDS="${ROUNDS:-5}"
REQUESTS="${REQUESTS:-100000}"
find_gcra_lua

need taskset util-linux
cargo build --release -q -p turnstile-benches --bin redis_bench
OUT=$(mktemp -d)
start_redis
trap 'stop_redis; rm -rf "$OUT"' EXIT
R=(redis-cli -p "$REDIS_PORT")
"${CARGO_TARGET_DIR:-target}/release/redis_bench" script >"$OUT/check.lua"
CHECK=$("${R[@]}" -x SCRIPT LOAD <"$OUT/check.lua")
"${CARGO_TARGET_DIR:-target}/release/redis_bench" library >"$OUT/library.lua"
LIB=$("${R[@]}" -x FUNCTION LOAD REPLACE <"$OUT/library.lua")
FN="${LIB}_check"
GCRA=$("${R[@]}" -x SCRIPT LOAD <"$GCRA_LUA")
echo 'return 1' >"$OUT/empty.lua"
EMPTY=$("${R[@]}" -x SCRIPT LOAD <"$OUT/empty.lua")
# For the analysis: the composed script's definitions alone (everything before check.lua's
# body: prelude.lua, fast.lua, sets.lua and the general_path closure, whose own definitions
# run only when a call needs the general path), then `return 1` — what every call pays
# before it decides anything.
awk '/^-- turnstile: one atomic call for one client key/ { exit } { print }' "$OUT/check.lua" >"$OUT/defs.lua"
echo 'return 1' >>"$OUT/defs.lua"
DEFS=$("${R[@]}" -x SCRIPT LOAD <"$OUT/defs.lua")

# turnstile's arguments for one policy (lua/check.lua's header), 32-character client keys
# like the backend's hashed ones; ALG: 1 token bucket, 2 gcra, 3 leaky bucket, 4 fixed
# window, 5 sliding log, 6 sliding window.
# Each row has keys of its own (the tag begins with its command and algorithm ids): a
# client's one state string holds its policies' states, so a row checking the keys another
# row's policy wrote would decide on carried-over states (the general path) instead.
# The arguments as lua/check.lua's header gives them, one word each here: '+' stands for a
# space and '^' for a line break inside an argument (see unword in bench-lib.sh), '' for an empty one.
row_head() {  # row code (digits): the key and the flags argument
  local tag
  tag=$(printf '%s%0*d' "$1" $((20 - ${#1})) 0)
  echo "1 turnstile:v1:{${tag}__rand_int__}:f4 check+defaults+0+1"
}
targs() {  # command (fcall|evalsha) alg limit period_ms capacity
  local target=$FN code=1; [ "$1" = evalsha ] && { target=$CHECK; code=2; }
  echo "$1 $target $(row_head "$code$2") ^$2.$3.$4.$5+p"
}
three() {  # command: a token bucket per second, a sliding window per hour, a fixed window per day
  local target=$FN code=17; [ "$1" = evalsha ] && { target=$CHECK; code=27; }
  echo "$1 $target $(row_head $code) ^1.1.1000.1000000000+s^6.1000000000.3600000.1000000000+h^4.100000000.86400000.100000000+d"
}
NAMES=(empty defs-only gcra.lua token-bucket gcra leaky-bucket fixed-window sliding-log sliding-window three-policies gcra-evalsha three-evalsha)
# ROWS="name ...": only these rows (gcra.lua, every ratio's anchor, always runs).
if [ -n "${ROWS:-}" ]; then
  for name in $ROWS; do
    case " ${NAMES[*]} " in *" $name "*) ;; *) echo "$0: no row $name (rows: ${NAMES[*]})" >&2; exit 2 ;; esac
  done
  NAMES=(gcra.lua); for name in $ROWS; do [ "$name" = gcra.lua ] || NAMES+=("$name"); done
fi
declare -A CMD=(
  [empty]="evalsha $EMPTY 0"
  [defs-only]="evalsha $DEFS 0"
  [gcra.lua]="evalsha $GCRA 1 k:__rand_int__ 1000000 1000000000 1"
  [token-bucket]="$(targs fcall 1 1 1000 1000000000)"
  [gcra]="$(targs fcall 2 1 1000 1000000000)"
  [leaky-bucket]="$(targs fcall 3 1 1000 1000000000)"
  [fixed-window]="$(targs fcall 4 1000000000 3600000 1000000000)"
  [sliding-log]="$(targs fcall 5 1000000000 3600000 1000000000)"
  [sliding-window]="$(targs fcall 6 1000000000 3600000 1000000000)"
  [three-policies]="$(three fcall)"
  [gcra-evalsha]="$(targs evalsha 2 1 1000 1000000000)"
  [three-evalsha]="$(three evalsha)"
)

# The Lua state of EVAL holding only the script NAME runs (none for an FCALL row).
only_script() {  # name
  local src=
  case $1 in
    empty) src=$OUT/empty.lua ;;
    defs-only) src=$OUT/defs.lua ;;
    gcra.lua) src=$GCRA_LUA ;;
    *-evalsha) src=$OUT/check.lua ;;
  esac
  "${R[@]}" SCRIPT FLUSH >/dev/null
  [ -z "$src" ] || "${R[@]}" -x SCRIPT LOAD <"$src" >/dev/null
}

# Every invocation admits (probe on a key of its own).
for name in "${NAMES[@]}"; do
  # a key of the row's own (a key another row's policy wrote would take the general path)
  read -r -a argv <<<"${CMD[$name]//__rand_int__/probe-$name}"
  unword "${argv[@]}"; argv=("${ARGV_OUT[@]}")
  only_script "$name"
  reply=$("${R[@]}" "${argv[@]}" | tr '\n' ' ')
  case $name in
    empty|defs-only) ok=$([ "$reply" = "1 " ] && echo y) ;;
    gcra.lua) ok=$(awk '{ if ($1 == 1) print "y" }' <<<"$reply") ;;
    # the reply (lua/check.lua): the compact one of the common case (-1 - now, then each
    # policy's values) or the full one (now, version, applied, then the values: the sliding
    # log's general path), each policy's retry first (0: admitted); three policies: a token
    # bucket (3 values), a sliding window (5: retry whole, num, ...), a fixed window
    three*) ok=$(awk '{ o = ($1 < 0) ? 0 : 2; if ($(2+o) == 0 && $(5+o) == 0 && $(6+o) == 0 && $(10+o) == 0) print "y" }' <<<"$reply") ;;
    *) ok=$(awk '{ o = ($1 < 0) ? 0 : 2; if ($(2+o) == 0) print "y" }' <<<"$reply") ;;
  esac
  [ "$ok" = y ] || { echo "$0: the $name invocation does not admit: $reply" >&2; exit 1; }
done

once() {  # name: sets LINE "usec_per_call rps" and FOREIGN
  local name=$1 argv i
  read -r -a argv <<<"${CMD[$name]}"
  unword "${argv[@]}"; argv=("${ARGV_OUT[@]}")
  only_script "$name"
  wait_quiet
  "${R[@]}" CONFIG RESETSTAT >/dev/null
  measure_begin "$REDIS_PID"
  taskset -c "$CLIENT_CPU" redis-benchmark -p "$REDIS_PORT" -c 50 -n "$REQUESTS" -P 16 -r 10000 --csv \
    "${argv[@]}" >"$OUT/rb.txt"
  measure_end "$REDIS_PID"
  local usec rps
  usec=$("${R[@]}" INFO commandstats | tr -d '\r' | sed -n "s/^cmdstat_${argv[0]}:.*usec_per_call=\([0-9.]*\).*/\1/p")
  rps=$(tail -1 "$OUT/rb.txt" | tr -d '"' | cut -d, -f2)
  LINE="$usec $rps"
}

machine
echo "# redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on CPU $SERVER_CPU, redis-benchmark -c 50 -n $REQUESTS -P 16 -r 10000 on CPU $CLIENT_CPU; $ROUNDS rounds"
echo "# gcra.lua: $GCRA_LUA (sha $GCRA, EVALSHA); turnstile: FCALL $FN (library $LIB), EVALSHA rows: check script sha $CHECK"
for round in $(seq "$ROUNDS"); do
  if [ $((round % 2)) = 1 ]; then order=("${NAMES[@]}"); else order=(); for ((i=${#NAMES[@]}-1; i>=0; i--)); do order+=("${NAMES[i]}"); done; fi
  for name in "${order[@]}"; do
    best_f=1000000; best=
    for try in $(seq "$TRIES"); do
      once "$name"
      if [ "$FOREIGN" -lt "$best_f" ]; then best_f=$FOREIGN; best=$LINE; fi
      [ "$FOREIGN" -le "$FOREIGN_MAX" ] && break
    done
    mark=; [ "$best_f" -gt "$FOREIGN_MAX" ] && mark='*'
    echo "$best $best_f" >>"$OUT/$name"
    read -r usec rps <<<"$best"
    printf '  round %d  %-16s %7.2f us/call  %9.0f calls/s  (foreign CPU %d%%%s)\n' "$round" "$name" "$usec" "$rps" "$best_f" "$mark"
  done
done

# The summary uses the undisturbed rounds (foreign CPU <= FOREIGN_MAX; for a ratio, both
# runs) when there are at least 3 of them, else every round.
col() {  # file column
  awk -v m="$FOREIGN_MAX" -v c="$2" '{ v[NR] = $c; ok[NR] = ($3 <= m); n += ok[NR] }
    END { for (i = 1; i <= NR; i++) if (n < 3 || ok[i]) print v[i] }' "$1"
}
pair() {  # a b: usec_per_call of a / of b, paired by round
  paste -d' ' "$1" "$2" | awk -v m="$FOREIGN_MAX" '{ r[NR] = $1 / $4; ok[NR] = ($3 <= m && $6 <= m); n += ok[NR] }
    END { for (i = 1; i <= NR; i++) if (n < 3 || ok[i]) print r[i] }'
}

echo
echo "Redis CPU per decision (INFO commandstats usec_per_call), median (min-max) over the undisturbed rounds:"
printf '%-16s %-24s %-28s %-28s %s\n' script "us per call" "ratio to gcra.lua (paired)" "calls/s (redis-benchmark)" "rounds used"
for name in "${NAMES[@]}"; do
  printf '%-16s %-24s %-28s %-28s %s of %s\n' "$name" "$(col "$OUT/$name" 1 | stats %.2f)" \
    "$(pair "$OUT/$name" "$OUT/gcra.lua" | stats %.2f)" "$(col "$OUT/$name" 2 | stats)" \
    "$(pair "$OUT/$name" "$OUT/gcra.lua" | wc -l | tr -d ' ')" "$ROUNDS"
done
echo "  goal (issue 15): each single-policy turnstile FCALL at or below gcra.lua (ratio <= 1.00);"
echo "  three policies on one request (three-policies, FCALL) at or below 2.00"
