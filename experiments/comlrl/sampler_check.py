"""The base team's samples from transformers' `generate`, as CoMLRL draws them, against pbrl's
sampler on the same prompts (do the two samplers give the base team the same reward?).

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
import os
import random
import sys
import time
import tomllib
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarize_runs import mean_se, paired  # noqa: E402


def draw(a):
    import torch
    from bench_comlrl import ROOT, length_ratio, quickstart_team
    from train_comlrl import madpo_trainer

    torch.set_num_threads(a.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    qs = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())
    limits = qs["max_new_tokens"]
    tok, agents, formatter = quickstart_team()
    lines = (ROOT / qs["task"]["train_file"]).read_text().splitlines()
    items = [json.loads(l) for l in lines[: a.items]]
    trainer = madpo_trainer(qs, tok, agents, formatter, items, num_train_epochs=1)
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
    """Per item (keyed as summarize_runs.per_prompt keys it): the mean reward and each agent's mean
    characters; and each agent's share of finished answers over all rows (None when the report
    does not record it, as pbrl's eval reports do not)."""
    rows = json.loads(Path(path).read_text())["items"]
    groups = defaultdict(list)
    for r in rows:
        groups[json.dumps(r["item"], sort_keys=True)].append(r)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    reward = {k: mean([r["reward"] for r in g]) for k, g in groups.items()}
    chars = [{k: mean([len(r["completions"][i]) for r in g]) for k, g in groups.items()} for i in range(2)]
    finished = [mean([bool(r["finished"][i]) for r in rows]) if "finished" in rows[0] else None for i in range(2)]
    return reward, chars, finished


def compare(hf_path, pbrl_path):
    (hf_r, hf_c, hf_f), (pb_r, pb_c, pb_f) = by_item(hf_path), by_item(pbrl_path)
    common = [k for k in hf_r if k in pb_r]
    if not common:
        sys.exit("no item in common: were both drawn on the same train items?")
    only = lambda d: {k: d[k] for k in common}  # noqa: E731
    for name, r, c, f in (("hf", hf_r, hf_c, hf_f), ("pbrl", pb_r, pb_c, pb_f)):
        m, se = mean_se([r[k] for k in common])
        line = f"{name:5} reward {m:.3f} +/- {se:.3f}"
        for i in range(2):
            line += f"  agent {i}: {mean_se([c[i][k] for k in common])[0]:.0f} chars"
            if f[i] is not None:
                line += f", {f[i]:.2f} finished"
        print(line)
    for what, h, p in (("reward", hf_r, pb_r), ("agent 0 chars", hf_c[0], pb_c[0]),
                       ("agent 1 chars", hf_c[1], pb_c[1])):
        m, se = paired(only(p), h)
        print(f"hf - pbrl {what}, paired by item over {len(common)} items: {m:+.3f} +/- {se:.3f}")


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
