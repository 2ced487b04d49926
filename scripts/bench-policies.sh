#!/usr/bin/env bash
# The time of one check by its number of policies (issue 25, fault 4): a private redis-server
# on a free port, then benches/src/bin/policy_cost.rs through RedisBackend with Functions and
# with EVALSHA. COUNTS (default 20,100,300,512,1000; over the cap of 512 is refused before
# sending) and CALLS (30 per count and mode) in the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/bench-lib.sh

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
cargo build --release -q -p turnstile-benches --bin policy_cost
start_redis
"${CARGO_TARGET_DIR:-target}/release/policy_cost" --url "redis://127.0.0.1:$REDIS_PORT" \
  --counts "${COUNTS:-20,100,300,512,1000}" --calls "${CALLS:-30}"
