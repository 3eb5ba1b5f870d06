#!/usr/bin/env python3
"""Score joint texts with a reward model pbrl saved (`pbrl fit-rm` → <run_dir>/reward_model/),
in PyTorch + transformers only: what the README's snippet does, and what the tests compare
with pbrl's own scores.

  python3 scripts/score_reward_model.py RUN_DIR/reward_model < texts.json
texts.json: a JSON list of joint texts; prints a JSON list of scores.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    d = sys.argv[1]
    info = json.load(open(f"{d}/reward_model.json"))
    tok = AutoTokenizer.from_pretrained(f"{d}/backbone")
    lm = AutoModelForCausalLM.from_pretrained(f"{d}/backbone", dtype=torch.float32).eval()
    head = load_file(f"{d}/reward_head.safetensors")
    scores = []
    with torch.no_grad():
        for text in json.load(sys.stdin):
            ids = tok(text, truncation=True, max_length=info["max_length"], return_tensors="pt").input_ids
            h = lm(ids, output_hidden_states=True).hidden_states[-1][0, -1]
            scores.append((h @ head["reward_head.weight"][0] + head["reward_head.bias"][0]).item())
    print(json.dumps(scores))


if __name__ == "__main__":
    main()
