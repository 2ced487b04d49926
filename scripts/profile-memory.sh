#!/usr/bin/env bash
# Instructions per in-memory decision, counted by callgrind (valgrind): turnstile's
# MemoryBackend (token bucket, GCRA) and governor's keyed and direct limiters, a hot key and
# 10,000 keys, 1 and 2 threads — the cases of scripts/bench-memory.sh. Instruction counts do
# not depend on other load, so they compare commits repeatably on a busy machine (time per
# instruction still differs: a lock that two threads contend costs more cycles, not more
# instructions; the timed bench is the judge of speed).
#
# Each case runs twice (N1 and N2 decisions per thread after a warm-up pass over the keys);
# instructions per decision = (Ir(N2) - Ir(N1)) / ((N2 - N1) * threads), so set-up cancels.
# With FLAME=DIR it also draws a flame graph per case, DIR/<contender>-<keys>-<threads>.svg,
# from `perf record` samples of a longer run (perf's cpu-clock software event, so it works in
# a VM without hardware counters) folded by inferno (`cargo install inferno`).
#
# Knobs: N1 (default 100000), N2 (default 300000), CASES (default every case, e.g.
# "tb:hot:1 keyed:hot:1"), FLAME_N (decisions per thread of the sampled run, 3000000).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
need valgrind valgrind
N1="${N1:-100000}"
N2="${N2:-300000}"
CASES="${CASES:-tb:hot:1 gcra:hot:1 keyed:hot:1 direct:hot:1 tb:hot:2 gcra:hot:2 keyed:hot:2 direct:hot:2 tb:10k:1 gcra:10k:1 keyed:10k:1 tb:10k:2 gcra:10k:2 keyed:10k:2}"
TARGET="${CARGO_TARGET_DIR:-target}"
cargo bench -q -p turnstile-benches --bench hot_path --no-run
BIN=$(ls -t "$TARGET"/release/deps/hot_path-* | grep -v '\.d$' | head -1)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# ir N: total instructions (Ir) of one run of the current case with N decisions per thread,
# less quanta's one-time calibration of the CPU's counter (both contenders' clocks use it;
# it runs until it converges or 200 ms pass, so its count varies from run to run by more
# than the decisions' differences: millions of instructions).
ir() {
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1" "$BIN" "$c" "$k" "$t" "$1" \
    >/dev/null 2>"$OUT/log"
  local total cal
  total=$(awk '/^summary:/ { print $2 }' "$OUT/cg.$1")
  cal=$(callgrind_annotate --inclusive=yes --threshold=100 "$OUT/cg.$1" 2>/dev/null |
    awk '/once_cell::imp::OnceCell<T>::initialize::\{\{closure\}\} \[/ { gsub(",", "", $1); print $1; exit }')
  echo $((total - ${cal:-0}))
}

machine
echo "# instructions per decision (callgrind), ($N2 - $N1) decisions per thread"
printf '%-8s %-5s %-3s %s\n' contender keys thr "instructions/decision"
for case in $CASES; do
  IFS=: read -r c k t <<<"$case"
  a=$(ir "$N1"); b=$(ir "$N2")
  printf '%-8s %-5s %-3s %.1f\n' "$c" "$k" "$t" "$(awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) -v t="$t" 'BEGIN { print (b - a) / (n * t) }')"
  if [ -n "${FLAME:-}" ]; then
    mkdir -p "$FLAME"
    command -v inferno-flamegraph >/dev/null || { echo "FLAME needs inferno: cargo install inferno" >&2; exit 1; }
    perf record -q -F 4999 -g --call-graph dwarf,16384 -o "$OUT/perf.data" \
      "$BIN" "$c" "$k" "$t" "${FLAME_N:-3000000}" >/dev/null 2>"$OUT/log"
    perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf >"$OUT/folded"
    inferno-flamegraph --title "$c $k, $t thread(s): hot_path $c $k $t ${FLAME_N:-3000000}" \
      --width 1400 <"$OUT/folded" >"$FLAME/$c-$k-$t.svg"
  fi
done
