#!/usr/bin/env python3
"""CoMLRL 1.4.3 preference collection and MADPO training on the bench configuration, for
scripts/bench.sh.

SmolLM2-135M (the same GGUF, dequantized to f32), 2 agents, the first 8 items of
data/length_ratio/train.jsonl with the quickstart's prompts (chat-templated exactly as pbrl gives
them), 4 candidates, 32 new tokens, temperature 0.6, top_p 0.6, top_k 50, the length-ratio reward.

1. times MADPOTrainer._build_preference_dataset() (model loading excluded);
2. with --round, trains on pbrl's round file of the same configuration, so that both train on the
   same pairs: each record re-tokenized from its text as CoMLRL's iterative trainer does
   (MADPOIterTrainer._preference_tensors_from_text), then MADPOTrainer._train_preference_pairs
   (train_batch_size 2, 1 epoch, lr 5e-6), timed;
3. writes JSON with both times and the process's peak RSS (the whole collect + train run).

With --iterate ROUNDS (its own process): MADPOIterTrainer.train() on the items (comparator
"current", the same candidates, pairs and training settings), timed whole.

With --turns (its own process): MAGRPOTrainer over 2-turn debates on the task reward, one epoch
over the items (num_generations 2, rollout_buffer_size 3, aligned, no early termination), with
an external_transition writing pbrl's default debate prompt (the item's prompt, the agent's
answer, the others' answers), timed whole: the same work as pbrl's `train-marlhf` with
`num_turns = 2`, `rl_reward = "task"` and `[transition] kind = "debate"`.

With --marlhf (a separate process, so its peak RSS is its own): MARLHFTrainer (rl_algorithm
magrpo, num_generations 4, the reference's reward-model defaults; the reward model's backbone the
same SmolLM2 saved once as a Hugging Face directory, since CoMLRL loads it by name), timed by
phase: the collection, the reward model's init and Bradley-Terry fit on pbrl's round
(`_init_reward_model` + `_train_reward_model`), and the online RL (`_train_online_rl`, one epoch
over the 8 items).
"""
import argparse
import copy
import json
import math
import os
import resource
import time
import tomllib
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
GGUF_DIR, GGUF = ROOT / "models" / "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def length_ratio(c1, c2):
    if len(c1) == 0:
        return 0.0
    r = len(c2) / len(c1)
    return 1.0 if 2 <= r <= 3 else math.exp(-(2 - r) if r < 2 else -(r - 3))


