#!/usr/bin/env bash
# The anchored-MADPO study (docs/madpo-study.md, "Anchored MADPO"): per task and seed, one base
# eval and one collection; then train-madpo for every variant, each on a copy of that run
# directory, with keep-best on a held-out share of the train items; then the saved (best) and
# the final agents evaluated on the task's eval file. Every eval: `eval_samples_per_item`
# samples per prompt. Prints the paired gain (after − before, per prompt) and its standard
# error over prompts, per run and averaged over seeds (also summary.md).
#   STUDY_DIR (default target/anchored-study), TASKS (config names, default
#   "quickstart story_keywords tldr_explain"), SEEDS (default "1 2 3"), VARIANTS (a file of
#   lines `NAME KEY=VALUE ...`, default the grid below), COMMON (overrides for every stage),
#   PBRL_THREADS (default: the physical cores). Rerunning continues: finished runs are kept
#   (their logs, evaluations and metrics; their weights, ~3 GB a run, are deleted).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${STUDY_DIR:-target/anchored-study}; TASKS=${TASKS:-quickstart story_keywords tldr_explain}
SEEDS=${SEEDS:-1 2 3}
COMMON=${COMMON:-eval_split=0.15 keep_best=true eval_interval=12 eval_num_samples=16 eval_samples_per_item=4}
read -ra COMMON_ARGS <<< "$COMMON"
mkdir -p "$DIR"
if [ -z "${VARIANTS:-}" ]; then
  VARIANTS=$DIR/variants
  : > "$VARIANTS"
  for lr in 5e-6 5e-5; do
    for beta in 0.01 0.1; do
      echo "free_b${beta}_lr$lr madpo_reference=false dpo_beta=$beta agent_learning_rate=$lr" >> "$VARIANTS"
      echo "anchored_b${beta}_lr$lr madpo_reference=true dpo_beta=$beta agent_learning_rate=$lr" >> "$VARIANTS"
      echo "anchoredln_b${beta}_lr$lr madpo_reference=true madpo_length_normalize=true dpo_beta=$beta agent_learning_rate=$lr" >> "$VARIANTS"
    done
  done
fi
. scripts/study/study-common.sh
for task in $TASKS; do
  for seed in $SEEDS; do
    s=$DIR/$task/seed$seed; mkdir -p "$s"
    args=(--config "configs/$task.toml" seed="$seed" "${COMMON_ARGS[@]}")
    if [ ! -d "$s/base/preference_replay" ]; then
      rm -rf "$s/base"
      t=$(timed "$s/eval0.log" "$PBRL" eval "${args[@]}" --run-dir "$s/base"); echo "$task $seed base eval $t" >> "$DIR/times"
      t=$(timed "$s/collect.log" "$PBRL" collect "${args[@]}" --run-dir "$s/base"); echo "$task $seed base collect $t" >> "$DIR/times"
    fi
    while read -r name overrides; do
      [ -n "$name" ] || continue
      d=$s/$name
      [ -f "$d/done" ] && continue
      rm -rf "$d"; cp -r "$s/base" "$d"; rm -rf "$d/eval"
      read -ra o <<< "$overrides"
      t=$(timed "$d/train.log" "$PBRL" train-madpo "${args[@]}" --run-dir "$d" "${o[@]}"); echo "$task $seed $name train $t" >> "$DIR/times"
      t=$(timed "$d/eval.log" "$PBRL" eval "${args[@]}" --run-dir "$d" "${o[@]}"); echo "$task $seed $name eval $t" >> "$DIR/times"
      if [ -d "$d/final_agents" ]; then
        t=$(timed "$d/eval_final.log" "$PBRL" eval "${args[@]}" --run-dir "$d" "${o[@]}" --team "$d/final_agents")
      fi
      # the evaluations are kept; the weights (~3 GB a run) are not
      find "$d" -name '*.safetensors' -delete; rm -rf "$d/checkpoints"
      touch "$d/done"
    done < "$VARIANTS"
  done
done
python3 scripts/study/study_summary.py "$DIR" | tee "$DIR/summary.md"
