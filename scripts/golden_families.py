#!/usr/bin/env python3
"""Fixtures for every model family, RoPE type and chat template pbrl supports, from transformers 5.

Run once with a venv that has torch and transformers 5 (see README, Development); the outputs
are committed under tests/fixtures/families/ and tests/families.rs compares pbrl against them:

  <name>/            a tiny random model saved by `save_pretrained` (config.json in transformers 5's
                     layout, model.safetensors, a word-level tokenizer with the family's special
                     tokens, the family's real chat template as chat_template.jinja where it has one)
  <name>/config_v4.json   the same config in the older layout (top-level rope_theta / rope_scaling)
  <name>/logits.safetensors, golden.json   logits of a right-padded batch with long rows, greedy tokens, the chat
                     template's renderings, and how far the logits move with the wrong RoPE (so a
                     test that passes proves the RoPE settings are read)

Chat templates: templates/ holds the vendors' templates (Meta's Llama 3.2 Instruct, Qwen's Qwen3).
"""
import copy
import json
import os
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast,
                          Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "families"
TEMPLATES = FIX / "templates"
VOCAB = 96
CHAT_CASES = [
    {"system": None, "user": "Write one sentence about the sea.", "kwargs": {}},
    {"system": "You are brief.", "user": "  Name a colour.  ", "kwargs": {}},
]


def word_tokenizer(specials):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<pad>", "<unk>"] + specials + [f"w{i}" for i in range(VOCAB - 2 - len(specials))]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens(["<pad>"] + specials)
    return t, {w: i for i, w in enumerate(words)}


def wrong_ropes(cfg_dict):
    """What a reader that misses the settings runs: plain RoPE at base 10000, and (for a scaled type
    that changes numbers inside the context) the right base without the scaling."""
    rp = cfg_dict["rope_parameters"]
    out = {"base": {"rope_type": "default", "rope_theta": 10000.0}}
    if rp["rope_type"] not in ("default", "dynamic"):
        out["scaling"] = {"rope_type": "default", "rope_theta": rp["rope_theta"]}
    return {k: {**copy.deepcopy(cfg_dict), "rope_parameters": v} for k, v in out.items()}


def to_v4(cfg_dict):
    """transformers 4's layout: rope_theta at top level, scaling in rope_scaling (with `type`)."""
    d = copy.deepcopy(cfg_dict)
    rp = d.pop("rope_parameters")
    d["rope_theta"] = rp.pop("rope_theta")
    kind = rp.pop("rope_type", "default")
    d["rope_scaling"] = None if kind == "default" else {"type": kind, **rp}
    return d


