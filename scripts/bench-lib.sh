# Shared helpers of scripts/bench-*.sh (sourced, not run).

# Interrupted or killed: exit, so each script's EXIT trap stops its servers and removes its
# temporary files.
trap 'exit 130' INT
trap 'exit 143' TERM

# Two cores: keep parallel rustc jobs at two unless told otherwise.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

# need CMD PACKAGE: installs the Debian PACKAGE when CMD is missing (as root, or with sudo
# when it needs no password), as scripts/test does.
need() {
  local cmd=$1 pkg=$2
  command -v "$cmd" >/dev/null 2>&1 && return 0
  echo "$(basename "$0"): $cmd is missing; installing $pkg from apt" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
  else
    echo "$(basename "$0"): cannot install $pkg without root. Install it with:" >&2
    echo "    sudo apt-get install -y $pkg" >&2
    exit 1
  fi
}

# stats: numbers on stdin, one a line -> "median (min-max)" with the given printf format
# (default %.0f). An even count takes the lower middle value, so the median is a measured one.
stats() {
  local fmt=${1:-%.0f}
  sort -g | awk -v f="$fmt" '{ v[NR] = $1 } END {
    if (NR == 0) { print "-"; exit }
    printf(f " (" f "-" f ")\n", v[int((NR + 1) / 2)], v[1], v[NR]) }'
}

# free_port: a TCP port on 127.0.0.1 nothing listens on (from a random start).
free_port() {
  local p=$(( 20000 + RANDOM % 20000 ))
  while (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do p=$(( p + 1 )); done
  echo "$p"
}

# The two CPUs the benchmarks pin to (server / load generator); override with SERVER_CPU and
# CLIENT_CPU. On a one-CPU machine both are 0 (and the pinning proves nothing).
SERVER_CPU="${SERVER_CPU:-0}"
if [ "$(nproc)" -ge 2 ]; then CLIENT_CPU="${CLIENT_CPU:-1}"; else CLIENT_CPU="${CLIENT_CPU:-0}"; fi

# start_redis: a private redis-server on a free port, no persistence, pinned to SERVER_CPU,
# in a temp dir; sets REDIS_PORT, REDIS_PID, REDIS_DIR; stopped by stop_redis (and on exit).
start_redis() {
  need redis-server redis-server
  need redis-benchmark redis-tools
  REDIS_DIR=$(mktemp -d)
  REDIS_PORT=$(free_port)
  taskset -c "$SERVER_CPU" redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' \
    --appendonly no --dir "$REDIS_DIR" --daemonize no --loglevel warning \
    >"$REDIS_DIR/log" 2>&1 &
  REDIS_PID=$!
  trap stop_redis EXIT
  for _ in $(seq 100); do
    redis-cli -p "$REDIS_PORT" PING >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "$(basename "$0"): redis-server did not start:" >&2
  cat "$REDIS_DIR/log" >&2
  exit 1
}

stop_redis() {
  if [ -n "${REDIS_PID:-}" ]; then
    kill "$REDIS_PID" 2>/dev/null || true
    wait "$REDIS_PID" 2>/dev/null || true
    REDIS_PID=
  fi
  [ -n "${REDIS_DIR:-}" ] && rm -rf "$REDIS_DIR"
  REDIS_DIR=
}

# machine: one line about where the figures come from.
machine() {
  echo "# machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), kernel $(uname -r)"
}

# --- Other load on the machine -------------------------------------------------------------
# A shared 2-CPU machine: other people's builds and tests steal the CPUs our pinned server and
# load generator run on, and one such burst halves a figure. Every measured run is therefore
# (1) started only once the machine has been quiet for a moment (wait_quiet), and
# (2) checked afterwards for CPU time that neither the server nor the load generator used
# ("foreign" CPU, from /proc/stat minus our processes' own ticks); a run with more than
# FOREIGN_MAX percent of one CPU foreign is retried, up to TRIES times in all (the least
# disturbed try is kept and marked with '*').
HZ=$(getconf CLK_TCK)
QUIET_MAX="${QUIET_MAX:-10}"      # % of one CPU busy that still counts as quiet
QUIET_WAIT="${QUIET_WAIT:-10}"    # give up waiting for quiet after this many seconds
FOREIGN_MAX="${FOREIGN_MAX:-10}"  # % of one CPU of foreign load a kept run may have had
TRIES="${TRIES:-2}"

# busy_ticks: the non-idle ticks of every CPU since boot.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }

# proc_ticks PID: the CPU ticks (user + system) a live process has used.
proc_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }

