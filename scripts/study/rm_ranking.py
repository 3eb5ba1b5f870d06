#!/usr/bin/env python3
"""Does a reward model rank fresh samples of one prompt as the task reward does?

MAGRPO's advantages compare the `num_generations` joint responses of one item, so what RL on a
reward model reads is its ranking *within* a prompt, not the held-out accuracy `fit-rm`
reports (on the round's pairs, chosen for the largest reward gaps). This scores every sample
of a `pbrl eval` report (several samples per prompt: `eval_samples_per_item`) with the reward
model and prints the within-prompt concordance: over pairs of samples of one prompt whose task
rewards differ, the share the reward model orders the same way (0.5 = chance).

  python3 scripts/study/rm_ranking.py RUN_DIR/eval/eval-….json RUN_DIR/reward_model
Needs torch, transformers and safetensors (as scripts/score_reward_model.py, which it uses).
"""
import itertools
import json
import subprocess
import sys
from pathlib import Path


def joint_text(fmt, prompts, completions):
    # the joint text as the reward model's reward_model.json describes it (agents from 1)
    parts = [fmt["header"]]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        parts += [fmt["agent_prompt"].format(i=i + 1, prompt=p),
                  fmt["agent_response"].format(i=i + 1, response=c)]
    return fmt["separator"].join(parts)


def main():
    report, rm = sys.argv[1], sys.argv[2]
    items = json.load(open(report))["items"]
    fmt = json.load(open(Path(rm) / "reward_model.json"))["joint_text"]
    texts = [joint_text(fmt, it["prompts"], it["completions"]) for it in items]
    scorer = Path(__file__).resolve().parents[1] / "score_reward_model.py"
    out = subprocess.run([sys.executable, str(scorer), rm], input=json.dumps(texts),
                         capture_output=True, text=True, check=True)
    scores = json.loads(out.stdout)
    groups = {}
    for it, s in zip(items, scores):
        groups.setdefault(json.dumps(it["item"], sort_keys=True), []).append((s, it["reward"]))
    agree = total = 0
    for samples in groups.values():
        for (s1, r1), (s2, r2) in itertools.combinations(samples, 2):
            if abs(r1 - r2) > 1e-9:
                total += 1
                agree += (s1 - s2) * (r1 - r2) > 0
    share = agree / total if total else float("nan")
    print(json.dumps({"report": report, "samples": len(items), "prompts": len(groups),
                      "pairs_with_different_reward": total, "concordant": agree,
                      "within_prompt_concordance": round(share, 4)}))


if __name__ == "__main__":
    main()
