#!/usr/bin/env python3
"""CoMLRL 1.4.3's MADPOTrainer on the quickstart task, its agents saved as a team that
`pbrl eval --team` evaluates under pbrl's own protocol (experiments/comlrl.sh).

The task as pbrl poses it (configs/quickstart.toml): the same SmolLM2 agents (the GGUF dequantized
to f32), prompts, chat template, sampling (temperature, top_p, top_k), per-agent token limits
(CoMLRL takes one `max_new_tokens`; each agent's generation call is given its own, as pbrl does)
and the length-ratio reward; the same collection budget (8 candidates, 2 pairs per item) and
training budget (1 epoch, 2 pairs per update, lr 5e-6). CoMLRL's own algorithm otherwise:
reference-free MADPO at its default beta 0.1, a constant learning rate, no held-out keep-best,
all 54 train items (pbrl holds 8 of them out for keep-best). `--scorer` chooses which completion
tokens its MADPO scorer sums (see its help; the default is the reference's own on SmolLM2).

Usage: python experiments/comlrl/train_comlrl.py --out DIR [--seed S] [--threads T] [--items N] [--pairs ROUND]
Writes DIR/agents/{agent_0,agent_1,team.json}, DIR/comlrl.json (times, pairs, peak RSS) and DIR/pairs.json
(the collected pairs with their token ids)."""
import argparse
import copy
import json
import os
import random
import resource
import sys
import time
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import torch  # noqa: E402
from bench_comlrl import ROOT, length_ratio, quickstart_team  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402


