"""Summarize `pbrl iterate` runs round by round: the eval reward of each round's team (its mean
and standard error over prompts), the paired gain over the base team (per-prompt mean after
minus before, over the same prompts) with its standard error, the pairs and wins of the round,
and its wall time (collection, training, evaluation).
Usage: python3 scripts/iterate_summary.py RUN_DIR [RUN_DIR ...]
Each RUN_DIR is an iterate run directory: `iterate/round_N.json` and, in `eval/`, one report per
evaluated round in time order (round 0 = the base team)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "study"))
from study_summary import paired, per_prompt  # noqa: E402


def main():
    for run in map(Path, sys.argv[1:]):
        rounds = sorted((run / "iterate").glob("round_*.json"))
        reports = sorted((run / "eval").glob("eval-*.json"))
        print(f"## {run}\n")
        print("| round | pairs (current / comparator won) | eval reward ± s.e. | paired gain over the base ± s.e. "
              "| collect s | train s | eval s |")
        print("|---|---|---|---|---|---|---|")
        base = per_prompt(reports[0])[0] if reports else None
        for k, path in enumerate(rounds):
            r = json.load(open(path))
            gain = "—"
            if k > 0 and k < len(reports):
                m, se = paired(base, per_prompt(reports[k])[0])
                gain = f"{m:+.3f} ± {se:.3f}"
            ev = r.get("eval_reward_mean")
            ev = f"{ev:.3f} ± {r['eval_reward_stderr']:.3f}" if ev is not None else "—"
            won = f"{r['pairs']} ({r['current_wins']} / {r['comparator_wins']})" if k else "—"
            if k and r.get("items"):  # summaries written since session 28 say how many items
                won = f"{r['items']} items: {won}"
            print(f"| {r['round']} | {won} | {ev} | {gain} | {r['collect_s']:.0f} | {r['train_s']:.0f} "
                  f"| {r['eval_s']:.0f} |")
        print()


if __name__ == "__main__":
    main()
