"""Summarize experiments/comlrl.sh: per side and seed, the eval reward of the base team and of
the trained team, the paired gain (per-prompt mean after minus before) ± its standard error over
prompts, and the training time (collection + training); per side, the mean gain over seeds ±
its standard error over seeds; for every two sides their difference on the seeds both ran,
paired by prompt (both trained teams' evaluations start from the same base), and its mean over
those seeds. Where keep-best saved other agents than the last, pbrl's final agents are the side
`<side>-final`.
Usage: python3 experiments/comlrl/summary.py DIR"""
import glob
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from summarize_runs import answer_chars, mean_se, per_prompt  # noqa: E402


def main(root):
    times = defaultdict(float)
    for line in open(root / "times"):
        run, step, secs = line.split()
        if step != "eval":
            times[run] += float(secs)
    gains = defaultdict(list)
    afters = defaultdict(dict)  # side -> seed -> per-prompt reward of the trained team
    for after in sorted(root.glob("*-s*/after.json")):
        side, seed = after.parent.name.rsplit("-s", 1)
        base_reports = sorted(glob.glob(str(root / f"base-s{seed}" / "eval" / "*.json")))
        if not base_reports:
            continue
        before = per_prompt(base_reports[0])
        sides = [(side, after)]
        final = after.parent / "final-after.json"
        if final.is_file():
            sides.append((side + "-final", final))
        for name, report in sides:
            now = per_prompt(report)
            afters[name][seed] = now
            g, se = mean_se([now[k] - before[k] for k in before])
            gains[name].append(g)
            b = sum(before.values()) / len(before)
            print(f"{name} seed {seed}: {b:.3f} -> {b + g:.3f}, gain {g:+.3f} ± {se:.3f} ({len(before)} prompts), "
                  f"train {times[after.parent.name]:.0f} s, answers {[round(c) for c in answer_chars(report)]} chars")
    for side, gs in gains.items():
        m, se = mean_se(gs)
        print(f"{side} mean gain over {len(gs)} seeds: {m:+.3f} ± {se:.3f}")
    names = sorted(afters)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            seeds = sorted(set(afters[a]) & set(afters[b]), key=int)
            if not seeds:
                continue
            per_seed = []
            for seed in seeds:
                m, se = mean_se([afters[a][seed][k] - afters[b][seed][k] for k in afters[a][seed]])
                per_seed.append(m)
                print(f"{a} - {b}, seed {seed}: {m:+.3f} ± {se:.3f} (paired by prompt)")
            m, se = mean_se(per_seed)
            print(f"{a} - {b}, mean over {len(seeds)} seeds: {m:+.3f} ± {se:.3f}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
