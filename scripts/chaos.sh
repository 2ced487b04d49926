#!/usr/bin/env bash
# Chaos run for the Redis backend: fixed-rate load on two `axum_redis` processes sharing one
# Redis deployment, a fault injected mid-run, for each failure policy. Prints one table, one
# row per fault and policy (RELIABILITY.md explains each figure and what it promises):
#
#   fault | policy | 503s | stray 503s | failed | open admits | over T+slack | max/limit |
#   over limit | vs bound | Redis back | recovered | send gap
#
# (scripts/chaos_report.py computes a row from every request's line and the apps' logs.)
#
# Faults (each on a fresh deployment; the load is fixed-window, LIMIT per key and second):
#   kill-restart  kill -9 the Redis, restart it 1 s later (no persistence: its counts are gone)
#   repoint       primary + replica behind a switchable TCP proxy (the apps' URL): promote the
#                 replica (REPLICAOF NO ONE), demote the old primary, repoint the proxy
#   sentinel      primary + replica + 3 Sentinels (quorum 2, down-after 500 ms); apps on a
#                 redis+sentinel:// URL; kill -9 the primary
#   client-pause  CLIENT PAUSE 1500 ALL
#   debug-sleep   DEBUG SLEEP 1 (Redis busy for 1 s)
#   script-flush  SCRIPT FLUSH and FUNCTION FLUSH (every call meets NOSCRIPT or "Function not found" once)
#   cluster-kill  3 masters + 1 replica each, cluster-node-timeout 1000 ms,
#                 cluster-require-full-coverage no (FULL_COVERAGE=yes: Redis's default);
#                 apps on the six comma-separated URLs; kill -9 the master of key k0
#   overload      20x the rate for 1 s over 1000 keys, on top of the steady load
#   fast-restart  kill -9 the Redis and start it again at once (back within about 100 ms)
#   silent        one Redis behind a TCP proxy (the apps' URL): the proxy's connections go
#                 silent (open, nothing forwarded: a lost NAT entry), new ones pass
#   sentinel-stop as sentinel, the primary frozen with SIGSTOP instead of killed
#   cluster-stop  as cluster-kill, the master frozen with SIGSTOP instead of killed
#
# "Redis back" is when Redis answered again, counted from the fault: PING answered (restart,
# pause, sleep), the new primary serving (repoint: through the proxy; Sentinel: named by the
# Sentinels and answering as master; Cluster: the promoted replica a master in a cluster that
# is ok), at once (script-flush), the end of the burst (overload). "recovered" counts from
# that moment.
#
# Targets only 127.0.0.1; every run is bounded (RUN_MS of load, bounded waits); everything
# it started is killed on exit, Ctrl-C included. Usage: scripts/chaos.sh [FAULT...] (default:
# every fault), with POLICIES="local open closed", RATE (requests/s, default 400), LIMIT (per
# key and second, default 30), TIMEOUT_MS (the apps' Redis timeout, default 100), SLACK_MS
# (default 100), FULL_COVERAGE (yes or no, default no) and KEEP=1 (keep the raw logs, path
# printed) in the environment. Needs redis-server (also run as a Sentinel) and redis-cli 7
# (scripts/test installs them), curl and python3.
set -euo pipefail
cd "$(dirname "$0")/.."

ALL_FAULTS="kill-restart repoint sentinel client-pause debug-sleep script-flush cluster-kill overload fast-restart silent sentinel-stop cluster-stop"
POLICIES=${POLICIES:-"local open closed"}
RATE=${RATE:-400}
# 400 requests/s over 4 keys: 100 per key and second, 50 to each app. A limit under 50 makes
# each app alone exceed it, so the local fallback has to deny too (and its bound is tested).
LIMIT=${LIMIT:-30}
TIMEOUT_MS=${TIMEOUT_MS:-100}
# Whether a Cluster stops serving every slot while any slot has no master (Redis's default is
# yes: then every key fails from the moment the killed master is marked failed until its
# replica is promoted). A rate limiter's Cluster is better off with no.
FULL_COVERAGE=${FULL_COVERAGE:-no}
SLACK_MS=${SLACK_MS:-100}
KEYS=4
RUN_MS=9000
FAULT_AT=3
FAULTS=${*:-$ALL_FAULTS}
for f in $FAULTS; do
  case " $ALL_FAULTS " in *" $f "*) ;; *) echo "unknown fault $f (one of: $ALL_FAULTS)" >&2; exit 2 ;; esac
