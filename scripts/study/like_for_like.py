"""Summarize scripts/study/like_for_like.sh: per side and seed, the eval reward of the base team
and of the trained team, the paired gain (per-prompt mean after minus before) with its standard
error over prompts, and the training time (collection + training, evaluations excluded); per
side, the mean gain over seeds with its standard error over seeds; for every two sides (pbrl's
final agents as the side `<side>final`), their
difference on the seeds both ran, paired by prompt (the two trained teams' evaluations start from
the same base), and its mean over those seeds.
Usage: python3 scripts/study/like_for_like.py STUDY_DIR"""
import glob
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


def main(study):
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
        diffs = [now[k] - before[k] for k in before]
        g, se = mean_se(diffs)
        gains[side].append(g)
        b = sum(before.values()) / len(before)
        print(f"{side:7} seed {seed}: {b:.3f} -> {b + g:.3f}, gain {g:+.3f} +/- {se:.3f} "
              f"({len(diffs)} prompts), train {times[after.parent.name]:.0f} s, answers {[round(c) for c in chars]} chars")
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
    main(Path(sys.argv[1]))
