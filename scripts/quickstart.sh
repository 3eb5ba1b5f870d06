#!/usr/bin/env bash
# The main job on the bundled default: one MADPO cycle on configs/quickstart.toml with the real
# SmolLM2-135M-Instruct agents, in a fresh run directory:
#   pbrl eval -> pbrl collect -> pbrl train-madpo -> pbrl eval
# and a before/after summary with each stage's wall time.
#   scripts/quickstart.sh [KEY=VALUE ...]      overrides go to every stage
#   CONFIG=file (default configs/quickstart.toml), RUN_DIR=dir (default runs/quickstart-<UTC time>),
#   PBRL_THREADS=n (default: the physical cores)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/quickstart.toml}
RUN_DIR=${RUN_DIR:-runs/quickstart-$(date -u +%Y%m%dT%H%M%SZ)}
if [ -e "$RUN_DIR" ]; then
  echo "error: $RUN_DIR exists; pick another RUN_DIR (this script never reuses a run directory)" >&2
  exit 2
fi
scripts/fetch-model.sh
cargo build --release --quiet
PBRL=target/release/pbrl
args=(--config "$CONFIG" --run-dir "$RUN_DIR" "$@")

declare -A secs
stage() { # stage NAME COMMAND...: run one stage, echo its output, remember its wall time
  local name=$1; shift
  echo "== $name"
  local start=$SECONDS
  "$PBRL" "$@" "${args[@]}" | tee "$RUN_DIR/logs/$name.log"
  secs[$name]=$((SECONDS - start))
}
mkdir -p "$RUN_DIR/logs"
stage eval-before eval
stage collect collect
stage train-madpo train-madpo
stage eval-after eval

reward() { awk '/^eval\/turn_1\/reward_mean/ {print $2}' "$RUN_DIR/logs/$1.log"; }
before=$(reward eval-before); after=$(reward eval-after)
total=$((secs[eval-before] + secs[collect] + secs[train-madpo] + secs[eval-after]))
echo
echo "quickstart cycle in $RUN_DIR ($total s: eval ${secs[eval-before]} s, collect ${secs[collect]} s, train-madpo ${secs[train-madpo]} s, eval ${secs[eval-after]} s)"
echo "eval/turn_1/reward_mean  before $before  after $after"