done
for p in $POLICIES; do
  case "$p" in local | open | closed) ;; *) echo "unknown policy $p (local, open, closed)" >&2; exit 2 ;; esac
done
case "$FULL_COVERAGE" in yes | no) ;; *) echo "FULL_COVERAGE is yes or no" >&2; exit 2 ;; esac

export CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-2}
cargo build --release -q -p turnstile-tests --bin loadgen --bin proxy
cargo build --release -q -p turnstile-examples --example axum_redis

WORK=$(mktemp -d /tmp/turnstile-chaos.XXXXXX)
# Copies: a shared target dir may be rebuilt by someone else during the run.
mkdir -p "$WORK/bin"
TARGET=${CARGO_TARGET_DIR:-target}/release
cp "$TARGET/loadgen" "$TARGET/proxy" "$TARGET/examples/axum_redis" "$WORK/bin/"
BIN=$WORK/bin

PIDS=()
declare -A RPID # redis port -> pid
stop_all() {
  local p
  for p in "${PIDS[@]}"; do { kill -9 "$p" && wait "$p"; } 2>/dev/null || true; done
  PIDS=()
  RPID=()
}
cleanup() {
  stop_all
  if [ "${KEEP:-0}" = 1 ]; then echo "raw logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# A Cluster node also listens on its port + 10000 (the bus): both must be free.
free_cluster_port() {
  python3 -c '
import random, socket
for _ in range(1000):
    p = random.randrange(20000, 55535)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p)
    break
'
}
now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }
rcli() { local port=$1; shift; timeout 5 redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null; }
# wait_until SECONDS WHAT COMMAND...: polls every 20 ms; fails after SECONDS.
wait_until() {
  local secs=$1 what=$2 i
  shift 2
  for i in $(seq $((secs * 50))); do "$@" && return 0; sleep 0.02; done
  echo "$what: not within ${secs}s" >&2
  return 1
}
answers() { rcli "$1" ping | grep -q PONG; }
is_master() { rcli "$1" role | head -1 | grep -qx master; }
link_up() { rcli "$1" info replication | grep -q 'master_link_status:up'; }
cluster_ok() { rcli "$1" cluster info | grep -q 'cluster_state:ok'; }
sentinel_ready() {
  local info
  info="$(rcli "$1" sentinel master chaos | paste -sd ' ') "
  [[ $info == *"num-slaves 1 "* && $info == *"num-other-sentinels 2 "* ]]
}

start_redis() { # PORT [ARGS...]
  local port=$1
  shift
  mkdir -p "$WORK/r-$port"
  (cd "$WORK/r-$port" && exec redis-server --port "$port" --bind 127.0.0.1 --save "" \
    --appendonly no --enable-debug-command local "$@" >"$WORK/redis-$port.log" 2>&1) &
  RPID[$port]=$!
  PIDS+=("$!")
  wait_until 10 "redis on $port starts" answers "$port"
}
kill_redis() { { kill -9 "${RPID[$1]}" && wait "${RPID[$1]}"; } 2>/dev/null || true; }
freeze_redis() { kill -STOP "${RPID[$1]}"; }

start_app() { # PORT URL POLICY PREFIX (the apps of one run share a prefix: one limit)
  "$BIN/axum_redis" --port "$1" --redis-url "$2" --redis-timeout "${TIMEOUT_MS}ms" \
    --prefix "$4" --algorithm fixed-window --limit "$LIMIT" --period 1s \
    --key header:x-api-key --failure "$3" >"$WORK/app-$1.log" 2>&1 &
  PIDS+=("$!")
  wait_until 10 "app on $1 starts" curl -s -o /dev/null "http://127.0.0.1:$1/" -H 'x-api-key: probe'
}