def save_plain(model, tok, agent_dir):
    """A GGUF-loaded model does not serialize: its weights go into a plain model of its config."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(agent_dir)
    tok.save_pretrained(agent_dir)


def pairs_from_round(tok, path):
    """A pbrl round file (`iteration_NNNN.json`) as CoMLRL's training pairs: each text tokenized as
    CoMLRL tokenizes its own, a finished completion (pbrl's `*_finished`) followed by the end-of-turn
    as sampled, so that CoMLRL's scorer cuts and scores it as it would its own sample (what it
    scores is then what CoMLRL's own round-file reader, `MADPOIterTrainer._preference_tensors_from_text`,
    gives it: the end-of-turn and the last content token are left out either way)."""
    from comlrl.trainers.preference.madpo import AgentPreferenceTensors, PreferencePair
    end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")

    def ids(text, finished):
        return torch.tensor(tok.encode(text, add_special_tokens=False) + ([end_of_turn] if finished else []))

    pairs = []
    for p in json.loads(path.read_text())["pairs"]:
        tensors = [AgentPreferenceTensors(prompt_input_ids=torch.tensor(tok.encode(prompt, add_special_tokens=False)),
                                          winner_completion_ids=ids(w, wf), loser_completion_ids=ids(l, lf))
                   for prompt, w, l, wf, lf in zip(p["prompts"], p["winner_completions"], p["loser_completions"],
                                                   p["winner_finished"], p["loser_finished"])]
        pairs.append(PreferencePair(prompts=p["prompts"], winner_completions=p["winner_completions"],
                                    loser_completions=p["loser_completions"], agent_tensors=tensors,
                                    winner_reward=p["winner_reward"], loser_reward=p["loser_reward"],
                                    candidate_reward_mean=p["candidate_reward_mean"]))
    return pairs


def madpo_trainer(qs, tok, agents, formatter, items, **config):
    """CoMLRL's MADPOTrainer on the quickstart's team, items, sampling settings and reward; `config`
    adds MADPOConfig fields (the collection and training budget)."""
    from comlrl.trainers.preference import MADPOConfig, MADPOTrainer
    from datasets import Dataset

    args = MADPOConfig(num_agents=2, max_new_tokens=max(qs["max_new_tokens"]), temperature=qs["temperature"],
                       top_p=qs["top_p"], top_k=qs["top_k"], eval_interval=0, agent_devices=["cpu", "cpu"], **config)
    return MADPOTrainer(agents=agents, num_agents=2, tokenizer=tok, train_dataset=Dataset.from_list(items),
                        reward_func=lambda c1, c2: [length_ratio(c1[0], c2[0])],
                        formatters=[formatter(0), formatter(1)], args=args)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "1")))
    ap.add_argument("--items", type=int, default=None, help="the first N train items (default: all)")
    ap.add_argument("--untrained", action="store_true", help="save the base agents (a check of the protocol)")
    ap.add_argument("--scorer", choices=["reference", "harness"], default="reference",
                    help="reference (default): completions also trimmed at SmolLM2's end-of-turn <|im_end|>, so "
                         "the scorer leaves out the end-of-turn and the last content token, as CoMLRL does with "
                         "SmolLM2's own pad token and pbrl with score_last_token = false; harness: trimmed at the "
                         "harness's pad <|endoftext|> only, so the last content token is scored (pbrl's nearest "
                         "is score_last_token = true)")
    ap.add_argument("--pairs", default=None,
                    help="a pbrl round file: train on its pairs instead of collecting (experiments/comlrl.sh's "
                         "side `comlrl-on-pbrl`: pbrl's data, CoMLRL's training loop)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    os.environ.setdefault("WANDB_MODE", "disabled")
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    from comlrl.trainers.preference import MADPOTrainer

    qs = tomllib.loads((ROOT / "configs" / "quickstart.toml").read_text())
    assert qs["reward"]["kind"] == "length_ratio" and (qs["reward"]["target_min"], qs["reward"]["target_max"]) == (2.0, 3.0)
    limits = qs["max_new_tokens"]
    tok, agents, formatter = quickstart_team()
    lines = (ROOT / qs["task"]["train_file"]).read_text().splitlines()
    items = [json.loads(l) for l in lines[: a.items]]
    trainer = madpo_trainer(
        qs, tok, agents, formatter, items, num_train_epochs=qs["num_train_epochs"],
        preference_num_candidates=qs["preference_num_candidates"],
        preference_pairs_per_sample=qs["preference_pairs_per_sample"],
        train_batch_size=qs["train_batch_size"], agent_learning_rate=qs["agent_learning_rate"])
    args = trainer.args
    if a.scorer == "reference":
        # The harness's pad is <|endoftext|> (bench_comlrl.quickstart_team: CoMLRL cuts prompts at
        # the first pad, and a chat prompt holds <|im_end|>), so CoMLRL's scorer would cut a
        # completion only after its end-of-turn; cut it at the end-of-turn too.
        end_of_turn = tok.convert_tokens_to_ids("<|im_end|>")
        trim = MADPOTrainer._trim_completion_tokens
        MADPOTrainer._trim_completion_tokens = staticmethod(lambda ids, pad: trim(trim(ids, pad), end_of_turn))
        pad = tok.pad_token_id
        check = MADPOTrainer._trim_completion_tokens(torch.tensor([5, 6, end_of_turn, pad, pad]), pad).tolist()
        assert check == [5, 6] and pad != end_of_turn, (check, pad, end_of_turn)
    generate = trainer._generate_completions_with_external_prompts

    def per_agent_limit(agent, batch, agent_idx=0, **kw):
        kw["max_new_tokens"] = limits[agent_idx]
        return generate(agent, batch, agent_idx=agent_idx, **kw)

    trainer._generate_completions_with_external_prompts = per_agent_limit
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    report = {"seed": a.seed, "threads": a.threads, "items": len(items), "dpo_beta": args.dpo_beta,
              "scorer": a.scorer}
    if a.pairs:
        t = time.perf_counter()
        pairs = pairs_from_round(tok, Path(a.pairs))
        report["pairs_from"] = a.pairs
        report["num_pairs"] = len(pairs)
        print(f"CoMLRL: {len(pairs)} pairs from {a.pairs}", flush=True)
        trainer._train_preference_pairs(pairs)
        report["train_s"] = time.perf_counter() - t
        print(f"CoMLRL MADPO training: {report['train_s']:.0f} s", flush=True)
    elif not a.untrained:
        t = time.perf_counter()
        pairs = trainer._build_preference_dataset()
        report["collect_s"] = time.perf_counter() - t
        report["num_pairs"] = len(pairs)
        print(f"CoMLRL collection: {len(pairs)} pairs in {report['collect_s']:.0f} s", flush=True)
        # The collected pairs, so that pbrl can train on CoMLRL's round (experiments/comlrl.sh's
        # side `pbrl-on-comlrl`, through experiments/comlrl/pairs_to_round.py).
        (out / "pairs.json").write_text(json.dumps([{
            "prompts": p.prompts, "winner_completions": p.winner_completions,
            "loser_completions": p.loser_completions, "winner_reward": p.winner_reward,
            "loser_reward": p.loser_reward, "candidate_reward_mean": p.candidate_reward_mean,
            "winner_completion_ids": [t.winner_completion_ids.tolist() for t in p.agent_tensors],
            "loser_completion_ids": [t.loser_completion_ids.tolist() for t in p.agent_tensors],
            "prompt_input_ids": [t.prompt_input_ids.tolist() for t in p.agent_tensors]} for p in pairs]))
        t = time.perf_counter()
        trainer._train_preference_pairs(pairs)
        report["train_s"] = time.perf_counter() - t
        print(f"CoMLRL MADPO training: {report['train_s']:.0f} s", flush=True)
    for i, agent in enumerate(trainer.agents):
        save_plain(agent, tok, out / "agents" / f"agent_{i}")
    (out / "agents" / "team.json").write_text(json.dumps({"num_actors": 2, "agents": ["agent_0", "agent_1"]}))
    report["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    (out / "comlrl.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