def quickstart_team():
    """The quickstart's team as CoMLRL takes it: the tokenizer, two f32 SmolLM2 agents (the GGUF
    dequantized) and formatter(i), agent i's chat-templated prompt exactly as pbrl gives it."""
    qs = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())
    templates, systems = qs["task"]["formatters"], qs["task"]["system_prompts"]
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF)
    # CoMLRL cuts prompts at the first pad id; SmolLM2's pad is <|im_end|>, so use <|endoftext|>.
    # Its MADPO scorer cuts completions at the first pad too, then leaves the last token out: with
    # this pad it trains the last content token of a finished answer, which CoMLRL with SmolLM2's
    # own pad, the golden test and pbrl's score_last_token = false leave out.
    tok.pad_token = "<|endoftext|>"
    agents = []
    for _ in range(2):
        m = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF, dtype=torch.float32)
        m.generation_config.pad_token_id = tok.pad_token_id
        agents.append(m)

    def formatter(i):
        def f(item):
            msgs = [{"role": "system", "content": systems[i]}, {"role": "user", "content": templates[i].format(**item)}]
            return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        return f

    return tok, agents, formatter


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--items", type=int, default=8)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "2")))
    ap.add_argument("--round", help="pbrl round file to train MADPO on after collecting")
    ap.add_argument("--marlhf", action="store_true", help="MARLHF instead of MADPO (see above)")
    ap.add_argument("--turns", action="store_true", help="MAGRPOTrainer over 2-turn debates (see above)")
    ap.add_argument("--iterate", type=int, metavar="ROUNDS",
                    help="MADPOIterTrainer.train() for ROUNDS rounds (comparator current) instead, timed whole")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer, MARLHFConfig, MARLHFTrainer
    from datasets import Dataset

    tok, agents, formatter = quickstart_team()
    items = [json.loads(l) for l in (ROOT / "data/length_ratio/train.jsonl").read_text().splitlines()[: a.items]]

    common = dict(num_train_epochs=1, num_agents=2, max_new_tokens=32, temperature=0.6, top_p=0.6, top_k=50,
                  preference_num_candidates=4, preference_pairs_per_sample=2, eval_interval=0,
                  agent_devices=["cpu", "cpu"], train_batch_size=2, agent_learning_rate=5e-6)
    if a.turns:
        from comlrl.trainers.reinforce.magrpo import MAGRPOConfig, MAGRPOTrainer

        def debate(prompt, agent_completions, num_agents, **_):
            # pbrl's default debate template, as `transition.template` unset renders it.
            own = [c.strip() for c in agent_completions]
            others = lambda i: "\n\n".join(f"Agent {j}: {own[j]}" for j in range(num_agents) if j != i)
            return [f"{prompt}\n\nYour answer so far:\n{own[i]}\n\nThe other agents answered:\n{others(i)}\n\n"
                    "Read their answers, then write your own improved answer." for i in range(num_agents)]
        args = MAGRPOConfig(num_train_epochs=1, agent_learning_rate=5e-6, num_agents=2, num_generations=2, max_new_tokens=32,
                            temperature=0.6, top_p=0.6, top_k=50, num_turns=2, early_termination_threshold=None,
                            eval_interval=0, rollout_buffer_size=3, train_batch_size=3, agent_devices=["cpu", "cpu"])
        trainer = MAGRPOTrainer(agents=agents, num_agents=2, tokenizer=tok, train_dataset=Dataset.from_list(items),
                                reward_func=lambda c1, c2: [length_ratio(c1[0], c2[0])],
                                formatters=[formatter(0), formatter(1)], external_transition=debate, args=args)
        t = time.perf_counter()
        trainer.train()
        out = {"magrpo_turns_s": time.perf_counter() - t, "threads": a.threads,
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        print(f"CoMLRL MAGRPO, 2-turn debates: {out['magrpo_turns_s']:.1f} s")
        Path(a.out).write_text(json.dumps(out))
        return
    if a.iterate:
        from comlrl.trainers.preference.iterative import MADPOIterConfig, MADPOIterTrainer
        args = MADPOIterConfig(**common, num_iterations=a.iterate,
                               preference_replay_dir=str(Path(a.out).parent / "comlrl-iterate-rounds"))
        trainer = MADPOIterTrainer(agents=agents, num_agents=2, tokenizer=tok, train_dataset=Dataset.from_list(items),
                                   reward_func=lambda c1, c2: [length_ratio(c1[0], c2[0])],
                                   formatters=[formatter(0), formatter(1)], args=args)
        t = time.perf_counter()
        trainer.train()
        out = {"madpo_iter_s": time.perf_counter() - t, "rounds": a.iterate, "threads": a.threads,
               "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        print(f"CoMLRL MADPOIter: {a.iterate} rounds in {out['madpo_iter_s']:.1f} s")
        Path(a.out).write_text(json.dumps(out))
        return
    if a.marlhf:
        hf_dir = Path(a.out).parent / "smollm2-hf"
        if not (hf_dir / "config.json").is_file():
            # A GGUF-loaded model does not serialize: copy its (dequantized) weights into a plain one.
            config = copy.deepcopy(agents[0].config)
            if hasattr(config, "quantization_config"):
                del config.quantization_config
            plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
            plain.load_state_dict(agents[0].state_dict())
            plain.save_pretrained(hf_dir)
            tok.save_pretrained(hf_dir)
        args = MARLHFConfig(**common, rl_algorithm="magrpo", num_generations=4, reward_model_name=str(hf_dir),
                            reward_model_device="cpu")
        cls = MARLHFTrainer
    else:
        args, cls = MADPOConfig(**common), MADPOTrainer
    trainer = cls(agents=agents, num_agents=2, tokenizer=tok, train_dataset=Dataset.from_list(items),
                  reward_func=lambda c1, c2: [length_ratio(c1[0], c2[0])],
                  formatters=[formatter(0), formatter(1)], args=args)
    t = time.perf_counter()
    pairs = trainer._build_preference_dataset()
    secs = time.perf_counter() - t
    out = {"collect_s": secs, "num_pairs": len(pairs), "threads": a.threads}
    print(f"CoMLRL collection: {len(pairs)} pairs in {secs:.1f} s")
    if a.round:
        from comlrl.trainers.preference.iterative import MADPOIterTrainer
        from comlrl.trainers.preference.madpo import PreferencePair
        records = json.loads(Path(a.round).read_text())["pairs"]
        round_pairs = [
            PreferencePair(
                prompts=r["prompts"], winner_completions=r["winner_completions"],
                loser_completions=r["loser_completions"],
                agent_tensors=[MADPOIterTrainer._preference_tensors_from_text(
                    trainer, i, r["prompts"][i], r["winner_completions"][i], r["loser_completions"][i]) for i in range(2)],
                winner_reward=r["winner_reward"], loser_reward=r["loser_reward"],
                candidate_reward_mean=r["candidate_reward_mean"])
            for r in records
        ]
        t = time.perf_counter()
        if a.marlhf:
            trainer._init_reward_model()
            trainer._train_reward_model(round_pairs)
            trainer._reward_model_active = True
            out["marlhf_rm_s"] = time.perf_counter() - t
            t = time.perf_counter()
            trainer._train_online_rl()
            out["marlhf_rl_s"] = time.perf_counter() - t
            print(f"CoMLRL MARLHF: reward model {out['marlhf_rm_s']:.1f} s ({len(round_pairs)} pairs), "
                  f"RL {out['marlhf_rl_s']:.1f} s")
        else:
            trainer._train_preference_pairs(round_pairs)
            out["madpo_train_s"] = time.perf_counter() - t
            out["madpo_num_pairs"] = len(round_pairs)
            print(f"CoMLRL MADPO training: {len(round_pairs)} pairs in {out['madpo_train_s']:.1f} s")
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    Path(a.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
