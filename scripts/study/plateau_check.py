#!/usr/bin/env python3
"""How often a team that holds its gain perfectly still "misses" issue 30's hold-the-gain test.

The test: the final agents score within one s.e. of the best periodic keep-best evaluation, the
s.e. that of the paired difference (final − best) over the held-out prompts. On a plateau (every
evaluation from some update on has the same expected reward) the best of K noisy evaluations sits
above the final one by selection alone. This simulates K evaluations on a plateau, the final one
among them, each the mean over `--prompts` prompts of independent per-prompt noise (the prompts'
own levels cancel in the pairing), and prints how often the final one falls more than one s.e.
below the best, and how likely it is that none of `--seeds` seeds does.

    .venv-bench/bin/python scripts/study/plateau_check.py [--prompts 8] [--seeds 9]
"""
import argparse

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8, help="held-out prompts per evaluation")
    ap.add_argument("--seeds", type=int, default=9, help="seeds the test must pass on")
    ap.add_argument("--draws", type=int, default=200_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    n, p = args.draws, args.prompts
    for k in (2, 3, 4):
        noise = rng.normal(size=(n, k, p))  # (draw, evaluation, prompt)
        best = noise.mean(2).argmax(1)
        diff = noise[:, -1] - noise[np.arange(n), best]  # final − best, per prompt
        se = diff.std(1, ddof=1) / np.sqrt(p)
        miss = (best != k - 1) & (diff.mean(1) < -se)
        rate = miss.mean()
        print(
            f"{k} evaluations on the plateau: the final one below the best by more than one s.e. "
            f"in {rate:.3f} of seeds; on none of {args.seeds} seeds: {(1 - rate) ** args.seeds:.3f}; "
            f"expected misses {args.seeds * rate:.2f}"
        )


if __name__ == "__main__":
    main()
