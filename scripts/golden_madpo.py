#!/usr/bin/env python3
"""MADPO losses and gradients from CoMLRL 1.4.3's own code, as a fixture for pbrl's tests.

Run once: `python3 scripts/golden_madpo.py` makes (or reuses) the venv `.venv-golden` with
CoMLRL 1.4.3, torch and transformers (GOLDEN_VENV names another), re-runs itself there, and
writes tests/fixtures/golden_madpo/:

  agent_0/, agent_1/     two small random models saved as Hugging Face directories (a Llama with
                         tied embeddings, a Qwen2 with q/k/v bias), word-level tokenizer whose
                         end-of-turn token is also the pad token, as SmolLM2's is
  golden.json            the pair batches (text), dpo_beta, max_new_tokens, and per scorer the
                         agents' margins and losses
  grads.safetensors      every parameter's gradient, "<scorer>/agent_<i>/<name>"

Two scorers:
  decentralized  2 agents; CoMLRL's MADPOTrainer._detached_agent_deltas, then per agent
                 _agent_preference_loss and backward (its scorer trims the padded completion at the
                 first pad, which is also the end-of-turn token, and leaves the last token out)
  centralized    1 actor writing the joint response; the same calls with the trainer in centralized
                 mode, whose scorer is collaboration.joint_sequence_log_prob (every token, the
                 end-of-turn token included)

The completions are given to CoMLRL as generation returns them: content, then the end-of-turn
token and padding up to max_new_tokens when the completion ended, no end-of-turn when it was cut
off at max_new_tokens. pbrl reads the same pairs as stored text.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "golden_madpo"
VENV = Path(os.environ.get("GOLDEN_VENV", ROOT / ".venv-golden"))
PACKAGES = ["comlrl==1.4.3", "torch", "transformers", "datasets", "safetensors"]
VOCAB = 48
EOS = 1  # "<eos>": end-of-turn and pad, as in SmolLM2's tokenizer
MAX_NEW = 6
BETA = 0.1  # the reference default


def ensure_venv():
    try:
        import comlrl  # noqa: F401
        import torch  # noqa: F401
        return
    except ImportError:
        pass
    py = VENV / "bin" / "python"
    if not py.exists():
        print(f"making {VENV} ({', '.join(PACKAGES)})...", flush=True)
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
        subprocess.check_call([str(VENV / "bin" / "pip"), "install", "-q", *PACKAGES])
    os.execv(str(py), [str(py), __file__, *sys.argv[1:]])


def word_tokenizer_files(out):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(VOCAB - 3)]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens(["<pad>", "<eos>"])
    t.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<eos>"}))


def tiny_model(name, cls, cfg_cls, seed, **kw):
    import torch
    torch.manual_seed(seed)
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=None, eos_token_id=EOS, pad_token_id=EOS,
                  attention_dropout=0.0, **kw)
    model = cls(cfg).float()
    with torch.no_grad():  # transformers inits small; widen so margins are not all ~0
        for p in model.parameters():
            p.mul_(1.5) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    out = OUT / name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    word_tokenizer_files(out)
    return model


def pairs_spec(g, num_roles, specs):
    """Pair batches as text. specs: per pair, per role, (prompt len, winner len, loser len)."""
    import torch
    words = lambda n: " ".join(f"w{i - 3}" for i in torch.randint(3, VOCAB, (n,), generator=g).tolist())
    pairs = []
    for spec in specs:
        assert len(spec) == num_roles
        pairs.append({
            "prompts": [words(p) for p, _, _ in spec],
            "winner_completions": [words(w) for _, w, _ in spec],
            "loser_completions": [words(l) for _, _, l in spec],
        })
    return pairs


def as_generated(tok, text):
    """Completion ids as generation returns them: + end-of-turn and padding when it ended."""
    import torch
    ids = tok.encode(text, add_special_tokens=False)
    assert len(ids) <= MAX_NEW
    return torch.tensor(ids + [EOS] * (MAX_NEW - len(ids)))


def comlrl_batch(trainer, pairs, tokenizers):
    import torch
    from comlrl.trainers.preference.madpo import AgentPreferenceTensors, PreferencePair
    batch = []
    for p in pairs:
        tensors = [
            AgentPreferenceTensors(
                prompt_input_ids=torch.tensor(tok.encode(p["prompts"][a], add_special_tokens=False)),
                winner_completion_ids=as_generated(tok, p["winner_completions"][a]),
                loser_completion_ids=as_generated(tok, p["loser_completions"][a]),
            )
            for a, tok in enumerate(tokenizers)
        ]
        batch.append(PreferencePair(prompts=p["prompts"], winner_completions=p["winner_completions"],
                                    loser_completions=p["loser_completions"], agent_tensors=tensors,
                                    winner_reward=1.0, loser_reward=0.0, candidate_reward_mean=0.5))
    return batch


def run_comlrl(agents, pairs, centralized):
    """CoMLRL's update, minus the optimizer step: detached margins, then per agent loss + backward."""
    from comlrl.trainers.preference.madpo import MADPOConfig, MADPOTrainer
    from transformers import PreTrainedTokenizerFast
    tokenizers = [PreTrainedTokenizerFast(tokenizer_file=str(OUT / "agent_0" / "tokenizer.json"),
                                          eos_token="<eos>", pad_token="<eos>") for _ in agents]
    trainer = MADPOTrainer.__new__(MADPOTrainer)  # only the loss methods are used; no datasets
    trainer.args = MADPOConfig(dpo_beta=BETA, num_agents=len(agents), max_new_tokens=MAX_NEW)
    trainer.agents = agents
    trainer.tokenizers = tokenizers
    trainer.num_agents = len(agents)
    # Its presence is what selects the joint scorer in MADPOTrainer._sequence_log_prob.
    trainer.centralized_collaboration = object() if centralized else None
    batch = comlrl_batch(trainer, pairs, tokenizers)
    for agent in agents:
        agent.train()
    deltas = trainer._detached_agent_deltas(batch)
    losses, grads = [], {}
    for i, agent in enumerate(agents):
        agent.zero_grad()
        loss = trainer._agent_preference_loss(i, batch, deltas)
        loss.backward()
        losses.append(loss.item())
        for name, p in agent.named_parameters():
            if p.grad is not None:
                grads[f"agent_{i}/{name}"] = p.grad.detach().clone().contiguous()
    return deltas, losses, grads


