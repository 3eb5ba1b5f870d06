#!/usr/bin/env python3
"""One MAGRPO-family policy-gradient update from CoMLRL 1.4.3's own code, as a fixture for
pbrl's tests.

Run once: `python3 scripts/golden_policy_gradient.py` (the venv of scripts/golden_madpo.py;
GOLDEN_VENV names another). On the small random Llama of tests/fixtures/golden_madpo/agent_0 it
builds fixed rollouts as MAGRPO's generation leaves them (per item: the prompt ids, K completion
rows padded with the pad token, which is also end-of-turn, to the group's longest; returns and
reference KLs) and, for advantage_mode mean (magrpo) and rloo (marloo), with and without the
reference KL, calls `MAGRPOTrainer._compute_loss_with_gradients` on each item of one chunk of
two, scaled by 1/2 and backpropagated as `_update_from_samples` does. It also computes each
row's reference KL with `comlrl.utils.reference_kl.reference_kl_for_sequence` (policy agent_0,
reference the Qwen2 of agent_1, which shares the tokenizer; response length: up to the first
pad, as MAGRPO's generation measures it). Writes
tests/fixtures/golden_policy_gradient/{golden.json, grads.safetensors}.
"""
import importlib.util
import json
import os
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("golden_madpo", HERE / "golden_madpo.py")
golden_madpo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden_madpo)
MODELS = golden_madpo.OUT
OUT = MODELS.parent / "golden_policy_gradient"
EOS = golden_madpo.EOS

ITEMS = [  # prompt ids, completion token rows (content only), returns, reference KLs
    ([5, 9, 14, 3], [[7, 8, 20], [11], [30, 31, 32, 33, 34]], [0.2, 0.9, 0.5], [0.05, 0.3, 0.0]),
    ([6, 6, 21], [[12, 13], [40, 41, 42], [9, 10]], [1.0, 0.0, 0.25], [0.0, 0.1, 0.2]),
]
MAX_NEW = 5  # a completion of this length was cut off (no end-of-turn)


def padded(rows):
    """As generate returns a group: content + end-of-turn when it ended, then padding."""
    ended = [r + [EOS] if len(r) < MAX_NEW else r for r in rows]
    longest = max(len(r) for r in ended)
    return [r + [EOS] * (longest - len(r)) for r in ended]


def main():
    golden_madpo.ensure_venv()
    import torch
    from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    OUT.mkdir(parents=True, exist_ok=True)
    golden = {"kl_coef": 0.3, "items": [{"prompt": p, "completions": padded(c), "returns": r, "kls": k}
                                         for p, c, r, k in ITEMS], "cases": {}}
    grads = {}
    for mode in ["mean", "rloo"]:
        for kl in [False, True]:
            name = f"{mode}_{'kl' if kl else 'nokl'}"
            model = AutoModelForCausalLM.from_pretrained(MODELS / "agent_0", dtype=torch.float32)
            t = MAGRPOTrainer.__new__(MAGRPOTrainer)  # only the loss method is used
            t.args = SimpleNamespace(reference_kl_enabled=kl, reference_kl_coef=0.3, advantage_normalization=True)
            t.advantage_mode = mode
            model.zero_grad()
            losses = []
            for item in golden["items"]:
                data = {"prompt_input_ids": torch.tensor([item["prompt"]]),
                        "completion_input_ids": [[torch.tensor(c) for c in item["completions"]]],
                        "reference_kls": item["kls"]}
                loss = t._compute_loss_with_gradients(model, data, item["returns"])
                (loss * (1.0 / len(golden["items"]))).backward()  # _update_from_samples' chunk scaling
                losses.append(loss.item())
            golden["cases"][name] = {"mode": mode, "reference_kl": kl, "losses": losses}
            for n, p in model.named_parameters():
                if p.grad is not None:
                    grads[f"{name}/{n}"] = p.grad.detach().clone().contiguous()
            print(name, losses)
    from comlrl.utils.reference_kl import reference_kl_for_sequence
    policy = AutoModelForCausalLM.from_pretrained(MODELS / "agent_0", dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(MODELS / "agent_1", dtype=torch.float32)
    for item in golden["items"]:
        item["reference_kl"], item["response_lens"] = [], []
        for c in item["completions"]:
            response_len = c.index(EOS) if EOS in c else len(c)
            seq = torch.tensor([item["prompt"] + c])
            kl = reference_kl_for_sequence(policy, reference, seq, torch.ones_like(seq), len(item["prompt"]), response_len)
            item["reference_kl"].append(float(kl.view(-1)[0]))
            item["response_lens"].append(response_len)
    print("reference KLs", [i["reference_kl"] for i in golden["items"]])
    save_file(grads, str(OUT / "grads.safetensors"))
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