def build(name, model_cls, cfg_cls, specials, eos, template=None, bos=None, **kw):
    torch.manual_seed(zlib.crc32(name.encode()) % 1000 + 11)
    tok, ids = word_tokenizer(specials)
    eos_ids = [ids[e] for e in eos]
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
                  bos_token_id=ids[bos] if bos else None, eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
                  pad_token_id=0, **kw)
    model = model_cls(cfg).float().eval()
    with torch.no_grad():  # transformers inits small; widen so logits are not all ~0
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    out = FIX / name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    tok.save(str(out / "tokenizer.json"))
    tcfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos[-1], "pad_token": "<pad>", "unk_token": "<unk>"}
    if bos:
        tcfg["bos_token"] = bos
    (out / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))
    if template:
        (out / "chat_template.jinja").write_text((TEMPLATES / template).read_text())
    cfg_dict = json.loads((out / "config.json").read_text())
    (out / "config_v4.json").write_text(json.dumps(to_v4(cfg_dict), indent=2))

    # Rows long enough that RoPE scaling shows (positions up to ~110 of a 128 context).
    g = torch.Generator().manual_seed(5)
    lo = 2 + len(specials)
    rows = [(torch.randint(lo, VOCAB, (p,), generator=g).tolist(), torch.randint(lo, VOCAB, (c,), generator=g).tolist())
            for p, c in [(90, 20), (40, 7), (64, 30)]]
    seqs = [p + c for p, c in rows]
    L = max(map(len, seqs))
    batch = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])

    def logits_of(m):
        with torch.no_grad():
            return m(batch, attention_mask=mask).logits.float()

    logits = logits_of(model)
    # The same weights read by transformers from the older layout must give the same logits.
    v4 = cfg_cls.from_dict(to_v4(cfg_dict))
    m4 = model_cls(v4).float().eval()
    m4.load_state_dict(model.state_dict())
    assert torch.allclose(logits_of(m4), logits, atol=1e-5), f"{name}: transformers reads the v4 layout differently"
    wrong = {}
    for what, d in wrong_ropes(cfg_dict).items():
        mw = model_cls(cfg_cls.from_dict(d)).float().eval()
        mw.load_state_dict(model.state_dict())
        wrong[what] = max((logits_of(mw)[b, : len(s)] - logits[b, : len(s)]).abs().max().item()
                          for b, s in enumerate(seqs))

    prompt = rows[0][0][:48]
    with torch.no_grad():
        gen = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             max_new_tokens=12, do_sample=False, eos_token_id=eos_ids, pad_token_id=0)
    greedy = gen[0, len(prompt):].tolist()

    chat = []
    if template:
        hf_tok = AutoTokenizer.from_pretrained(out)
        for case in CHAT_CASES + TEMPLATE_EXTRA.get(template, []):
            case = {**case, "kwargs": {**FIXED_KWARGS.get(template, {}), **case["kwargs"]}}
            msgs = ([{"role": "system", "content": case["system"]}] if case["system"] else [])
            msgs.append({"role": "user", "content": case["user"]})
            text = hf_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **case["kwargs"])
            chat.append({**case, "text": text})
    save_file({"logits": logits.contiguous()}, str(out / "logits.safetensors"))  # (rows, longest, vocab), padded
    (out / "golden.json").write_text(json.dumps({
        "rows": [{"prompt": p, "completion": c} for p, c in rows],
        "greedy_prompt": prompt, "greedy_ids": greedy, "stop_ids": eos_ids,
        "wrong_rope_max_abs_diff": wrong, "chat": chat,
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
    }))
    print(f"{name}: saved; logits move by {wrong} with the wrong RoPE; greedy {greedy}")
    return min(wrong.values())


LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
# Llama 3.2's template prints today's date unless `date_string` is given: fixed for the fixture
# (tests/families.rs checks the date path separately).
FIXED_KWARGS = {"llama3.2-instruct.jinja": {"date_string": "26 Jul 2024"}}
TEMPLATE_EXTRA = {
    "llama3.2-instruct.jinja": [{"system": "You are brief.", "user": "Hi", "kwargs": {"date_string": "01 Jan 2025"}}],
    "qwen3.jinja": [{"system": None, "user": "Hi", "kwargs": {"enable_thinking": False}}],
}


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    moved = {}
    l3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 32}
    moved["llama3"] = build("llama3", LlamaForCausalLM, LlamaConfig, LLAMA3_SPECIALS, ["<|end_of_text|>", "<|eot_id|>"],
                            template="llama3.2-instruct.jinja", bos="<|begin_of_text|>", rope_parameters=l3,
                            tie_word_embeddings=True)
    moved["llama_linear"] = build("llama_linear", LlamaForCausalLM, LlamaConfig, LLAMA3_SPECIALS, ["<|eot_id|>"],
                                  rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
                                  tie_word_embeddings=False)
    moved["llama_dynamic"] = build("llama_dynamic", LlamaForCausalLM, LlamaConfig, LLAMA3_SPECIALS, ["<|eot_id|>"],
                                   rope_parameters={"rope_type": "dynamic", "rope_theta": 50000.0, "factor": 2.0},
                                   tie_word_embeddings=False)
    moved["qwen2_yarn"] = build("qwen2_yarn", Qwen2ForCausalLM, Qwen2Config, QWEN_SPECIALS, ["<|im_end|>"],
                                rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                 "original_max_position_embeddings": 32}, tie_word_embeddings=False)
    moved["qwen3"] = build("qwen3", Qwen3ForCausalLM, Qwen3Config, QWEN_SPECIALS, ["<|im_end|>", "<|endoftext|>"],
                           template="qwen3.jinja", head_dim=32,
                           rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, tie_word_embeddings=True)
    moved["qwen3_yarn"] = build("qwen3_yarn", Qwen3ForCausalLM, Qwen3Config, QWEN_SPECIALS, ["<|im_end|>"],
                                head_dim=16, rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                                                              "original_max_position_embeddings": 32},
                                tie_word_embeddings=False)
    for k, v in moved.items():
        assert v > 1e-2, f"{k}: the wrong RoPE moves logits by only {v}; the fixture would not catch it"
