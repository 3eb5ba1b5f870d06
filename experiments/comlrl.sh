#!/usr/bin/env bash
# pbrl against CoMLRL 1.4.3 on the quickstart task under one protocol (docs/results.md,
# "Against CoMLRL"): for each seed, each side trains a team from the base agents, timed; then
# `pbrl eval` scores the base team and every trained team on the 48 eval prompts x 4 samples
# with the same seed, and experiments/comlrl/summary.py prints the paired gains, the differences
# between sides and the times. Sides (SIDES):
#   pbrl            configs/quickstart.toml as shipped (collect + train-madpo)
#   pbrl-reference  pbrl with the reference's MADPO: reference-free, beta 0.1, a constant rate,
#                   the reference's scorer, no keep-best, every train item
#   comlrl          CoMLRL's MADPOTrainer, its own collection and training
#                   (experiments/comlrl/train_comlrl.py; it writes the pairs it collected)
#   pbrl-on-comlrl  pbrl-reference's training on the pairs side comlrl collected (run it after comlrl)
#   comlrl-on-pbrl  CoMLRL's training on the round side pbrl-reference collected (run it after that)
# Where keep-best saved other agents than the last, the final agents are evaluated too.
#   DIR (default runs/comlrl)  SEEDS="6 7 8"  THREADS=1  SIDES="pbrl comlrl pbrl-on-comlrl"
#   VENV=.venv-bench (torch, transformers, gguf, datasets, comlrl 1.4.3; scripts/bench.sh makes it)
# A step whose output exists is skipped, so a cut experiment resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${DIR:-runs/comlrl}; SEEDS=${SEEDS:-6 7 8}; T=${THREADS:-1}; SIDES=${SIDES:-pbrl comlrl pbrl-on-comlrl}
VENV=${VENV:-.venv-bench}
scripts/fetch-model.sh
cargo build --release --quiet
mkdir -p "$DIR/logs"
cmp -s target/release/pbrl "$DIR/pbrl" || cp target/release/pbrl "$DIR/pbrl"
PBRL=$DIR/pbrl
timed() { # timed LOG COMMAND...: run it with its output in LOG, print its wall seconds
  local log=$1; shift
  local start=$SECONDS
  "$@" > "$log" 2>&1 || { echo "failed: $* (see $log)" >&2; return 1; }
  echo $((SECONDS - start))
}
evaluate() { # evaluate RUN TEAM REPORT: pbrl eval of TEAM, its report copied to RUN/REPORT.json
  local run=$1 team=$2 name=$3
  [ -f "$run/$name.json" ] && return
  mkdir -p "$run/$name"
  t=$(timed "$DIR/logs/$(basename "$run").$name.log" "$PBRL" eval "${cfg[@]}" --run-dir "$run/$name" --team "$team")
  echo "$(basename "$run") eval $t" >> "$DIR/times"
  cp "$(ls "$run/$name"/eval/*.json | tail -1)" "$run/$name.json"
}
reference=(madpo_reference=false dpo_beta=0.1 lr_scheduler_type=\"constant\" score_last_token=false
  keep_best=false eval_split=\"eval_file\" eval_interval=0)
for s in $SEEDS; do
  cfg=(--config configs/quickstart.toml --threads "$T" seed="$s")
  base=$DIR/base-s$s
  if ! ls "$base"/eval/*.json > /dev/null 2>&1; then
    t=$(timed "$DIR/logs/base-s$s.log" "$PBRL" eval "${cfg[@]}" --run-dir "$base" --team base)
    echo "base-s$s eval $t" >> "$DIR/times"
  fi
  for side in $SIDES; do
    run=$DIR/$side-s$s
    if [ ! -f "$run/agents/team.json" ]; then
      rm -rf "$run"
      case $side in
        pbrl|pbrl-reference|pbrl-on-comlrl)
          extra=(); [ "$side" = pbrl ] || extra=("${reference[@]}")
          if [ "$side" = pbrl-on-comlrl ]; then
            "$VENV/bin/python" experiments/comlrl/pairs_to_round.py "$DIR/comlrl-s$s/pairs.json" \
              "$run/preference_replay/iteration_0001.json" > "$DIR/logs/$side-s$s.round.log" 2>&1
          else
            t=$(timed "$DIR/logs/$side-s$s.collect.log" "$PBRL" collect "${cfg[@]}" --run-dir "$run" "${extra[@]}")
            echo "$side-s$s collect $t" >> "$DIR/times"
          fi
          t=$(timed "$DIR/logs/$side-s$s.train.log" "$PBRL" train-madpo "${cfg[@]}" --run-dir "$run" "${extra[@]}")
          echo "$side-s$s train $t" >> "$DIR/times" ;;
        comlrl|comlrl-on-pbrl)
          pairs=()
          if [ "$side" = comlrl-on-pbrl ]; then
            round=$DIR/pbrl-reference-s$s/preference_replay/iteration_0001.json
            [ -f "$round" ] || { echo "comlrl-on-pbrl-s$s needs side pbrl-reference first" >&2; exit 2; }
            pairs=(--pairs "$round")
          fi
          t=$(timed "$DIR/logs/$side-s$s.log" "$VENV/bin/python" experiments/comlrl/train_comlrl.py --out "$run" \
            --seed "$s" --threads "$T" "${pairs[@]}")
          echo "$side-s$s collect+train $t" >> "$DIR/times" ;;
        *) echo "unknown side $side" >&2; exit 2 ;;
      esac
    fi
    evaluate "$run" "$run/agents" after
    if [ -d "$run/final_agents" ]; then evaluate "$run" "$run/final_agents" final-after; fi
  done
done
python3 experiments/comlrl/summary.py "$DIR"
