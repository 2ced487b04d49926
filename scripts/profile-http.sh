#!/usr/bin/env bash
# Instructions per HTTP request through each stack of scripts/bench-http.sh, in process,
# counted by callgrind (valgrind): benches/benches/http_path.rs calls the axum router as a
# tower service (no sockets, no kernel), so the count is what axum and the layer do per
# request — independent of other load on the machine, so commits compare repeatably where the
# timed bench-http.sh cannot. The `bare` row is axum's own share; a layer's cost is its row
# minus `bare`.
#
# Each stack runs twice (N1 and N2 requests after a warm-up of 100); instructions per request
# = (Ir(N2) - Ir(N1)) / (N2 - N1), so set-up cancels out. Knobs: N1 (default 20000), N2
# (default 60000), MODES (default "bare identity-layer turnstile turnstile-no-headers
# turnstile-denied tower-governor tower-governor-headers"; `identity-layer` is axum with a layer that does nothing:
# what axum adds for any layer). With FLAME=DIR it also draws a flame graph per stack,
# DIR/<stack>.svg, from `perf record --call-graph dwarf` of FLAME_N requests (default 300000;
# perf's default event, cpu-clock on a VM without hardware counters) folded by inferno
# (`cargo install inferno`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
need valgrind valgrind
N1="${N1:-20000}"
N2="${N2:-60000}"
MODES="${MODES:-bare identity-layer turnstile turnstile-no-headers turnstile-denied tower-governor tower-governor-headers}"
TARGET="${CARGO_TARGET_DIR:-target}"
cargo bench -q -p turnstile-benches --bench http_path --no-run
BIN=$(ls -t "$TARGET"/release/deps/http_path-* | grep -v '\.d$' | head -1)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# ir MODE N: total instructions (Ir) of one run of MODE with N requests.
ir() {
  valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1.$2" "$BIN" "$1" "$2" \
    >"$OUT/out" 2>"$OUT/log" || { cat "$OUT/log" >&2; exit 1; }
  awk '/^summary:/ { print $2 }' "$OUT/cg.$1.$2"
}

machine
echo "# instructions per request (callgrind), in process, ($N2 - $N1) requests; commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
printf '%-22s %12s %12s\n' stack "instr/req" "- bare"
bare=
for m in $MODES; do
  a=$(ir "$m" "$N1"); b=$(ir "$m" "$N2")
  per=$(awk -v a="$a" -v b="$b" -v n=$((N2 - N1)) 'BEGIN { printf("%.0f", (b - a) / n) }')
  [ "$m" = bare ] && bare=$per
  if [ -n "$bare" ]; then extra=$(( per - bare )); else extra='-'; fi
  printf '%-22s %12s %12s\n' "$m" "$per" "$extra"
  if [ -n "${FLAME:-}" ]; then
    mkdir -p "$FLAME"
    command -v inferno-flamegraph >/dev/null || { echo "FLAME needs inferno: cargo install inferno" >&2; exit 1; }
    perf record -q -F 4999 -g --call-graph dwarf,16384 -o "$OUT/perf.data" \
      "$BIN" "$m" "${FLAME_N:-300000}" >/dev/null 2>"$OUT/log"
    perf script -i "$OUT/perf.data" 2>/dev/null | inferno-collapse-perf >"$OUT/folded"
    inferno-flamegraph --title "$m: http_path $m ${FLAME_N:-300000} (commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))" \
      --width 1400 --minwidth 1.5 <"$OUT/folded" >"$FLAME/$m.svg"
  fi
done
