#!/usr/bin/env bash
# Memory comes back: starts the quickstart example (release build, in memory) keyed by an
# `x-client` header, reads its resident set size (VmRSS, /proc) before, during and after a
# flood of CLIENTS distinct clients (one request each) over FLOOD_S seconds, then without any
# traffic for two periods of its one policy (a sliding log of PERIOD_S seconds), and says
# whether RSS came back near the baseline (within TOLERANCE_MB, default 10 MB).
#
#   scripts/rss-flood.sh                      # 330,000 clients in 10 s, 60 s sliding log
#   CLIENTS=100000 PERIOD_S=20 scripts/rss-flood.sh
#
# Bounded: at most CLIENTS requests, all to 127.0.0.1 on a free port, the flood stops after
# FLOOD_S seconds (whatever it reached), the whole run after FLOOD_S + 2 × PERIOD_S + 60 s.
# The server, the load generator and the temporary directory are removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

CLIENTS="${CLIENTS:-330000}"
FLOOD_S="${FLOOD_S:-10}"
PERIOD_S="${PERIOD_S:-60}"
TOLERANCE_MB="${TOLERANCE_MB:-10}"
CONNECTIONS="${CONNECTIONS:-32}"

for v in CLIENTS FLOOD_S PERIOD_S TOLERANCE_MB CONNECTIONS; do
  case "${!v}" in
    '' | *[!0-9]*) echo "$(basename "$0"): $v must be a whole number, not '${!v}'" >&2; exit 2 ;;
  esac
done
if [ "$CLIENTS" -lt 1 ] || [ "$CLIENTS" -gt 2000000 ] || [ "$FLOOD_S" -lt 1 ] \
  || [ "$FLOOD_S" -gt 600 ] || [ "$PERIOD_S" -lt 1 ] || [ "$PERIOD_S" -gt 600 ] \
  || [ "$CONNECTIONS" -lt 1 ] || [ "$CONNECTIONS" -gt 256 ]; then
  echo "$(basename "$0"): CLIENTS 1..2000000, FLOOD_S and PERIOD_S 1..600, CONNECTIONS 1..256" >&2
  exit 2
fi
need python3 python3

cargo build --release -q -p turnstile-examples --example quickstart
SERVER="${CARGO_TARGET_DIR:-target}/release/examples/quickstart"

OUT=$(mktemp -d)
SERVER_PID=
LOAD_PID=
cleanup() {
  # Never stops half-way (errexit is off here), and keeps the script's exit status.
  set +e
  if [ -n "$LOAD_PID" ]; then kill "$LOAD_PID" 2>/dev/null; wait "$LOAD_PID" 2>/dev/null; fi
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null; wait "$SERVER_PID" 2>/dev/null; fi
  rm -rf "$OUT"
}
trap cleanup EXIT

cat >"$OUT/flood.toml" <<EOF
# One client per x-client header value; one sliding log of ${PERIOD_S} s, 100 per period.
key = "header:x-client"
policies = ["sliding-log:limit=100,period=${PERIOD_S}s,name=per-client"]
EOF

# The load generator: CONNECTIONS keep-alive connections to 127.0.0.1:PORT, each sending its
# share of the clients as pipelined batches of GET / with x-client: c<N>, reading every
# response; stops at the deadline. Prints "sent=N answered=M".
cat >"$OUT/flood.py" <<'EOF'
import socket, sys, time, threading
port, clients, seconds, conns = (int(a) for a in sys.argv[1:5])
deadline = time.monotonic() + seconds
answered = [0] * conns
sent = [0] * conns
BATCH = 64

def run(k):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    ids = range(k, clients, conns)
    buf = b""
    for start in range(0, len(ids), BATCH):
        if time.monotonic() >= deadline:
            break
        batch = ids[start:start + BATCH]
        s.sendall(b"".join(
            b"GET / HTTP/1.1\r\nhost: 127.0.0.1\r\nx-client: c%d\r\n\r\n" % i for i in batch))
        sent[k] += len(batch)
        want = answered[k] + len(batch)
        while answered[k] < want:
            chunk = s.recv(1 << 16)
            if not chunk:
                return
            buf += chunk
            answered[k] += buf.count(b"HTTP/1.1 ")
            buf = buf[buf.rfind(b"HTTP/1.1 ") + 1:] if b"HTTP/1.1 " in buf else buf[-16:]
    s.close()

threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(conns)]
for t in threads:
    t.start()
for t in threads:
    t.join(max(0.0, deadline - time.monotonic()) + 5)
print("sent=%d answered=%d" % (sum(sent), sum(answered)))
EOF

# The server's allocator: glibc's malloc keeps the pages of freed small allocations in its
# arenas (the memory is free for the process to reuse, but stays resident), so by default the
# server runs on jemalloc (Debian's libjemalloc2, preloaded), which returns free pages to the
# system after a second. ALLOCATOR=system shows glibc's behaviour.
ALLOCATOR="${ALLOCATOR:-jemalloc}"
SERVER_ENV=()
case "$ALLOCATOR" in
  jemalloc)
    JEMALLOC=$(ls /usr/lib/*/libjemalloc.so.2 2>/dev/null | head -n 1 || true)
    if [ -z "$JEMALLOC" ]; then
      # A library, not a command: `need` installs the package for a name no command has.
      need libjemalloc.so.2 libjemalloc2
      JEMALLOC=$(ls /usr/lib/*/libjemalloc.so.2 | head -n 1)
    fi
    SERVER_ENV=(LD_PRELOAD="$JEMALLOC" MALLOC_CONF="background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0")
    ;;
  system) ;;
  *) echo "$(basename "$0"): ALLOCATOR is jemalloc or system, not '$ALLOCATOR'" >&2; exit 2 ;;
esac

PORT=$(free_port)
env "${SERVER_ENV[@]}" "$SERVER" --port "$PORT" --config "$OUT/flood.toml" >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.1
done
(exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null || { cat "$OUT/server.log" >&2; exit 1; }

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$SERVER_PID/status"; }
mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }

# A few requests first, so the baseline includes a warmed-up server.
curl -s -o /dev/null -H 'x-client: warm-up' "http://127.0.0.1:$PORT/"
sleep 1
BASE=$(rss_kb)
echo "baseline: $(mb "$BASE") MB RSS (quickstart on the $ALLOCATOR allocator, $PERIOD_S s sliding log keyed by x-client)"

START=$(date +%s.%N)
timeout $(( FLOOD_S + 30 )) python3 "$OUT/flood.py" "$PORT" "$CLIENTS" "$FLOOD_S" "$CONNECTIONS" \
  >"$OUT/load.out" &
LOAD_PID=$!
PEAK=$BASE
while kill -0 "$LOAD_PID" 2>/dev/null; do
  r=$(rss_kb); [ "$r" -gt "$PEAK" ] && PEAK=$r
  sleep 0.5
done
wait "$LOAD_PID" || true
LOAD_PID=
FLOOD_END=$(date +%s.%N)
echo "flood: $(cat "$OUT/load.out") in $(awk -v a="$START" -v b="$FLOOD_END" 'BEGIN { printf "%.1f", b - a }') s; peak $(mb "$PEAK") MB RSS, $(mb "$(rss_kb)") MB at its end"

# No traffic from here on: every key has expired one period after the flood; the sweeper
# drops them within a second after that.
LAST=0
for t in $(seq 10 10 $(( 2 * PERIOD_S ))); do
  sleep $(( t - LAST )); LAST=$t
  echo "  +${t} s without traffic: $(mb "$(rss_kb)") MB RSS"
done
END=$(rss_kb)
echo "after two periods ($(( 2 * PERIOD_S )) s): $(mb "$END") MB RSS (baseline $(mb "$BASE") MB, peak $(mb "$PEAK") MB)"
if [ $(( END - BASE )) -le $(( TOLERANCE_MB * 1024 )) ]; then
  echo "memory came back: within $TOLERANCE_MB MB of the baseline"
else
  echo "memory did NOT come back: $(mb $(( END - BASE ))) MB above the baseline" >&2
  exit 1
fi
