#!/usr/bin/env bash
# In-memory decisions: turnstile's MemoryBackend (token bucket, GCRA) against governor's keyed
# (DashMap) and direct limiters, a hot key and 10,000 keys, 1 and 2 threads, all admitting.
# Prints Mdecisions/s per contender (median, min-max over ROUNDS rounds, default 5) and the
# paired ratios. See benches/benches/vs_governor.rs for the method.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh
machine
cargo bench -q -p turnstile-benches --bench vs_governor --no-run
exec cargo bench -q -p turnstile-benches --bench vs_governor
