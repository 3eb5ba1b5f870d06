#!/usr/bin/env bash
# pbrl against CoMLRL 1.4.3 on the quickstart task, one protocol for both (docs/benchmarks.md,
# "Like for like"): for each seed, pbrl's main job (collect + train-madpo, configs/quickstart.toml)
# and CoMLRL's MADPOTrainer (scripts/study/comlrl_quickstart.py) each train a team from the base
# agents, timed; then `pbrl eval` scores the base team and both trained teams on the 48 eval
# prompts x 4 samples with the same seed, and scripts/study/like_for_like.py prints the paired
# gains (per prompt, after minus before) with their standard errors and the times. A third side,
# `pbrlref`, is pbrl running the reference's own MADPO (reference-free, beta 0.1, a constant
# rate, the reference's scorer, no keep-best, all train items): the same algorithm as CoMLRL's,
# in pbrl. A fourth, `pbrlval`, is `pbrlref` with keep-best on a validation file
# (data/length_ratio/validation.jsonl, 16 prompts that are neither trained on nor evaluated by
# `pbrl eval`), every 12 updates, and
# `pbrlvallast` is `pbrlval` scoring every response token and its end-of-turn
# (score_last_token = true; the reference's scorer leaves the last two out). The
# side `comlrl` runs CoMLRL with the reference's scorer on SmolLM2 (completions cut at the
# end-of-turn, pbrl's score_last_token = false), `comlrlharness` with the one sessions 22-27 ran
# (the last content token scored; `comlrl_quickstart.py --scorer`). `pbrloncomlrl` is `pbrlref`
# trained on the pairs side `comlrl` collected (its `pairs.json`, converted by
# comlrl_pairs_to_round.py; run it after `comlrl`): the same data, pbrl's training loop;
# `comlrlonpbrl` is CoMLRL trained on the round side `pbrlref` (`pbrlval`, `pbrlvallast`)
# collected. Where keep-best saved earlier agents than the last, the last (`final_agents`) are
# evaluated too: like_for_like.py reports them as the side `<side>final` (the saved agents where
# they were the last). `pbrlvallin` is `pbrlvallast` with the rate decayed linearly to 0 (the
# quickstart's schedule), for training that holds its gain with the last token scored.
# ROUND_FROM=SIDE trains a pbrl side on the round SIDE collected for the same seed instead of
# collecting again (collection reads neither the scorer nor the schedule, so it is the same round).
#   DIR=study dir (default runs/like-for-like)  SEEDS="1 2 3"  THREADS=1  SIDES="pbrl comlrl"
#   VENV=.venv-bench (torch, transformers, gguf, datasets, comlrl 1.4.3; scripts/bench.sh makes it)
# A step whose output exists is skipped, so a cut study resumes where it stopped.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${DIR:-runs/like-for-like}; SEEDS=${SEEDS:-1 2 3}; T=${THREADS:-1}; SIDES=${SIDES:-pbrl comlrl}
ROUND_FROM=${ROUND_FROM:-}
VENV=${VENV:-.venv-bench}
source scripts/study/study-common.sh
mkdir -p "$DIR/logs"
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
      if [ "${side#comlrl}" = "$side" ]; then
        reference=(madpo_reference=false dpo_beta=0.1 lr_scheduler_type=\"constant\" score_last_token=false)
        # keep-best on the validation file; a later KEY=VALUE overrides an earlier one
        validation=("${reference[@]}" eval_split=\"validation_file\"
          task.validation_file=\"data/length_ratio/validation.jsonl\")
        case $side in
          pbrl) extra=() ;;
          pbrlref|pbrloncomlrl) extra=("${reference[@]}" keep_best=false eval_split=\"eval_file\" eval_interval=0) ;;
          pbrlval) extra=("${validation[@]}") ;;
          pbrlvallast) extra=("${validation[@]}" score_last_token=true) ;;
          pbrlvallin) extra=("${validation[@]}" score_last_token=true lr_scheduler_type=\"linear\") ;;
          *) echo "unknown side $side" >&2; exit 2 ;;
        esac
        if [ "$side" = pbrloncomlrl ]; then
          "$VENV/bin/python" scripts/study/comlrl_pairs_to_round.py "$DIR/comlrl-s$s/pairs.json" \
            "$run/preference_replay/iteration_0001.json" > "$DIR/logs/$side-s$s.round.log" 2>&1
        elif [ -n "$ROUND_FROM" ]; then
          round=$DIR/$ROUND_FROM-s$s/preference_replay/iteration_0001.json
          [ -f "$round" ] || { echo "ROUND_FROM=$ROUND_FROM: no $round" >&2; exit 2; }
          mkdir -p "$run/preference_replay" && cp "$round" "$run/preference_replay/"
        else
          t=$(timed "$DIR/logs/$side-s$s.collect.log" "$PBRL" collect "${cfg[@]}" --run-dir "$run" "${extra[@]}")
          echo "$side-s$s collect $t" >> "$DIR/times"
        fi
        t=$(timed "$DIR/logs/$side-s$s.train.log" "$PBRL" train-madpo "${cfg[@]}" --run-dir "$run" "${extra[@]}")
        echo "$side-s$s train $t" >> "$DIR/times"
      else
        scorer=reference; [ "$side" = comlrlharness ] && scorer=harness
        pairs=()
        if [ "$side" = comlrlonpbrl ]; then
          # pbrl's collection does not depend on the training settings: these sides' rounds are one.
          round=$(ls "$DIR"/pbrl{ref,val,vallast}-s$s/preference_replay/iteration_0001.json 2>/dev/null | head -1 || true)
          [ -n "$round" ] || { echo "comlrlonpbrl-s$s needs side pbrlref, pbrlval or pbrlvallast first" >&2; exit 2; }
          pairs=(--pairs "$round")
        fi
        t=$(timed "$DIR/logs/$side-s$s.log" "$VENV/bin/python" scripts/study/comlrl_quickstart.py --out "$run" --seed "$s" \
          --threads "$T" --scorer $scorer "${pairs[@]}")
        echo "$side-s$s collect+train $t" >> "$DIR/times"
      fi
    fi
    if [ ! -f "$run/after.json" ]; then
      mkdir -p "$run/after"
      t=$(timed "$DIR/logs/$side-s$s.eval.log" "$PBRL" eval "${cfg[@]}" --run-dir "$run/after" --team "$run/agents")
      echo "$side-s$s eval $t" >> "$DIR/times"
      cp "$(ls "$run"/after/eval/*.json | tail -1)" "$run/after.json"
    fi
    # When keep-best saved earlier agents, pbrl's final ones too (CoMLRL saves its final agents).
    if [ -d "$run/final_agents" ] && [ ! -f "$run/final-after.json" ]; then
      mkdir -p "$run/final-after"
      t=$(timed "$DIR/logs/$side-s$s.final-eval.log" "$PBRL" eval "${cfg[@]}" --run-dir "$run/final-after" \
        --team "$run/final_agents")
      echo "$side-s$s eval $t" >> "$DIR/times"
      cp "$(ls "$run"/final-after/eval/*.json | tail -1)" "$run/final-after.json"
    fi
  done
done
python3 scripts/study/like_for_like.py "$DIR"
