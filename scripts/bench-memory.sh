#!/usr/bin/env bash
# In-memory decisions: turnstile's MemoryBackend (token bucket, GCRA) against governor's keyed
# (DashMap) and direct limiters, a hot key and 10,000 keys, 1 and 2 threads, all admitting.
# Prints Mdecisions/s per contender (median, min-max over ROUNDS rounds, default 5) and the
# paired ratios. See benches/benches/vs_governor.rs for the method. Then heap bytes per key of
# both (benches/benches/bytes_per_key.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
machine
cargo bench -q -p turnstile-benches --bench vs_governor --bench bytes_per_key --no-run
cargo bench -q -p turnstile-benches --bench vs_governor
echo
cargo bench -q -p turnstile-benches --bench bytes_per_key
