#!/usr/bin/env bash
# The MADPO proof-of-learning study on configs/quickstart.toml (docs/madpo-study.md):
# per seed, one base eval and one collection, then train-madpo for every score_last_token,
# learning rate and dpo_beta of the grid, each on a copy of that run directory, each followed by
# an eval.
#   STUDY_DIR (default target/madpo-study), SEEDS (default "42 7"), SLTS (default "false true"),
#   LRS (default "5e-6 1e-5"), BETAS (default: the config's), EXTRA (overrides for every stage,
#   e.g. "preference_num_candidates=8"), PBRL_THREADS (default: the physical cores).
#   The second table of docs/madpo-study.md: SLTS=false LRS="5e-6 3e-6" BETAS="0.1 0.03 0.01"
#   EXTRA=preference_num_candidates=8. Prints a table at the end (also summary.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${STUDY_DIR:-target/madpo-study}; SEEDS=${SEEDS:-42 7}; LRS=${LRS:-5e-6 1e-5}
SLTS=${SLTS:-false true}; BETAS=${BETAS:-config}; read -ra EXTRA <<< "${EXTRA:-}"
. scripts/study/study-common.sh
for seed in $SEEDS; do
  s=$DIR/seed$seed; rm -rf "$s"; mkdir -p "$s"
  args=(--config configs/quickstart.toml seed="$seed" "${EXTRA[@]}")
  echo "seed $seed eval $(timed "$s/eval0.log" "$PBRL" eval "${args[@]}" --run-dir "$s/base")" >> "$DIR/times"
  echo "seed $seed collect $(timed "$s/collect.log" "$PBRL" collect "${args[@]}" --run-dir "$s/base")" >> "$DIR/times"
  for slt in $SLTS; do
    for lr in $LRS; do
      for beta in $BETAS; do
        d=$s/slt${slt}_lr${lr}_b$beta; cp -r "$s/base" "$d"
        b=(); [ "$beta" = config ] || b=(dpo_beta="$beta")
        t=$(timed "$d.train.log" "$PBRL" train-madpo "${args[@]}" --run-dir "$d" score_last_token=$slt agent_learning_rate="$lr" "${b[@]}")
        echo "seed $seed slt $slt lr $lr beta $beta train $t" >> "$DIR/times"
        t=$(timed "$d.eval.log" "$PBRL" eval "${args[@]}" --run-dir "$d")
        echo "seed $seed slt $slt lr $lr beta $beta eval $t" >> "$DIR/times"
      done
    done
  done
done

python3 - "$DIR" <<'PY' | tee "$DIR/summary.md"
import glob, json, sys
from pathlib import Path
d = Path(sys.argv[1])
def reward(log):
    return next(float(l.split()[1]) for l in open(log) if l.startswith("eval/turn_1/reward_mean"))
def lengths(run):
    rep = json.load(open(sorted(glob.glob(f"{run}/eval/*.json"))[-1]))
    n = len(rep["items"])
    return [sum(len(it["completions"][a]) for it in rep["items"]) / n for a in range(2)]
times = {}
for line in open(d / "times"):
    w = line.split()
    times[tuple(w[:-1])] = int(w[-1])
print("| seed | score_last_token | lr | dpo_beta | eval before | eval after | brief / detailed chars (after) | collect s | train s |")
print("|---|---|---|---|---|---|---|---|---|")
for s in sorted(d.glob("seed*")):
    seed = s.name[4:]
    before = reward(s / "eval0.log")
    b_len = lengths(s / "base")
    print(f"| {seed} | (base) | | | {before:.3f} | | {b_len[0]:.0f} / {b_len[1]:.0f} | {times[('seed', seed, 'collect')]} | |")
    for run in sorted(p for p in s.iterdir() if p.is_dir() and p.name.startswith("slt")):
        slt, rest = run.name[3:].split("_lr")
        lr, beta = rest.split("_b")
        after = reward(f"{run}.eval.log")
        a_len = lengths(run)
        t = times[("seed", seed, "slt", slt, "lr", lr, "beta", beta, "train")]
        print(f"| {seed} | {slt} | {lr} | {beta} | {before:.3f} | {after:.3f} | {a_len[0]:.0f} / {a_len[1]:.0f} | | {t} |")
PY