# children_ticks: sets CHILD_TICKS to the CPU ticks of this shell's waited-for children
# (bash's `times`, redirected to a file: in a $(...) subshell it would count nothing).
children_ticks() {
  local f
  f=$(mktemp)
  times >"$f"
  CHILD_TICKS=$(awk -v hz="$HZ" 'NR == 2 {
    t = 0
    for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); t += a[1] * 60 + a[2] }
    printf("%.0f\n", t * hz) }' "$f")
  rm -f "$f"
}

# wait_quiet: waits (up to QUIET_WAIT s) until the machine is below QUIET_MAX % of one CPU
# busy over half a second; prints the busy share it started at.
wait_quiet() {
  local start=$SECONDS b0 b1 pct
  while :; do
    b0=$(busy_ticks); sleep 0.5; b1=$(busy_ticks)
    pct=$(( (b1 - b0) * 100 * 2 / HZ ))
    if [ "$pct" -le "$QUIET_MAX" ] || [ $((SECONDS - start)) -ge "$QUIET_WAIT" ]; then
      QUIET_AT=$pct
      return 0
    fi
  done
}

# measure_begin PID...: notes the ticks of the machine, of this shell's children and of the
# given live processes (servers). measure_end PID...: sets FOREIGN (% of one CPU used by
# anything else over the wall time since measure_begin).
measure_begin() {
  M_T0=$(date +%s.%N); M_B0=$(busy_ticks); children_ticks; M_C0=$CHILD_TICKS; M_P0=0
  local p; for p in "$@"; do M_P0=$(( M_P0 + $(proc_ticks "$p") )); done
}
measure_end() {
  local b1 c1 p1=0 p t1
  b1=$(busy_ticks); children_ticks; c1=$CHILD_TICKS; t1=$(date +%s.%N)
  for p in "$@"; do p1=$(( p1 + $(proc_ticks "$p") )); done
  FOREIGN=$(awk -v b=$((b1 - M_B0)) -v c=$((c1 - M_C0)) -v p=$((p1 - M_P0)) -v t0="$M_T0" -v t1="$t1" -v hz="$HZ" \
    'BEGIN { f = (b - c - p) * 100 / ((t1 - t0) * hz); if (f < 0) f = 0; printf("%.0f\n", f) }')
}

# find_gcra_lua: sets GCRA_LUA to the plain GCRA script the Redis CPU figures are measured
# against (../shared/bench/gcra.lua from the repository, or /work/shared/bench/gcra.lua), unless
# GCRA_LUA is set already; exits with a message when there is none.
find_gcra_lua() {
  GCRA_LUA="${GCRA_LUA:-}"
  if [ -z "$GCRA_LUA" ]; then
    local f
    for f in ../shared/bench/gcra.lua /work/shared/bench/gcra.lua; do
      [ -f "$f" ] && { GCRA_LUA=$f; break; }
    done
  fi
  [ -f "$GCRA_LUA" ] || { echo "$(basename "$0"): gcra.lua not found; set GCRA_LUA=/path/to/gcra.lua" >&2; exit 1; }
}

# unword WORD...: sets ARGV_OUT to the arguments the words stand for, as the Redis CPU scripts
# write a call's arguments one word each: '+' stands for a space and '^' for a line break
# inside an argument, '' for an empty one.
unword() {
  ARGV_OUT=()
  local a
  for a in "$@"; do
    [ "$a" = "''" ] && a=''
    a=${a//+/ }
    ARGV_OUT+=("${a//^/$'\n'}")
  done
}

# load_check_call: loads turnstile's Function library (from "$BENCH" library, written to
# $OUT) into the private server at $REDIS_PORT and sets FN (its check function) and ARGS
# (the check's keys and arguments, after "FCALL $FN"), as RedisBackend sends them for one
# all-admitting token bucket (lua/check.lua's header): KEYS[1] the client's state string;
# ARGV: "op unconfigured least-TTL cost" (no time: the server's TIME), 1 policy set: tier '',
# then 1 policy line: parameters "1.1.1000.1000000000" (algorithm 1, token bucket; limit 1;
# period 1000 ms; burst 10^9) and name "bench". The client key is 32 characters, as the
# backend's hashed keys are; redis-benchmark puts a random 12-digit number in place of each
# __rand_int__ (-r 10000: 10,000 keys).
load_check_call() {
  "$BENCH" library >"$OUT/library.lua"
  local lib
  lib=$(redis-cli -p "$REDIS_PORT" -x FUNCTION LOAD REPLACE <"$OUT/library.lua")
  FN="${lib}_check"
  SET=$'\n1.1.1000.1000000000 bench'
  ARGS=(1 'turnstile:v1:{00000000000000000000__rand_int__}:f4' 'check defaults 0 1' "$SET")
}