def main():
    ensure_venv()
    import comlrl
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    OUT.mkdir(parents=True, exist_ok=True)
    a0 = tiny_model("agent_0", LlamaForCausalLM, LlamaConfig, 11, tie_word_embeddings=True)
    a1 = tiny_model("agent_1", Qwen2ForCausalLM, Qwen2Config, 12, tie_word_embeddings=False)
    g = torch.Generator().manual_seed(5)
    # (prompt, winner, loser) lengths per role: ended completions, cut-off ones (MAX_NEW) and a
    # one-token one (nothing left to score when the last token is left out).
    dec = pairs_spec(g, 2, [[(4, 3, 5), (3, 6, 2)], [(5, 6, 1), (4, 2, 4)], [(2, 4, 4), (6, 5, 6)]])
    cen = pairs_spec(g, 1, [[(7, 5, 3)], [(6, 6, 4)], [(8, 1, 6)]])
    golden = {"comlrl": comlrl.__version__ if hasattr(comlrl, "__version__") else "1.4.3",
              "torch": torch.__version__, "dpo_beta": BETA, "max_new_tokens": MAX_NEW, "scorers": {}}
    all_grads = {}
    for scorer, agents, pairs in [("decentralized", [a0, a1], dec), ("centralized", [a0], cen)]:
        deltas, losses, grads = run_comlrl(agents, pairs, scorer == "centralized")
        golden["scorers"][scorer] = {"pairs": pairs, "margins": deltas, "losses": losses}
        all_grads.update({f"{scorer}/{k}": v for k, v in grads.items()})
        print(scorer, "margins", deltas, "losses", losses)
    save_file(all_grads, str(OUT / "grads.safetensors"))
    (OUT / "golden.json").write_text(json.dumps(golden, indent=1))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
