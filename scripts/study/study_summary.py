"""Summarize scripts/study/anchored_study.sh (or scripts/study/marlhf_study.sh): per run, the eval reward before and after and the paired
gain (per-prompt mean after minus before) with its standard error over prompts; per task and
variant, the mean gain over seeds with its standard error over seeds and the seeds that gained; the keep-best choice; the brief agent's answer length.
Usage: python3 scripts/study/study_summary.py STUDY_DIR"""
import json
import math
import re
import sys
from collections import defaultdict
from pathlib import Path


def per_prompt(report):
    """Per-prompt mean reward of an eval report, and each role's mean answer length."""
    items = json.load(open(report))["items"]
    by = defaultdict(list)
    chars = defaultdict(list)
    for k, it in enumerate(items):
        by[json.dumps(it["item"], sort_keys=True)].append(it["reward"])
        for a, c in enumerate(it["completions"]):
            chars[a].append(len(c))
    means = {k: sum(v) / len(v) for k, v in by.items()}
    return means, [sum(v) / len(v) for _, v in sorted(chars.items())]


def report_of(log):
    """The eval report a log names; a study directory that was moved still finds its reports
    (the run directory is the log's own, or `base/` for the base evaluation)."""
    for line in open(log):
        if line.startswith("report: "):
            path = Path(line.split("report: ", 1)[1].strip())
            if path.exists():
                return path
            for run in [log.parent, log.parent / "base"]:
                if (run / "eval" / path.name).exists():
                    return run / "eval" / path.name
            raise SystemExit(f"{log}: the report {path} is missing")
    raise SystemExit(f"{log}: no report line")


def mean_se(xs):
    """The mean of `xs` and its standard error."""
    n = len(xs)
    m = sum(xs) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1)) if n > 1 else 0.0
    return m, sd / math.sqrt(n)


def paired(before, after):
    return mean_se([after[k] - before[k] for k in before])


def main():
    root = Path(sys.argv[1])
    times = {}
    if (root / "times").exists():
        for line in open(root / "times"):
            w = line.split()
            times[tuple(w[:-1])] = int(w[-1])
    rows, agg = [], defaultdict(list)
    for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for seed_dir in sorted(task_dir.glob("seed*")):
            seed = seed_dir.name[4:]
            if not (seed_dir / "eval0.log").exists():
                continue
            before, b_chars = per_prompt(report_of(seed_dir / "eval0.log"))
            b_mean = sum(before.values()) / len(before)
            for run in sorted(p for p in seed_dir.iterdir() if p.is_dir() and p.name != "base"):
                if not (run / "done").exists():
                    continue
                after, a_chars = per_prompt(report_of(run / "eval.log"))
                gain, se = paired(before, after)
                # train-madpo's summary is in the run directory, train-marlhf's in marlhf_training/
                found = [p for p in [run / "training_summary.json", run / "marlhf_training" / "training_summary.json"]
                         if p.exists()]
                summary = json.load(open(found[0]))
                final = None
                if (run / "eval_final.log").exists():
                    f_after, _ = per_prompt(report_of(run / "eval_final.log"))
                    final = paired(before, f_after)
                else:
                    final = (gain, se)  # the final agents are the saved ones
                best = summary.get("best_eval") or {}
                ref = ""
                m = re.search(r"reference log-probs of \d+ pairs \(.*\) in ([\d.]+) s", open(run / "train.log").read())
                if m:
                    ref = m.group(1)
                rows.append((task_dir.name, seed, run.name, b_mean, sum(after.values()) / len(after), gain, se,
                             final[0], final[1], summary["saved"], best.get("update"), summary["updates"],
                             b_chars[0], a_chars[0], times.get((task_dir.name, seed, run.name, "train")), ref))
                agg[(task_dir.name, run.name)].append((gain, final[0]))
    print("| task | seed | variant | before | after (saved) | gain ± s.e. (saved) | gain ± s.e. (final) | saved (best update / updates) | agent 0 chars before → after | train s | reference pass s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.3f} | {r[4]:.3f} | {r[5]:+.3f} ± {r[6]:.3f} | {r[7]:+.3f} ± {r[8]:.3f} | "
              f"{r[9]} ({r[10]} / {r[11]}) | {r[12]:.0f} → {r[13]:.0f} | {r[14]} | {r[15]} |")
    print()
    print("| task | variant | seeds | mean gain ± s.e. over seeds (saved, keep-best) | mean gain ± s.e. (final agents) | seeds with a gain (saved / final) |")
    print("|---|---|---|---|---|---|")

    def over_seeds(g):
        m = sum(g) / len(g)
        se = math.sqrt(sum((x - m) ** 2 for x in g) / (len(g) - 1) / len(g)) if len(g) > 1 else float("nan")
        return f"{m:+.3f} ± {se:.3f}" if len(g) > 1 else f"{m:+.3f}"

    for (task, name), v in sorted(agg.items()):
        saved, final = [g for g, _ in v], [f for _, f in v]
        print(f"| {task} | {name} | {len(v)} | {over_seeds(saved)} | {over_seeds(final)} | "
              f"{sum(g > 0 for g in saved)} / {sum(f > 0 for f in final)} |")

if __name__ == "__main__":
    main()
