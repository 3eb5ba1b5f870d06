#!/usr/bin/env bash
# The test suite: fetches the bundled model (the real-model tests need it), then runs every test.
# Tests pin candle/rayon to one thread each; two test threads keep both cores busy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
export PBRL_THREADS=1 RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1
cargo test --locked -- --test-threads=2 "$@"
