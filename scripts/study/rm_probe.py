#!/usr/bin/env python3
"""What in a round's joint texts can rank the responses to a prompt it never saw?

A linear probe study for docs/marlhf-study.md: every distinct joint text of a round file (as
`fit-rm` writes it, agents from 1) goes once through the backbone (transformers, final hidden
states after the last norm); a pairwise logistic regression (Bradley–Terry on feature
differences, L2 1e-2, Adam, 500 steps, features standardized) is fitted on the pairs of 80% of
the items and scored on all pairs of the other 20% (a seeded shuffle of the items), for these
features: `chars` (each response's length in characters, their ratio, the text's tokens: what
the length-ratio reward reads), `last` (the hidden state at the last token: what pbrl's and the
reference's reward head sees), `mean` (the mean over all tokens), `last+mean`. Run it on a round
collected with `pair_selection=all` (every pair of candidates with different rewards), so the
held-out accuracy is the within-prompt concordance RL on a reward model needs.

  python3 scripts/study/rm_probe.py RUN/preference_replay/iteration_0001.json HF_MODEL_DIR
HF_MODEL_DIR: a transformers directory of the backbone (scripts/fixtures/smollm2_hf_dir.py writes one
for the bundled GGUF). Needs torch, transformers, numpy.
"""
import json
import random
import sys

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def joint_text(prompts, completions):
    parts = ["Joint multi-agent response"]
    for i, (p, c) in enumerate(zip(prompts, completions)):
        parts += [f"Agent {i + 1} prompt:\n{p}", f"Agent {i + 1} response:\n{c}"]
    return "\n\n".join(parts)


def probe(features, pairs, held):
    """Train and held-out accuracy of a pairwise logistic regression on `features` (text x d)."""
    x = (features - features.mean(0)) / (features.std(0) + 1e-6)
    train = [(w, l) for item, w, l in pairs if item not in held]
    test = [(w, l) for item, w, l in pairs if item in held]
    diffs = torch.tensor(np.stack([x[w] - x[l] for w, l in train]))
    weights = torch.zeros(x.shape[1], requires_grad=True)
    opt = torch.optim.Adam([weights], lr=1e-2)
    for _ in range(500):
        opt.zero_grad()
        loss = torch.nn.functional.softplus(-(diffs @ weights)).mean() + 1e-2 * (weights**2).sum()
        loss.backward()
        opt.step()
    score = x @ weights.detach().numpy()
    accuracy = lambda ps: sum(score[w] > score[l] for w, l in ps) / len(ps)
    return accuracy(train), accuracy(test), len(test)


def main():
    torch.set_num_threads(1)
    round_file, model_dir = sys.argv[1], sys.argv[2]
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    texts, pairs = {}, []  # distinct joint text -> its completions; (item, winner, loser)
    for p in json.load(open(round_file))["pairs"]:
        sides = [joint_text(p["prompts"], p[k]) for k in ("winner_completions", "loser_completions")]
        for t, k in zip(sides, ("winner_completions", "loser_completions")):
            texts.setdefault(t, p[k])
        pairs.append((json.dumps(p["prompts"]), *sides))
    index = {t: i for i, t in enumerate(texts)}
    pairs = [(item, index[w], index[l]) for item, w, l in pairs]
    feats = {"chars": [], "last": [], "mean": []}
    with torch.no_grad():
        for t, completions in texts.items():
            ids = tok(t, return_tensors="pt")
            h = model.model(**ids).last_hidden_state[0]
            feats["last"].append(h[-1].numpy())
            feats["mean"].append(h.mean(0).numpy())
            a, b = (len(c) for c in completions[:2])
            feats["chars"].append(np.array([a, b, b / max(a, 1), ids.input_ids.shape[1]], dtype=np.float32))
    feats = {k: np.stack(v) for k, v in feats.items()}
    feats["last+mean"] = np.concatenate([feats["last"], feats["mean"]], 1)
    items = sorted({item for item, _, _ in pairs})
    random.Random(0).shuffle(items)
    held = set(items[: round(0.2 * len(items))])
    print(f"{len(texts)} joint texts, {len(pairs)} pairs, {len(items)} items ({len(held)} held out)")
    for name in ["chars", "last", "mean", "last+mean"]:
        tr, te, n = probe(feats[name], pairs, held)
        print(f"{name}: train {tr:.3f}, held-out items {te:.3f} ({n} pairs)", flush=True)


if __name__ == "__main__":
    main()
