#!/usr/bin/env bash
# MARLHF's proof of learning (README, "RL on the reward model"): per seed, one base round and
# base eval (taken from an anchored-study directory when it has them for that task and seed,
# else made here), one reward model fitted on the round (fit-rm, held-out accuracy in its log),
# then per RL backend train-marlhf on a copy of that run directory and an eval of the saved
# (keep-best) and of the final agents. Every eval: `eval_samples_per_item` samples per prompt.
# Prints the paired gain (after - before, per prompt) and its standard error, per run and
# averaged over seeds (scripts/study/study_summary.py; also summary.md).
#   STUDY_DIR (default target/marlhf-study), TASK (default quickstart), SEEDS (default "1 2"),
#   BACKENDS (rl_algorithm values, default "magrpo iac"), BASES (default target/anchored-study),
#   COMMON (overrides for every stage, default the anchored study's), FIT (overrides for fit-rm
#   only), TRAIN (overrides for train-marlhf only), PBRL_THREADS.
#   Rerunning continues: finished runs are kept (their logs, evaluations and metrics; not their
#   weights). A failed stage stops the study.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${STUDY_DIR:-target/marlhf-study}; TASK=${TASK:-quickstart}; SEEDS=${SEEDS:-1 2}
BACKENDS=${BACKENDS:-magrpo iac}; BASES=${BASES:-target/anchored-study}
COMMON=${COMMON:-eval_split=0.15 keep_best=true eval_interval=12 eval_num_samples=16 eval_samples_per_item=4}
read -ra COMMON_ARGS <<< "$COMMON"
read -ra FIT_ARGS <<< "${FIT:-}"
read -ra TRAIN_ARGS <<< "${TRAIN:-}"
. scripts/study/study-common.sh
for seed in $SEEDS; do
  s=$DIR/$TASK/seed$seed; mkdir -p "$s"
  args=(--config "configs/$TASK.toml" seed="$seed" "${COMMON_ARGS[@]}")
  if [ ! -d "$s/base/preference_replay" ]; then
    rm -rf "$s/base"
    from=$BASES/$TASK/seed$seed
    if [ -d "$from/base/preference_replay" ] && [ -f "$from/eval0.log" ]; then
      cp -r "$from/base" "$s/base"; cp "$from/eval0.log" "$from/collect.log" "$s/"
      echo "$TASK $seed base from $from 0" >> "$DIR/times"
    else
      t=$(timed "$s/eval0.log" "$PBRL" eval "${args[@]}" --run-dir "$s/base"); echo "$TASK $seed base eval $t" >> "$DIR/times"
      t=$(timed "$s/collect.log" "$PBRL" collect "${args[@]}" --run-dir "$s/base"); echo "$TASK $seed base collect $t" >> "$DIR/times"
    fi
  fi
  if [ ! -f "$s/base/reward_model/reward_model.json" ]; then
    t=$(timed "$s/fit_rm.log" "$PBRL" fit-rm "${args[@]}" --run-dir "$s/base" "${FIT_ARGS[@]}"); echo "$TASK $seed fit-rm $t" >> "$DIR/times"
  fi
  for backend in $BACKENDS; do
    d=$s/$backend
    [ -f "$d/done" ] && continue
    rm -rf "$d"; cp -r "$s/base" "$d"; rm -rf "$d/eval"
    o=(rl_algorithm="$backend" "${TRAIN_ARGS[@]}")
    t=$(timed "$d/train.log" "$PBRL" train-marlhf "${args[@]}" --run-dir "$d" "${o[@]}"); echo "$TASK $seed $backend train $t" >> "$DIR/times"
    t=$(timed "$d/eval.log" "$PBRL" eval "${args[@]}" --run-dir "$d" "${o[@]}"); echo "$TASK $seed $backend eval $t" >> "$DIR/times"
    if [ -d "$d/final_agents" ]; then
      t=$(timed "$d/eval_final.log" "$PBRL" eval "${args[@]}" --run-dir "$d" "${o[@]}" --team "$d/final_agents")
    fi
    # the evaluations are kept; the weights (several GB a run) are not
    find "$d" -name '*.safetensors' -delete; rm -rf "$d/checkpoints" "$d/marlhf_training/checkpoints"
    touch "$d/done"
  done
done
python3 scripts/study/study_summary.py "$DIR" | tee "$DIR/summary.md"
