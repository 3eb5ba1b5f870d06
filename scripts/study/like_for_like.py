"""Summarize scripts/study/like_for_like.sh: per side and seed, the eval reward of the base team
and of the trained team, the paired gain (per-prompt mean after minus before) with its standard
error over prompts, and the training time (collection + training, evaluations excluded); per
side, the mean gain over seeds with its standard error over seeds; for every two sides their
difference on the seeds both ran, paired by prompt (the two trained teams' evaluations start from
the same base), and its mean over those seeds. pbrl's final agents are the side `<side>final`;
with `--keep-best-tolerance T`, the side `<side>tol` holds, per run with keep-best, the agents
pbrl's `keep_best_tolerance = T` saves (`src/train/summary.rs`, `keeps_best`): the final ones
unless their last periodic evaluation fell more than T standard errors below the best one.
Usage: python3 scripts/study/like_for_like.py STUDY_DIR [--keep-best-tolerance T]"""
import glob
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_summary import per_prompt  # noqa: E402


def mean_se(xs):
    m = sum(xs) / len(xs)
    se = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) if len(xs) > 1 else float("nan")
    return m, se


def report_gain(side, seed, before, now, chars, gains, note):
    diffs = [now[k] - before[k] for k in before]
    g, se = mean_se(diffs)
    gains[side].append(g)
    b = sum(before.values()) / len(before)
    print(f"{side:7} seed {seed}: {b:.3f} -> {b + g:.3f}, gain {g:+.3f} +/- {se:.3f} "
          f"({len(diffs)} prompts), {note}, answers {[round(c) for c in chars]} chars")


def keeps_best(summary, tolerance):
    """pbrl's rule (`keeps_best`): the best evaluation's agents replace the final ones only when
    the final evaluation is below the best by more than `tolerance` of the best's standard errors."""
    best, last = summary["best_eval"], summary["final_eval"]
    return best["update"] != last["update"] and last["reward_mean"] < best["reward_mean"] - tolerance * best["reward_stderr"]


def main(study, tolerance=None):
    times = defaultdict(float)
    for line in open(study / "times"):
        run, step, secs = line.split()
        if step != "eval":
            times[run] += float(secs)
    gains = defaultdict(list)
    afters = defaultdict(dict)  # side -> seed -> per-prompt reward of the trained team
    for after in sorted(study.glob("*-s*/after.json")):
        side, seed = after.parent.name.rsplit("-s", 1)
        base_reports = sorted(glob.glob(str(study / f"base-s{seed}" / "eval" / "*.json")))
        if not base_reports:
            continue
        before, _ = per_prompt(base_reports[0])
        now, chars = per_prompt(after)
        afters[side][seed] = now
        if (after.parent / "training_summary.json").is_file():
            # pbrl's final agents: evaluated apart when keep-best saved others (`final_agents`).
            final = after.parent / "final-after.json"
            if final.is_file() or not (after.parent / "final_agents").is_dir():
                afters[side + "final"][seed] = per_prompt(final if final.is_file() else after)[0]
                summary = json.loads((after.parent / "training_summary.json").read_text())
                if tolerance is not None and summary.get("best_eval") and summary.get("final_eval"):
                    # Without final-after.json the saved agents were the final ones.
                    best = final.is_file() and keeps_best(summary, tolerance)
                    kept = after if best or not final.is_file() else final
                    afters[side + "tol"][seed], tol_chars = per_prompt(kept)
                    report_gain(side + "tol", seed, before, afters[side + "tol"][seed], tol_chars, gains,
                                f"saved {'best' if best else 'final'} at tolerance {tolerance}")
        report_gain(side, seed, before, now, chars, gains, f"train {times[after.parent.name]:.0f} s")
    for side, gs in gains.items():
        m, se = mean_se(gs)
        print(f"{side:7} mean gain over {len(gs)} seeds: {m:+.3f} +/- {se:.3f}")
    sides = sorted(afters)
    for i, a in enumerate(sides):
        for b in sides[i + 1:]:
            seeds = sorted(set(afters[a]) & set(afters[b]), key=int)
            if not seeds:
                continue
            per_seed = []
            for seed in seeds:
                d = [afters[a][seed][k] - afters[b][seed][k] for k in afters[a][seed]]
                m, se = mean_se(d)
                per_seed.append(m)
                print(f"{a} - {b}, seed {seed}: {m:+.3f} +/- {se:.3f} (paired by prompt)")
            m, se = mean_se(per_seed)
            print(f"{a} - {b}, mean over {len(seeds)} seeds: {m:+.3f} +/- {se:.3f}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--keep-best-tolerance"):
        sys.exit(__doc__)
    main(Path(args[0]), float(args[2]) if len(args) == 3 else None)
