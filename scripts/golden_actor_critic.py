#!/usr/bin/env python3
"""One IAC and one MAAC update from CoMLRL 1.4.3's own code, as a fixture for pbrl's tests.

Run once: `python3 scripts/golden_actor_critic.py` (the venv of scripts/golden_madpo.py;
GOLDEN_VENV names another). On the small random Llama of tests/fixtures/golden_madpo/agent_0 (the
actor, and a second copy of it as the critic backbone) it builds one agent's rollout buffer as
the actor-critic rollouts leave it: per sample the prompt ids, the completion padded with the pad
token (also end-of-turn) to the group's longest, the response length up to the first pad, the
attention mask of ones, the KL-shaped return, and the critic's value at rollout time
(`_value_for_critic_type` / `_value_on_prompt_only` under no_grad). Then, per case, CoMLRL's
`_prepare_advantages` on the buffer and `_ac_step` on its first chunk of `train_batch_size` (3),
with optimizers whose `step` does nothing, so every parameter keeps the gradient of its loss:

  iac_separate_v   IAC, a separate critic, critic_type v (the reference ignores value_clip_range here)
  iac_shared_q     IAC, the value head on the actor (hidden 4), critic_type q, value_clip_range 0.2
  maac_v           MAAC, one critic; its input ids are given (pbrl builds the joint text itself)

The losses are read off `backward` as `_ac_step` calls it. Writes
tests/fixtures/golden_actor_critic/{golden.json, grads.safetensors, heads.safetensors}.
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
OUT = MODELS.parent / "golden_actor_critic"
EOS = golden_madpo.EOS
MAX_NEW = 5

GROUPS = [  # prompt ids, completions (content only), rewards, reference KLs
    ([5, 9, 14, 3], [[7, 8, 20], [11], [30, 31, 32, 33, 34]], [0.2, 0.9, 0.5], [0.05, 0.3, 0.0]),
    ([6, 6, 21], [[12, 13], [40, 41, 42]], [1.0, 0.0], [0.0, 0.1]),
]
KL_COEF = 0.3
VALUE_LOSS_COEF = 0.6
CHUNK = 3
# The critics' input for MAAC: a joint-prompt token row per group (ids of the fixture vocabulary).
MAAC_CRITIC_IDS = [[2, 5, 9, 14, 3, 2, 6, 6, 21], [2, 6, 6, 21, 2, 5, 9]]


def padded(rows):
    ended = [r + [EOS] if len(r) < MAX_NEW else r for r in rows]
    longest = max(len(r) for r in ended)
    return [r + [EOS] * (longest - len(r)) for r in ended]


class KeepGrads:
    """An optimizer that clears its parameters' gradients but never moves them."""

    def __init__(self, params):
        self.params = list(params)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    def step(self):
        pass