# Each setup starts a deployment and sets URL (the apps' --redis-url), LOST (1 when the fault
# may lose Redis's counts) and FAULTED (the client keys the fault reaches; empty: all).
setup_single() {
  R1=$(free_port); start_redis "$R1"
  URL="redis://127.0.0.1:$R1"
}
# start_proxy TARGET_PORT: a proxy (tests/src/bin/proxy.rs) to 127.0.0.1:TARGET_PORT; sets
# PROXY_PORT, CONTROL_PORT and URL (the proxy's).
start_proxy() {
  coproc PROXY { exec "$BIN/proxy" "$1"; }
  PIDS+=("$PROXY_PID")
  local ports
  read -r ports <&"${PROXY[0]}"
  PROXY_PORT=${ports% *}
  CONTROL_PORT=${ports#* }
  URL="redis://127.0.0.1:$PROXY_PORT"
}
setup_repoint() {
  R1=$(free_port); start_redis "$R1"
  R2=$(free_port); start_redis "$R2" --replicaof 127.0.0.1 "$R1"
  wait_until 10 "the replica's link" link_up "$R2"
  start_proxy "$R1"
}
setup_proxied() {
  R1=$(free_port); start_redis "$R1"
  start_proxy "$R1"
}
# proxy_command LINE: sends LINE to the proxy's control port; fails unless it answers EXPECTED.
proxy_command() {
  local reply ctl
  exec {ctl}<>"/dev/tcp/127.0.0.1/$CONTROL_PORT"
  echo "$1" >&"$ctl"
  read -r -t 5 reply <&"$ctl"
  exec {ctl}>&-
  [ "$reply" = "$2" ] || { echo "proxy: $reply" >&2; return 1; }
}
setup_sentinel() {
  R1=$(free_port); start_redis "$R1"
  R2=$(free_port); start_redis "$R2" --replicaof 127.0.0.1 "$R1"
  wait_until 10 "the replica's link" link_up "$R2"
  SENTINELS=()
  local i port conf
  for i in 1 2 3; do
    port=$(free_port)
    mkdir -p "$WORK/s-$port"
    conf="$WORK/s-$port/sentinel.conf"
    printf '%s\n' "port $port" "bind 127.0.0.1" "dir $WORK/s-$port" \
      "sentinel monitor chaos 127.0.0.1 $R1 2" \
      "sentinel down-after-milliseconds chaos 500" \
      "sentinel failover-timeout chaos 2000" \
      "sentinel parallel-syncs chaos 1" >"$conf"
    redis-server "$conf" --sentinel >"$WORK/sentinel-$port.log" 2>&1 &
    PIDS+=("$!")
    SENTINELS+=("$port")
    wait_until 10 "sentinel on $port starts" answers "$port"
  done
  # A failover needs the Sentinels to know the replica and each other (quorum and a leader).
  for port in "${SENTINELS[@]}"; do
    wait_until 30 "sentinel $port sees the replica and the other Sentinels" sentinel_ready "$port"
  done
  URL="redis+sentinel://127.0.0.1:${SENTINELS[0]},127.0.0.1:${SENTINELS[1]},127.0.0.1:${SENTINELS[2]}/chaos"
}
setup_cluster() {
  local i port addrs=()
  CNODES=()
  for i in 1 2 3 4 5 6; do
    port=$(free_cluster_port)
    start_redis "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 1000 --cluster-require-full-coverage "$FULL_COVERAGE"
    CNODES+=("$port")
    addrs+=("127.0.0.1:$port")
  done
  timeout 30 redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
    >"$WORK/cluster-create.log" 2>&1
  for port in "${CNODES[@]}"; do wait_until 20 "cluster state ok on $port" cluster_ok "$port"; done
  for port in "${CNODES[@]}"; do
    if ! is_master "$port"; then wait_until 20 "replica $port's link" link_up "$port"; fi
  done
  URL=$(printf 'redis://127.0.0.1:%s,' "${CNODES[@]}")
  URL=${URL%,}
  # The master of k0's slot (the apps hash client keys: {first 128 bits of SHA-256, hex}),
  # its replica, and the client keys it serves.
  local nodes slot
  nodes=$(rcli "${CNODES[0]}" cluster nodes)
  VICTIM=$(master_of "$nodes" "$(slot_of k0)")
  local victim_id
  victim_id=$(awk -v p="127.0.0.1:$VICTIM@" 'index($2, p) == 1 { print $1 }' <<<"$nodes")
  HEIR=$(awk -v id="$victim_id" '$4 == id { split($2, a, "[:@]"); print a[2] }' <<<"$nodes")
  FAULTED=""
  # With full coverage, every master refuses every key (CLUSTERDOWN) while the killed one's
  # slots have no master: the fault reaches every key.
  if [ "$FULL_COVERAGE" = yes ]; then return 0; fi
  for i in $(seq 0 $((KEYS - 1))); do
    slot=$(slot_of "k$i")
    if [ "$(master_of "$nodes" "$slot")" = "$VICTIM" ]; then FAULTED+="k$i,"; fi
  done
}
slot_of() { # CLIENT_KEY: the Cluster slot of its keys
  local tag
  tag=$(python3 -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:32])' "$1")
  rcli "${CNODES[0]}" cluster keyslot "{$tag}"
}
master_of() { # CLUSTER_NODES SLOT: the port of the master serving SLOT
  awk -v s="$2" '$3 ~ /master/ {
    for (i = 9; i <= NF; i++) { n = split($i, r, "-"); lo = r[1]; hi = (n == 2 ? r[2] : r[1]);
      if (s + 0 >= lo + 0 && s + 0 <= hi + 0) { split($2, a, "[:@]"); print a[2] } } }' <<<"$1"
}

