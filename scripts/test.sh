#!/usr/bin/env bash
# The test suite: fetches the bundled model (the real-model tests need it), then runs every test
# (unit tests, integration tests, the binary end to end) and prints a one-line summary.
# Tests pin candle/rayon to one thread each; two test threads keep both cores busy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
export PBRL_THREADS=1 RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --lib --bins --tests -- --test-threads=2 "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -Eo 'test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
echo "summary: $passed passed, $failed failed"
exit $status
