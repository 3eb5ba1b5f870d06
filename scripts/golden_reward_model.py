#!/usr/bin/env python3
"""The joint reward model's Bradley–Terry loss and gradients from CoMLRL 1.4.3's own code, as a
fixture for pbrl's tests.

Run once: `python3 scripts/golden_reward_model.py` (the venv of scripts/golden_madpo.py: CoMLRL
1.4.3, torch, transformers; GOLDEN_VENV names another). It uses the two small random backbones of
tests/fixtures/golden_madpo/ (a Llama with tied embeddings, a Qwen2 with q/k/v bias; word-level
tokenizer) and writes tests/fixtures/golden_reward_model/:

  golden.json        the pairs (text), and per case: backbone, padding side, max_length, the
                     head's initial weights, CoMLRL's winner and loser scores and its loss; for
                     the first case also the scores after one `_train_reward_model` epoch (one
                     batch holding every pair: one AdamW step, lr 1e-3)
  grads.safetensors  every parameter's gradient, "<case>/<name>" (the head as
                     "<case>/reward_head.weight" and "<case>/reward_head.bias")

The calls are CoMLRL's: `JointRewardModel`, `MARLHFTrainer._format_joint_reward_text` and
`_score_reward_texts` (the tokenizer called with padding=True, truncation=True and
max_length=reward_max_length), then the loss line of `_train_reward_model`.
"""
import copy
import importlib.util
import json
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("golden_madpo", HERE / "golden_madpo.py")
golden_madpo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden_madpo)

MODELS = golden_madpo.OUT  # tests/fixtures/golden_madpo
OUT = MODELS.parent / "golden_reward_model"
LR = 1e-3
CASES = [  # name, backbone, padding side, reward_max_length
    ("llama_right", "agent_0", "right", None),
    ("llama_left", "agent_0", "left", None),
    ("qwen2_right", "agent_1", "right", None),
    ("qwen2_left_truncated", "agent_1", "left", 24),
]


def trainer_for(model, tokenizer, max_length):
    from comlrl.trainers.preference.marlhf import JointRewardModel, MARLHFConfig, MARLHFTrainer
    import torch
    trainer = MARLHFTrainer.__new__(MARLHFTrainer)  # only the reward-model methods are used
    trainer.args = MARLHFConfig(num_agents=2, reward_max_length=max_length, reward_learning_rate=LR,
                                reward_train_batch_size=3, reward_num_train_epochs=1,
                                reward_model_device="cpu")
    trainer.num_agents = 2
    trainer.verbose = False
    trainer.reward_tokenizer = tokenizer
    trainer.reward_device = torch.device("cpu")
    trainer.reward_model = JointRewardModel(model)
    trainer.reward_optimizer = torch.optim.AdamW(trainer.reward_model.parameters(), lr=LR)
    return trainer


def main():
    golden_madpo.ensure_venv()
    import torch
    import torch.nn.functional as F
    from comlrl.trainers.preference.madpo import PreferencePair
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    OUT.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(9)
    # Two agents per pair; joint texts of different lengths, so padding matters.
    pairs = golden_madpo.pairs_spec(g, 2, [[(4, 3, 5), (3, 6, 2)], [(5, 6, 1), (4, 2, 4)], [(2, 4, 4), (6, 5, 6)]])
    records = [PreferencePair(prompts=p["prompts"], winner_completions=p["winner_completions"],
                              loser_completions=p["loser_completions"], agent_tensors=[], winner_reward=1.0,
                              loser_reward=0.0, candidate_reward_mean=0.5) for p in pairs]
    golden = {"lr": LR, "pairs": pairs, "cases": {}}
    grads = {}
    for k, (name, backbone, side, max_length) in enumerate(CASES):
        model = AutoModelForCausalLM.from_pretrained(MODELS / backbone, torch_dtype=torch.float32)
        tok = PreTrainedTokenizerFast(tokenizer_file=str(MODELS / backbone / "tokenizer.json"),
                                      eos_token="<eos>", pad_token="<eos>", padding_side=side)
        torch.manual_seed(100 + k)  # the head's init
        trainer = trainer_for(model, tok, max_length)
        rm = trainer.reward_model
        head0 = {n: p.detach().clone() for n, p in rm.reward_head.named_parameters()}
        before = copy.deepcopy(rm) if k == 0 else None
        rm.train()
        w = trainer._score_reward_texts([trainer._format_joint_reward_text(p, use_winner=True) for p in records])
        l = trainer._score_reward_texts([trainer._format_joint_reward_text(p, use_winner=False) for p in records])
        loss = -F.logsigmoid(w - l).mean()
        rm.zero_grad()
        loss.backward()
        for n, p in rm.named_parameters():
            if p.grad is not None:
                key = n.replace("backbone.", "", 1) if n.startswith("backbone.") else n
                grads[f"{name}/{key}"] = p.grad.detach().clone().contiguous()
        case = {"backbone": backbone, "padding_side": side, "max_length": max_length,
                "head_weight": head0["weight"].flatten().tolist(), "head_bias": head0["bias"].tolist(),
                "winner_scores": w.tolist(), "loser_scores": l.tolist(), "loss": loss.item(),
                "joint_texts": [trainer._format_joint_reward_text(p, use_winner=True) for p in records]}
        if before is not None:
            # One epoch of CoMLRL's own loop (one batch of every pair: one AdamW step).
            trainer.reward_model = before
            trainer.reward_optimizer = torch.optim.AdamW(before.parameters(), lr=LR)
            trainer._train_reward_model(records)
            with torch.no_grad():
                case["after_step_winner_scores"] = trainer._score_reward_texts(
                    [trainer._format_joint_reward_text(p, use_winner=True) for p in records]).tolist()
        golden["cases"][name] = case
        print(name, "loss", loss.item(), "w", w.tolist(), "l", l.tolist())
    save_file(grads, str(OUT / "grads.safetensors"))
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
