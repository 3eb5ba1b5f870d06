#!/usr/bin/env bash
# The main job on the bundled default: one MADPO cycle on configs/quickstart.toml with the real
# SmolLM2-135M-Instruct agents, in a fresh run directory:
#   pbrl eval -> pbrl collect -> pbrl train-madpo -> pbrl eval
# or with ALGORITHM=marlhf the MARLHF cycle:
#   pbrl eval -> pbrl collect -> pbrl fit-rm -> pbrl train-marlhf -> pbrl eval
# or with ALGORITHM=iterate the iterative cycle, `pbrl iterate` (num_iterations rounds of
# collection against the comparator, MADPO training and evaluation; the base team evaluated
# first), and a before/after summary with each stage's wall time (iterate: per round,
# scripts/summarize_runs.py).
#   scripts/quickstart.sh [KEY=VALUE ...]      overrides go to every stage
#   CONFIG=file (default configs/quickstart.toml), RUN_DIR=dir (default runs/quickstart-<UTC time>),
#   ALGORITHM=madpo|marlhf|iterate (default madpo), PBRL_THREADS=n (default: the physical cores),
#   PBRL_BIN=path (a pbrl binary to run instead of building one)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${CONFIG:-configs/quickstart.toml}
case ${ALGORITHM:-madpo} in
  madpo) training=(train-madpo) ;;
  marlhf) training=(fit-rm train-marlhf) ;;
  iterate) training=() ;;
  *) echo "error: ALGORITHM must be madpo, marlhf or iterate" >&2; exit 2 ;;
esac
RUN_DIR=${RUN_DIR:-runs/quickstart-$(date -u +%Y%m%dT%H%M%SZ)}
if [ -e "$RUN_DIR" ]; then
  echo "error: $RUN_DIR exists; pick another RUN_DIR (this script never reuses a run directory)" >&2
  exit 2
fi
scripts/fetch-model.sh
if [ -z "${PBRL_BIN:-}" ]; then cargo build --release --quiet; fi
PBRL=${PBRL_BIN:-target/release/pbrl}
args=(--config "$CONFIG" --run-dir "$RUN_DIR" "$@")

declare -A secs
stage() { # stage NAME COMMAND...: run one stage, echo its output, remember its wall time
  local name=$1; shift
  echo "== $name"
  local start=$SECONDS
  "$PBRL" "$@" "${args[@]}" | tee "$RUN_DIR/logs/$name.log"
  secs[$name]=$((SECONDS - start))
  echo "$name ${secs[$name]}" >> "$RUN_DIR/logs/times"
}
mkdir -p "$RUN_DIR/logs"
if [ "${ALGORITHM:-madpo}" = iterate ]; then
  stage iterate iterate
  echo
  echo "iterative cycle in $RUN_DIR (${secs[iterate]} s)"
  python3 scripts/summarize_runs.py "$RUN_DIR"
  exit 0
fi
order=(eval-before collect "${training[@]}" eval-after)
for name in "${order[@]}"; do
  case $name in eval-*) stage "$name" eval ;; *) stage "$name" "$name" ;; esac
done

# The evaluation's headline: a discussion's score (multi-turn), else turn 1's reward.
metric=eval/turn_1/reward_mean
grep -q '^eval/history_reward_mean' "$RUN_DIR/logs/eval-before.log" && metric=eval/history_reward_mean
reward() { awk -v m="$metric" '$1 == m {print $2}' "$RUN_DIR/logs/$1.log"; }
before=$(reward eval-before); after=$(reward eval-after)
total=0; parts=()
for name in "${order[@]}"; do total=$((total + secs[$name])); parts+=("$name ${secs[$name]} s"); done
echo
echo "quickstart cycle in $RUN_DIR ($total s: $(IFS=,; echo "${parts[*]}" | sed 's/,/, /g'))"
echo "$metric  before $before  after $after"
