#!/usr/bin/env python3
"""How well could the pooled reward head order fresh samples of one prompt, and what limits it?

Fits heads on the pooled features `reward_head = "pooled_mlp"` reads (each agent's response
tokens' final hidden states mean-pooled, and log(1 + its token count); `src/reward_model/mod.rs`)
of one round's pairs with the Bradley–Terry loss, then measures the within-prompt order
(`rm/fresh_rank_acc`'s measure: pairs of samples of one prompt whose task rewards differ, the
share ordered the reward's way) on a `pbrl eval` report of *train* prompts (never the eval
prompts: this chooses heads). Each head variant is fitted from 3 seeds.

  python3 scripts/study/rm_head_probe.py ROUND.json EVAL_REPORT.json RM_DIR [--cut AGENT:TOKENS]

RM_DIR: a saved reward model (its `backbone/` is read with transformers, frozen; its own pooled
head is scored too, so a model fitted with `[reward_lora]`, its adapters merged into the saved
backbone, is measured as it is). `--cut 1:128`
cuts agent 1's answers to their first 128 tokens (a report sampled with a higher limit then
stands for the lower one, since sampling stops only at the limit). The task reward is the
quickstart's length ratio (band [2, 3]). Features are cached next to the report
(`.<RM_DIR's name>.probe.npz`).
Needs torch, transformers and tokenizers (the reference venv).
"""
import argparse, itertools, json, math, os
import numpy as np
import torch
from tokenizers import Tokenizer
from safetensors.numpy import load_file
from transformers import AutoModel


def band(r, lo=2.0, hi=3.0):
    return 1.0 if lo <= r <= hi else math.exp(-(lo - r if r < lo else r - hi))


def features(args):
    cache = f"{args.report}.{os.path.basename(os.path.normpath(args.rm))}.probe.npz"
    if os.path.exists(cache):
        return dict(np.load(cache))
    backbone = os.path.join(args.rm, "backbone")
    tok = Tokenizer.from_file(os.path.join(backbone, "tokenizer.json"))
    model = AutoModel.from_pretrained(backbone, dtype=torch.float32).eval()

    def pooled(prompts, completions):  # pbrl's joint text and response spans
        text, spans = "Joint multi-agent response", []
        for i, (p, c) in enumerate(zip(prompts, completions)):
            text += f"\n\nAgent {i + 1} prompt:\n{p}\n\nAgent {i + 1} response:\n"
            spans.append((len(text), len(text) + len(c)))
            text += c
        enc = tok.encode(text, add_special_tokens=True)
        with torch.no_grad():
            h = model(torch.tensor([enc.ids])).last_hidden_state[0]
        out, counts = [], []
        for s, e in spans:
            idx = [t for t, (a, b) in enumerate(enc.offsets) if b > a and a < e and b > s]
            idx = list(range(idx[0], idx[-1] + 1)) if idx else []
            out.append(h[idx].mean(0).numpy() if idx else np.zeros(h.shape[1], np.float32))
            counts.append(len(idx))
        return np.concatenate(out + [np.log1p(np.array(counts, np.float32))])

    pairs = json.load(open(args.round))["pairs"]
    W = [pooled(p["prompts"], p["winner_completions"]) for p in pairs]
    L = [pooled(p["prompts"], p["loser_completions"]) for p in pairs]
    F, R, FP = [], [], []
    for it in json.load(open(args.report))["items"]:
        prompts, comps = (json.loads(x) if isinstance(x, str) else x for x in (it["prompts"], it["completions"]))
        for a, n in args.cut:
            ids = tok.encode(comps[a], add_special_tokens=False).ids
            comps[a] = tok.decode(ids[:n]) if len(ids) > n else comps[a]
        F.append(pooled(prompts, comps))
        R.append(band(len(comps[1]) / max(len(comps[0]), 1)))
        FP.append(prompts[0])
    d = dict(W=np.array(W), L=np.array(L), P=np.array([p["prompts"][0] for p in pairs]), F=np.array(F),
             R=np.array(R), FP=np.array(FP))
    np.savez(cache, **d)
    return d