def main():
    golden_madpo.ensure_venv()
    import torch
    from comlrl.models.actor_critic import CausalLMWithValueHead
    from comlrl.trainers.actor_critic.iac import IACTrainer, RolloutSample
    from comlrl.trainers.actor_critic.maac import MAACTrainer
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    OUT.mkdir(parents=True, exist_ok=True)
    losses_seen = []
    backward = torch.Tensor.backward

    def recording_backward(self, *a, **k):
        losses_seen.append(float(self.detach()))
        return backward(self, *a, **k)

    torch.Tensor.backward = recording_backward
    cpu = torch.device("cpu")
    golden = {"kl_coef": KL_COEF, "value_loss_coef": VALUE_LOSS_COEF, "chunk": CHUNK, "cases": {}}
    grads, heads = {}, {}
    for name in ["iac_separate_v", "iac_shared_q", "maac_v"]:
        torch.manual_seed(11)
        load = lambda: AutoModelForCausalLM.from_pretrained(MODELS / "agent_0", dtype=torch.float32)
        separate = name != "iac_shared_q"
        critic_type = "q" if name.endswith("_q") else "v"
        if name.startswith("iac"):
            t = IACTrainer.__new__(IACTrainer)
            actor = CausalLMWithValueHead(load(), value_head_hidden_dim=None if separate else 4,
                                          attach_value_head=not separate)
            critic = CausalLMWithValueHead(load(), attach_value_head=True) if separate else actor
            t.critics = [critic] if separate else []
            t.critic_devices = [cpu]
            t.critic_optimizers = [KeepGrads(critic.parameters())] if separate else []
        else:
            t = MAACTrainer.__new__(MAACTrainer)
            actor = CausalLMWithValueHead(load(), attach_value_head=False)
            critic = CausalLMWithValueHead(load(), attach_value_head=True)
            t.critics = [critic]
            t.critic_device = cpu
            t.critic_optimizer = KeepGrads(critic.parameters())
        t.args = SimpleNamespace(use_separate_critic=separate, value_clip_range=0.2, value_loss_coef=VALUE_LOSS_COEF,
                                 advantage_normalization=True, critic_type=critic_type)
        t.critic_type = critic_type
        t.agents = [actor]
        t.agent_devices = [cpu]
        t.agent_optimizers = [KeepGrads(actor.parameters())]
        # The buffer, with the values of the critic before any update.
        samples, rows = [], []
        for g, (prompt, completions, rewards, kls) in enumerate(GROUPS):
            for c, r, kl in zip(padded(completions), rewards, kls):
                seq = torch.tensor(prompt + c)
                resp_len = c.index(EOS) if EOS in c else len(c)
                mask = torch.ones_like(seq)
                with torch.no_grad():
                    if name.startswith("iac"):
                        old = t._value_for_critic_type(critic, seq.unsqueeze(0), mask.unsqueeze(0), len(prompt),
                                                       [resp_len])
                        critic_ids = prompt + (c[:resp_len] if critic_type == "q" else [])
                    else:
                        ids = torch.tensor([MAAC_CRITIC_IDS[g]])
                        old = t._value_on_prompt_only(critic, ids, torch.ones_like(ids), ids.size(1))
                        critic_ids = MAAC_CRITIC_IDS[g]
                shaped = r - KL_COEF * kl
                meta = {"value_target": torch.tensor([shaped]), "reference_kl": kl}
                if not name.startswith("iac"):
                    ids = torch.tensor([MAAC_CRITIC_IDS[g]])
                    meta.update(joint_input_ids=ids, joint_attention_mask=torch.ones_like(ids),
                                joint_prompt_len=ids.size(1), adv_target=torch.tensor([shaped]))
                samples.append(RolloutSample(
                    agent_idx=0, prompt="", completion="", full_input_ids=seq, attention_mask=mask,
                    prompt_len=len(prompt), response_len=resp_len, old_logprob=torch.zeros(1),
                    old_value=old.detach().view(1), reward=torch.tensor([r]), returns=torch.tensor([shaped]),
                    advantage=torch.zeros(1), metadata=meta))
                rows.append({"prompt": prompt, "completion": c[:resp_len], "critic_ids": critic_ids,
                             "target": shaped, "old_value": float(old.view(-1)[0])})
        t._prepare_advantages(samples)
        losses_seen.clear()
        t._ac_step(0, samples[:CHUNK])
        case = {"separate_critic": separate, "critic_type": critic_type, "rows": rows,
                "advantages": [float(s.normalized_advantage.view(-1)[0]) for s in samples]}
        if separate:
            case["actor_loss"], case["value_loss"] = losses_seen
        else:
            case["total_loss"], = losses_seen
        golden["cases"][name] = case
        for n, p in actor.named_parameters():
            if p.grad is not None:
                grads[f"{name}/actor/{n}"] = p.grad.detach().clone().contiguous()
        if separate:
            for n, p in critic.named_parameters():
                if p.grad is not None:
                    grads[f"{name}/critic/{n}"] = p.grad.detach().clone().contiguous()
        head_owner = critic if separate else actor
        for n, p in head_owner.value_head.named_parameters():
            heads[f"{name}/value_head.{n}"] = p.detach().clone().contiguous()
        print(name, {k: v for k, v in case.items() if k.endswith("loss")})
    torch.Tensor.backward = backward
    save_file(grads, str(OUT / "grads.safetensors"))
    save_file(heads, str(OUT / "heads.safetensors"))
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
