#!/usr/bin/env bash
# The test suite: fetches the bundled model (the real-model tests need it), then runs every test
# (unit tests, integration tests, the binary end to end) and prints a one-line summary.
# Tests pin candle/rayon to one thread each; two test threads keep both cores busy.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/fetch-model.sh
# With a baseline venv (torch + transformers 5 + gguf; PBRL_REF_VENV, default .venv-bench, the one
# scripts/bench.sh makes), also check against transformers at test time: SmolLM2 as a transformers
# directory (models/smollm2-hf) and pbrl's exports loaded back in transformers. Without one those
# tests skip, saying so.
REF_VENV=${PBRL_REF_VENV:-.venv-bench}
if [ -x "$REF_VENV/bin/python" ] && "$REF_VENV/bin/python" -c "import torch, transformers, gguf" 2>/dev/null; then
  export PBRL_REF_PYTHON="$PWD/$REF_VENV/bin/python"
  [ "${REF_VENV#/}" != "$REF_VENV" ] && export PBRL_REF_PYTHON="$REF_VENV/bin/python"
  [ -f models/smollm2-hf/config.json ] || "$PBRL_REF_PYTHON" scripts/fixtures/smollm2_hf_dir.py models/smollm2-hf
fi
export PBRL_THREADS=1 RAYON_NUM_THREADS=1 CANDLE_NUM_THREADS=1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
cargo test --locked --workspace --lib --bins --tests -- --test-threads=2 "$@" 2>&1 | tee "$log" || status=$?
passed=$(grep -Eo 'test result: .* ([0-9]+) passed' "$log" | grep -Eo '[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
failed=$(grep -Eo '[0-9]+ failed;' "$log" | awk '{s+=$1} END {print s+0}')
echo "summary: $passed passed, $failed failed"
exit $status
