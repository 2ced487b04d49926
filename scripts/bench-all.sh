#!/usr/bin/env bash
# Every benchmark of BENCHMARKS.md in one go (about 10-15 minutes on 2 CPUs): in memory,
# HTTP, Redis (RedisBackend vs redis-benchmark, the flood) and Redis CPU per script. Each
# script's output is also kept in target/bench/<name>.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p target/bench
for b in memory http redis redis-cpu; do
  echo "=== scripts/bench-$b.sh"
  scripts/bench-"$b".sh 2>&1 | tee target/bench/"$b".txt
  echo
done