setup() { # FAULT
  LOST=0
  FAULTED=""
  case "$1" in
    repoint) setup_repoint; LOST=1 ;;
    sentinel | sentinel-stop) setup_sentinel; LOST=1 ;;
    cluster-kill | cluster-stop) setup_cluster; LOST=1 ;;
    kill-restart | fast-restart) setup_single; LOST=1 ;;
    silent) setup_proxied ;;
    *) setup_single ;;
  esac
}

# probe CHECK ARGS...: starts scripts/chaos_probe.py, which will write to $WORK/back the epoch
# ms at which the deployment served again after failing; returns once it polls.
probe() {
  rm -f "$WORK/probe.ready" "$WORK/back"
  python3 scripts/chaos_probe.py "$WORK/probe.ready" 30 "$@" >"$WORK/back" &
  PROBE=$!
  PIDS+=("$PROBE")
  wait_until 10 "the probe starts" test -e "$WORK/probe.ready"
}

inject() { # FAULT; sets BACK_MS, the epoch ms at which Redis served again (0: never)
  BACK_MS=0
  PROBE=
  case "$1" in
    kill-restart)
      probe ping "$R1"
      FAULT_MS=$(now_ms)
      kill_redis "$R1"
      sleep 1
      start_redis "$R1" ;;
    repoint)
      probe master-at "$PROXY_PORT" "$R2"
      FAULT_MS=$(now_ms)
      rcli "$R2" replicaof no one >/dev/null
      rcli "$R1" replicaof 127.0.0.1 "$R2" >/dev/null
      proxy_command "repoint $R2" "ok $R2" ;;
    sentinel)
      probe sentinels "$R2" "${SENTINELS[@]}"
      FAULT_MS=$(now_ms)
      kill_redis "$R1" ;;
    client-pause)
      probe ping "$R1"
      FAULT_MS=$(now_ms)
      rcli "$R1" client pause 1500 all >/dev/null ;;
    debug-sleep)
      probe ping "$R1"
      FAULT_MS=$(now_ms)
      rcli "$R1" debug sleep 1 >/dev/null ;;
    script-flush)
      FAULT_MS=$(now_ms)
      rcli "$R1" script flush >/dev/null
      rcli "$R1" function flush >/dev/null ;;
    cluster-kill)
      probe cluster-master "$HEIR"
      FAULT_MS=$(now_ms)
      kill_redis "$VICTIM" ;;
    fast-restart)
      probe ping "$R1"
      FAULT_MS=$(now_ms)
      kill_redis "$R1"
      start_redis "$R1" ;;
    silent)
      # Redis never stops serving new connections: "back" at once.
      FAULT_MS=$(now_ms)
      proxy_command silence "ok silent" ;;
    sentinel-stop)
      probe sentinels "$R2" "${SENTINELS[@]}"
      FAULT_MS=$(now_ms)
      freeze_redis "$R1" ;;
    cluster-stop)
      probe cluster-master "$HEIR"
      FAULT_MS=$(now_ms)
      freeze_redis "$VICTIM" ;;
    overload)
      FAULT_MS=$(now_ms)
      # 20x the rate for 1 s over 1000 keys (k0-k999, the steady load's 4 among them), so
      # that each request goes to Redis (a flood on one key is denied by the deny cache
      # without asking Redis).
      "$BIN/loadgen" $((RATE * 20)) 1000 1000 x-api-key "$WORK/burst.txt" \
        "http://127.0.0.1:$APP1/" "http://127.0.0.1:$APP2/" >/dev/null ;;
  esac
  if [ -n "$PROBE" ]; then
    if wait "$PROBE"; then BACK_MS=$(cat "$WORK/back"); fi
  else
    BACK_MS=$(now_ms)
  fi
}
python3 scripts/chaos_report.py --header
for fault in $FAULTS; do
  for policy in $POLICIES; do
    setup "$fault"
    prefix="chaos:$fault:$policy:$RANDOM"
    APP1=$(free_port); start_app "$APP1" "$URL" "$policy" "$prefix"
    APP2=$(free_port); start_app "$APP2" "$URL" "$policy" "$prefix"
    rm -f "$WORK/burst.txt"
    # Let the probes' window pass, then load both apps at a fixed rate.
    sleep 1
    "$BIN/loadgen" "$RATE" "$RUN_MS" "$KEYS" x-api-key "$WORK/load.txt" \
      "http://127.0.0.1:$APP1/" "http://127.0.0.1:$APP2/" >/dev/null &
    LOAD=$!
    PIDS+=("$LOAD")
    sleep "$FAULT_AT"
    inject "$fault"
    wait "$LOAD"
    loads=(load.txt)
    if [ -f "$WORK/burst.txt" ]; then loads+=(burst.txt); fi
    report=(--fault "$fault" --policy "$policy" --limit "$LIMIT" --period-ms 1000
      --timeout-ms "$TIMEOUT_MS" --slack-ms "$SLACK_MS" --fault-ms "$FAULT_MS"
      --back-ms "$BACK_MS" --lost "$LOST" "--faulted-keys=$FAULTED")
    stop_all
    RUN=$WORK/$fault-$policy
    mkdir -p "$RUN"
    mv "$WORK"/*.log "$WORK"/*.txt "$RUN/"
    for f in "${loads[@]}"; do report+=(--load "$RUN/$f"); done
    report+=(--log "$RUN/app-$APP1.log" --log "$RUN/app-$APP2.log")
    python3 scripts/chaos_report.py "${report[@]}"
    if [ "${KEEP:-0}" = 1 ]; then
      # To compute the row again: python3 scripts/chaos_report.py $(cat "$RUN/report.args")
      printf '%s\n' "${report[*]}" >"$RUN/report.args"
    else
      rm -rf "$RUN"
    fi
    rm -rf "$WORK"/r-* "$WORK"/s-*
  done
done
