#!/usr/bin/env python3
"""PyTorch + transformers baseline for scripts/bench.sh, on the same GGUF and the same token ids
pbrl used (read from pbrl's result file).

  bench_torch.py train  --pbrl target/bench/pbrl_train.json  --out target/bench/torch_train.json
  bench_torch.py sample --pbrl target/bench/pbrl_sample.json --out target/bench/torch_sample.json
  [--model HF_DIR] [--device cuda]   (default: the bundled GGUF on the CPU)
  [--lora R]   (train: PEFT adapters of rank R, alpha 2R, on every projection of a frozen base)
  [--autocast-bf16]   (train: the forward pass under torch.autocast(bfloat16), PyTorch's mixed
                       precision: every linear product on bf16 inputs, the adapters' included)

train: the same B=4x128 rows; forward, completion log-probs (log_softmax + gather, as CoMLRL
does), the same DPO-style loss, backward, torch.optim.AdamW; median of the steps after a warm-up.
sample: HF generate at batch 1, 64 new tokens (forced), from the same prompt.
"""
import argparse
import json
import os
import resource
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

GGUF = Path(__file__).resolve().parent.parent / "models" / "smollm2"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def load():
    if ARGS.model:
        m = AutoModelForCausalLM.from_pretrained(ARGS.model, dtype=torch.float32)
    else:
        m = AutoModelForCausalLM.from_pretrained(GGUF, gguf_file=NAME, dtype=torch.float32)
    return m.to(ARGS.device)


def sync():
    if ARGS.device.startswith("cuda"):
        torch.cuda.synchronize()


def train(rows, steps):
    model = load()
    if ARGS.lora:
        from peft import LoraConfig, get_peft_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        cfg = LoraConfig(r=ARGS.lora, lora_alpha=2 * ARGS.lora, lora_dropout=0.0, target_modules=targets,
                         task_type="CAUSAL_LM")
        model = get_peft_model(model, cfg)
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-6)
    ids = torch.tensor([r["prompt"] + r["completion"] for r in rows], device=ARGS.device)
    plen = [len(r["prompt"]) for r in rows]
    mask = torch.zeros(ids.shape[0], ids.shape[1] - 1, device=ARGS.device)
    for b, p in enumerate(plen):
        mask[b, p - 1:] = 1.0
    fwd, bwd, adam, losses = [], [], [], []
    autocast = torch.autocast(ARGS.device.split(":")[0], dtype=torch.bfloat16, enabled=ARGS.autocast_bf16)
    for step in range(steps + 1):
        t = time.perf_counter()
        with autocast:
            logits = model(ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(2, ids[:, 1:].unsqueeze(2)).squeeze(2)
        seq = (lp * mask).sum(1).view(2, 2)
        loss = -torch.nn.functional.logsigmoid(0.1 * (seq[:, 0] - seq[:, 1])).mean()
        sync()
        tf = time.perf_counter() - t
        t = time.perf_counter()
        opt.zero_grad()
        loss.backward()
        sync()
        tb = time.perf_counter() - t
        t = time.perf_counter()
        opt.step()
        sync()
        to = time.perf_counter() - t
        print(f"step {step}: loss {loss.item():.6f} forward {tf:.2f}s backward {tb:.2f}s adamw {to:.2f}s", flush=True)
        if step > 0:
            fwd.append(tf), bwd.append(tb), adam.append(to)
        losses.append(loss.item())
    f, b, o = statistics.median(fwd), statistics.median(bwd), statistics.median(adam)
    return {"forward_s": f, "backward_s": b, "adamw_s": o, "step_s": f + b + o, "losses": losses, "peak_rss_mib": peak_rss_mib()}


def sample(prompt):
    model = load()
    model.eval()
    ids = torch.tensor([prompt], device=ARGS.device)
    kw = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=0.6, top_p=0.9, top_k=50, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=4, min_new_tokens=4, **kw)
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=64, min_new_tokens=64, **kw)
        sync()
        secs = time.perf_counter() - t
    n = out.shape[1] - ids.shape[1]
    return {"tokens": n, "seconds": secs, "tokens_per_s": n / secs, "peak_rss_mib": peak_rss_mib()}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["train", "sample"])
    ap.add_argument("--pbrl", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    ap.add_argument("--model", help="a Hugging Face model directory instead of the bundled GGUF")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lora", type=int, help="train: PEFT LoRA adapters of this rank instead of full fine-tuning")
    ap.add_argument("--autocast-bf16", action="store_true", help="train: the forward pass under bf16 autocast")
    a = ARGS = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    src = json.loads(Path(a.pbrl).read_text())
    res = train(src["rows"], a.steps) if a.mode == "train" else sample(src["prompt"])
    res["threads"] = a.threads
    res["device"] = a.device
    res["lora"] = a.lora
    res["autocast_bf16"] = a.autocast_bf16
    if a.device.startswith("cuda"):
        res["peak_gpu_mib"] = torch.cuda.max_memory_allocated() / 2**20
    Path(a.out).write_text(json.dumps(res))
