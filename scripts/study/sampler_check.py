"""The base team's samples from transformers' `generate`, as CoMLRL draws them, against pbrl's
sampler on the same prompts (issue 30: CoMLRL's collected candidates scored higher than pbrl's
on the same items; is it the sampler?).

  sampler_check.py hf --out HF.json [--items 16] [--samples 16] [--seed 1] [--threads 1]
      draws `samples` joint responses per train item with the quickstart's sampling settings,
      through CoMLRL's own generation call (`MAGRPOTrainer._generate_completions`, the
      harness's team from bench_comlrl.quickstart_team), and scores them with the task reward;
  sampler_check.py compare HF.json PBRL_EVAL.json
      PBRL_EVAL.json is `pbrl eval --team base` on the same items and samples:
        pbrl eval --config configs/quickstart.toml --team base --run-dir DIR \\
          task.eval_file='"data/length_ratio/train.jsonl"' eval_num_samples=16 eval_samples_per_item=16
      prints, per side, the mean reward and each agent's mean characters and share of finished
      answers, and hf - pbrl paired by item with its standard error over items.
"""
import argparse
import json
import math
import os
import random
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def draw(a):
    import torch
    from bench_comlrl import ROOT, length_ratio, quickstart_team
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
    from datasets import Dataset

    torch.set_num_threads(a.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    qs = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())
    limits = qs["max_new_tokens"]
    tok, agents, formatter = quickstart_team()
    lines = (ROOT / qs["task"]["train_file"]).read_text().splitlines()
    items = [json.loads(l) for l in lines[: a.items]]
    args = MADPOConfig(num_train_epochs=1, num_agents=2, max_new_tokens=max(limits),
                       temperature=qs["temperature"], top_p=qs["top_p"], top_k=qs["top_k"],
                       agent_devices=["cpu", "cpu"], eval_interval=0)
    trainer = MADPOTrainer(agents=agents, num_agents=2, tokenizer=tok, train_dataset=Dataset.from_list(items),
                           reward_func=lambda c1, c2: [length_ratio(c1[0], c2[0])],
                           formatters=[formatter(0), formatter(1)], args=args)
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
    rows = []
    start = time.perf_counter()
    for n, item in enumerate(items):
        texts, finished = [], []
        for i, agent in enumerate(trainer.agents):
            out = trainer._generate_completions(agent, [item], agent_idx=i, num_return_sequences=a.samples,
                                                max_new_tokens=limits[i])
            texts.append(out["completions"][0])
            finished.append([bool((t == end_of_turn).any()) for t in out["completion_input_ids"][0]])
        for s in range(a.samples):
            c = [texts[0][s], texts[1][s]]
            rows.append({"item": item, "sample": s, "completions": c, "finished": [finished[0][s], finished[1][s]],
                         "reward": length_ratio(c[0], c[1])})
        print(f"item {n + 1}/{len(items)} ({time.perf_counter() - start:.0f} s)", flush=True)
    Path(a.out).write_text(json.dumps({"sampler": "transformers generate (CoMLRL)", "seed": a.seed,
                                       "samples_per_item": a.samples, "items": rows}, indent=1))


def by_item(path):
    """item prompt -> (rewards, chars of each agent, finished of each agent or None)."""
    d = json.loads(Path(path).read_text())
    out = defaultdict(lambda: ([], [[], []], [[], []]))
    for r in d["items"]:
        rewards, chars, fin = out[r["item"]["prompt"]]
        rewards.append(r["reward"])
        for i in range(2):
            chars[i].append(len(r["completions"][i]))
            if "finished" in r:
                fin[i].append(bool(r["finished"][i]))
    return out


def mean_se(xs):
    m = sum(xs) / len(xs)
    var = sum((x - m) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return m, math.sqrt(var / len(xs))


def compare(hf_path, pbrl_path):
    hf, pb = by_item(hf_path), by_item(pbrl_path)
    common = [k for k in hf if k in pb]
    if not common:
        sys.exit("no item in common: were both drawn on the same train items?")
    for name, side in (("hf", hf), ("pbrl", pb)):
        r = mean_se([sum(side[k][0]) / len(side[k][0]) for k in common])
        line = f"{name:5} reward {r[0]:.3f} +/- {r[1]:.3f}"
        for i in range(2):
            c = [x for k in common for x in side[k][1][i]]
            line += f"  agent {i}: {sum(c) / len(c):.0f} chars"
            f = [x for k in common for x in side[k][2][i]]
            if f:
                line += f", {sum(f) / len(f):.2f} finished"
        print(line)
    for what, get in (("reward", lambda s, k: s[k][0]), ("agent 0 chars", lambda s, k: s[k][1][0]),
                      ("agent 1 chars", lambda s, k: s[k][1][1])):
        d = mean_se([sum(get(hf, k)) / len(get(hf, k)) - sum(get(pb, k)) / len(get(pb, k)) for k in common])
        print(f"hf - pbrl {what}, paired by item over {len(common)} items: {d[0]:+.3f} +/- {d[1]:.3f}")


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("hf")
    h.add_argument("--out", required=True)
    h.add_argument("--items", type=int, default=16)
    h.add_argument("--samples", type=int, default=16)
    h.add_argument("--seed", type=int, default=1)
    h.add_argument("--threads", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("hf")
    c.add_argument("pbrl")
    a = ap.parse_args()
    if a.cmd == "hf":
        draw(a)
    else:
        compare(a.hf, a.pbrl)


if __name__ == "__main__":
    main()
