"""Summaries of pbrl run directories, paired by prompt.

  python3 scripts/summarize_runs.py RUN_DIR [RUN_DIR ...]      e.g. one run per seed of one job

Per run: the eval reward of its first evaluation (the base team) and of its last (the trained
team), the paired gain (per prompt, after minus before) ± its standard error over prompts, and
the wall seconds of each stage (from the logs scripts/quickstart.sh writes); for an iterate run,
every round. Then the mean gain over the runs ± its standard error over runs (seeds)."""
import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def per_prompt(report):
    """Each eval prompt's mean reward in an eval report, keyed by the item."""
    by = defaultdict(list)
    for it in json.load(open(report))["items"]:
        by[json.dumps(it["item"], sort_keys=True)].append(it["reward"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def answer_chars(report):
    """Each role's mean answer length in characters in an eval report."""
    items = json.load(open(report))["items"]
    roles = len(items[0]["completions"]) if items else 0
    return [sum(len(it["completions"][a]) for it in items) / len(items) for a in range(roles)]


def mean_se(xs):
    """The mean of `xs` and its standard error (nan for one value)."""
    n = len(xs)
    m = sum(xs) / n
    se = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else float("nan")
    return m, se


def paired(before, after):
    """The mean of after − before over the prompts both have, ± its standard error."""
    if set(before) != set(after):
        raise SystemExit("the two evaluations are not on the same prompts")
    return mean_se([after[k] - before[k] for k in before])


def mean(d):
    return sum(d.values()) / len(d)


def stage_seconds(run):
    """Each stage's wall seconds, from the `== NAME` logs of scripts/quickstart.sh."""
    times = run / "logs" / "times"
    return dict(line.split() for line in open(times)) if times.exists() else {}


def summarize(run):
    reports = sorted((run / "eval").glob("eval-*.json"))
    if len(reports) < 2:
        raise SystemExit(f"{run}: needs two evaluations (before and after), found {len(reports)}")
    base = per_prompt(reports[0])
    rounds = sorted((run / "iterate").glob("round_*.json"))
    if rounds:
        for k, path in enumerate(rounds[1:], 1):
            r = json.load(open(path))
            g, se = paired(base, per_prompt(reports[k]))
            print(f"  round {r['round']}: {r['pairs']} pairs, eval {r['eval_reward_mean']:.3f}, "
                  f"gain {g:+.3f} ± {se:.3f}, {r['collect_s'] + r['train_s'] + r['eval_s']:.0f} s")
    after = per_prompt(reports[-1])
    g, se = paired(base, after)
    secs = stage_seconds(run)
    total = sum(int(v) for v in secs.values())
    print(f"{run}: {mean(base):.3f} -> {mean(after):.3f}, paired gain {g:+.3f} ± {se:.3f} "
          f"over {len(base)} prompts; {total} s ({', '.join(f'{k} {v} s' for k, v in secs.items())})")
    return g


def main():
    runs = [Path(a) for a in sys.argv[1:]]
    if not runs:
        raise SystemExit(__doc__)
    gains = [summarize(r) for r in runs]
    if len(gains) > 1:
        m, se = mean_se(gains)
        print(f"over {len(gains)} seeds: mean gain {m:+.3f} ± {se:.3f} (s.e. over seeds)")


if __name__ == "__main__":
    main()