def order(scores, R, FP, mask):
    groups = {}
    for i in np.where(mask)[0]:
        groups.setdefault(FP[i], []).append(i)
    right = total = 0
    for g in groups.values():
        for a, b in itertools.combinations(g, 2):
            if abs(R[a] - R[b]) > 1e-9:
                total += 1
                right += (scores[a] - scores[b]) * (R[a] - R[b]) > 0
    return right / max(total, 1), total


def fit(d, seed, cols=None, std=False, wd=0.01, drop=0.0, hidden=32, lr=1e-3, epochs=5):
    """The pooled head as pbrl fits it (N(0, 0.02) init, AdamW, linear decay, one pair per update)."""
    g = torch.Generator().manual_seed(seed)
    w, l, f = (torch.tensor(d[k]) for k in "WLF")
    if cols is not None:
        w, l, f = w[:, cols], l[:, cols], f[:, cols]
    if std:
        both = torch.cat([w, l])
        mu, sd = both.mean(0), both.std(0) + 1e-6
        w, l, f = (w - mu) / sd, (l - mu) / sd, (f - mu) / sd
    l1, l2 = torch.nn.Linear(w.shape[1], hidden), torch.nn.Linear(hidden, 1)
    for m in (l1, l2):
        torch.nn.init.normal_(m.weight, 0, 0.02, generator=g)
        torch.nn.init.zeros_(m.bias)
    train = [True]
    net = lambda x: l2(torch.tanh(l1(torch.nn.functional.dropout(x, drop, train[0])))).squeeze(-1)
    opt = torch.optim.AdamW([*l1.parameters(), *l2.parameters()], lr=lr, weight_decay=wd)
    steps = epochs * len(w)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 - s / steps)
    for _ in range(epochs):
        for i in torch.randperm(len(w), generator=g):
            loss = -torch.nn.functional.logsigmoid(net(w[i:i + 1]) - net(l[i:i + 1])).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    train[0] = False
    with torch.no_grad():
        return net(f).numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("round"), ap.add_argument("report"), ap.add_argument("rm")
    ap.add_argument("--cut", action="append", default=[], type=lambda s: tuple(map(int, s.split(":"))))
    args = ap.parse_args()
    torch.set_num_threads(1)
    d = features(args)
    R, FP = d["R"], d["FP"]
    unseen = np.array([p not in set(d["P"].tolist()) for p in FP])
    every = np.ones(len(FP), bool)
    hidden = d["W"].shape[1] - 2
    counts_only = lambda c: band(math.expm1(c[1]) / max(math.expm1(c[0]), 1))
    print(f"{len(set(FP.tolist()))} prompts × {len(FP) // len(set(FP.tolist()))} samples; "
          f"{len(set(FP[unseen].tolist()))} prompts not in the round's pairs")
    counts = d["F"][:, hidden:]
    print("ceiling: the band on token counts          all %.3f (%d pairs)" % order(
        np.array([counts_only(c) for c in counts]), R, FP, every))
    saved = load_file(os.path.join(args.rm, "reward_head.safetensors"))
    w1, b1, w2, b2 = (saved[f"reward_head.{k}"] for k in
                      ("pre_projection.0.weight", "pre_projection.0.bias", "value_projection.weight", "value_projection.bias"))
    scores = (np.tanh(d["F"] @ w1.T + b1) @ w2.T + b2)[:, 0]
    print("RM_DIR's own head                 unseen prompts %.3f  all %.3f" % (
        order(scores, R, FP, unseen)[0], order(scores, R, FP, every)[0]), flush=True)
    variants = {"pbrl's pooled_mlp": {}, "counts only": dict(cols=[hidden, hidden + 1]),
                "standardized inputs": dict(std=True), "weight decay 1": dict(wd=1.0),
                "input dropout 0.5": dict(drop=0.5), "hidden 8": dict(hidden=8), "2 epochs": dict(epochs=2)}
    for name, kw in variants.items():
        runs = [fit(d, s, **kw) for s in range(3)]
        u = np.mean([order(s, R, FP, unseen)[0] for s in runs])
        a = np.mean([order(s, R, FP, every)[0] for s in runs])
        print(f"{name:24s} unseen prompts {u:.3f} ({order(runs[0], R, FP, unseen)[1]} pairs)  "
              f"all {a:.3f} ({order(runs[0], R, FP, every)[1]} pairs)", flush=True)


if __name__ == "__main__":
    main()
