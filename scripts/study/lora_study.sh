#!/usr/bin/env bash
# LoRA agents against full fine-tuning on the quickstart (docs/lora-study.md): per seed, the
# shipped config's base eval and round (`collect`: fresh adapters leave the base's logits as
# they are, so the round is the full agents' round), then `train-madpo` twice on copies of that
# run directory, full and LoRA (rank R, alpha 2R, all projections, the LoRA learning rate LR),
# each followed by `eval` of the saved agents. 1 thread per job; run seeds as parallel jobs.
#   scripts/study/lora_study.sh SEED [LR]      (default LR 1e-4; R, default 16; BASE_DTYPE,
#                                               default f32; COMPUTE, the base's compute_dtype,
#                                               default f32; DIR, default /tmp/lora-study)
# VARIANTS="lora" trains the LoRA agents only: pair them with full fine-tunes trained on the same
# round elsewhere by placing that run (or a link to it) at DIR/full-sSEED and its base run, with
# the round and the base evaluation, at DIR/base-sSEED.
# The LoRA run is DIR/lora-lrLR-sSEED, with -rR after "lora" for a rank other than 16 and
# -BASE_DTYPE for a base other than f32 and -cCOMPUTE for bf16 products (lora-r8-bf16-cbf16-lr1e-4-s1). Then:
#   python3 scripts/study/lora_summary.py DIR [NAME]   (NAME: the run's name without -sSEED)
set -euo pipefail
cd "$(dirname "$0")/../.."
SEED=$1; LR=${2:-1e-4}; R=${R:-16}; BASE_DTYPE=${BASE_DTYPE:-f32}; COMPUTE=${COMPUTE:-f32}
DIR=${DIR:-/tmp/lora-study}
source scripts/study/study-common.sh
run() { # run NAME STAGE ARGS...
  local name=$1 d=$DIR/$1 stage=$2; shift 2
  echo "$name $stage $(timed "$DIR/$name.$stage.log" nice "$PBRL" "$stage" --config configs/quickstart.toml \
    --threads 1 --run-dir "$d" seed="$SEED" "$@")" >> "$DIR/times"
}
base=base-s$SEED
[ -f "$DIR/$base/preference_replay/iteration_0001.json" ] || { run $base eval; run $base collect; }
lora=(agent_lora.r="$R" agent_lora.alpha=$((2 * R)) agent_lora.base_dtype="$BASE_DTYPE" agent_learning_rate="$LR")
lora_name=lora; [ "$R" = 16 ] || lora_name+=-r$R; [ "$BASE_DTYPE" = f32 ] || lora_name+=-$BASE_DTYPE
if [ "$COMPUTE" != f32 ]; then lora+=(agent_lora.compute_dtype="$COMPUTE"); lora_name+=-c$COMPUTE; fi
lora_name+=-lr$LR-s$SEED
for variant in ${VARIANTS:-full lora}; do
  d=$variant-s$SEED; [ $variant = lora ] && d=$lora_name
  rm -rf "${DIR:?}/$d"; mkdir -p "$DIR/$d"
  cp -r "$DIR/$base/preference_replay" "$DIR/$base/eval" "$DIR/$d/"
  extra=(); [ $variant = lora ] && extra=("${lora[@]}")
  run "$d" train-madpo "${extra[@]}"
  run "$d" eval "${extra[@]}"
  # Where keep-best saved earlier agents than the last, the last too (final − saved on the eval
  # prompts: the overshoot check the saved agents were not chosen on), in a run directory of its
  # own so that the run's last report stays the saved agents'.
  if [ -d "$DIR/$d/final_agents" ]; then
    run "$d/final-after" eval "${extra[@]}" --team "$DIR/$d/final_agents"
  fi
done
