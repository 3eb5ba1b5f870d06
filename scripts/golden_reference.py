#!/usr/bin/env python3
"""Independent reference numbers for pbrl's model runtime, from PyTorch + transformers.

Run once (scripts/golden_reference.sh makes the venv); the outputs are committed under
tests/fixtures/ and pbrl's tests compare against them:

  smollm2_golden.json + smollm2_logits.safetensors
      token ids of fixed strings, the ChatML rendering of a prompt, logits of that prompt
      (every 7th vocabulary column at every position, the full last row) and greedy ids,
      from transformers loading the same GGUF file pbrl loads.
  tiny_<name>/ + tiny_<name>/golden.json
      small random Llama and Qwen2 models (GQA, Qwen2 q/k/v bias, tied and untied heads)
      saved as Hugging Face directories, with logits and completion log-probs of a
      right-padded batch.
"""
import json
import zlib
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures"
GGUF_DIR = ROOT / "models" / "smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TOKENIZER_STRINGS = [
    "Hello world",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "Tabs\tand\nnewlines,   runs of spaces  and 12345 digits.",
    "Accented: café, naïve, Zürich; CJK: 日本語; emoji: 🚀🙂",
    "def f(x): return x**2  # it's fine, we'll see",
    "<|endoftext|><|im_end|> raw special tokens",
]
USER_PROMPT = "Write one sentence about the sea."


def smollm2():
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
    model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32)
    model.eval()
    ids = {s: tok.encode(s, add_special_tokens=False) for s in TOKENIZER_STRINGS}
    chat = tok.apply_chat_template([{"role": "user", "content": USER_PROMPT}], tokenize=False, add_generation_prompt=True)
    chat_sys = tok.apply_chat_template(
        [{"role": "system", "content": "You are brief."}, {"role": "user", "content": USER_PROMPT}],
        tokenize=False, add_generation_prompt=True)
    prompt_ids = tok.encode(chat, add_special_tokens=False)
    with torch.no_grad():
        logits = model(torch.tensor([prompt_ids])).logits[0].float()
        out = model.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                             max_new_tokens=24, do_sample=False, eos_token_id=2, pad_token_id=0)
    greedy = out[0, len(prompt_ids):].tolist()
    save_file({"logits_every7": logits[:, ::7].contiguous(), "last_row": logits[-1].contiguous()},
              str(FIX / "smollm2_logits.safetensors"))
    (FIX / "smollm2_golden.json").write_text(json.dumps({
        "tokenizer_ids": ids, "user_prompt": USER_PROMPT, "chat_prompt": chat,
        "chat_prompt_with_system": chat_sys, "prompt_ids": prompt_ids, "greedy_ids": greedy,
        "greedy_text": tok.decode(greedy, skip_special_tokens=True),
        "transformers": __import__("transformers").__version__, "torch": torch.__version__,
    }, indent=1, ensure_ascii=False))
    print("smollm2: prompt", len(prompt_ids), "tokens; greedy:", repr(tok.decode(greedy, skip_special_tokens=True)))


def word_tokenizer(vocab_size):
    from tokenizers import Tokenizer, models, pre_tokenizers
    words = ["<pad>", "<eos>", "<unk>"] + [f"w{i}" for i in range(vocab_size - 3)]
    t = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    t.add_special_tokens(["<pad>", "<eos>"])
    return t


def tiny(name, cls, cfg_cls, **kw):
    torch.manual_seed(zlib.crc32(name.encode()) % 1000 + 7)
    cfg = cfg_cls(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, rope_theta=10000.0, bos_token_id=None, eos_token_id=1, pad_token_id=0, **kw)
    model = cls(cfg).float().eval()
    with torch.no_grad():  # transformers inits small; widen so logits are not all ~0
        for p in model.parameters():
            p.mul_(4.0) if p.dim() > 1 else p.add_(torch.randn_like(p) * 0.1)
    out = FIX / f"tiny_{name}"
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    word_tokenizer(64).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<pad>"}))
    g = torch.Generator().manual_seed(3)
    rows = [(torch.randint(3, 64, (p,), generator=g).tolist(), torch.randint(3, 64, (c,), generator=g).tolist())
            for p, c in [(5, 4), (3, 6), (7, 1), (2, 3)]]
    seqs = [p + c for p, c in rows]
    L = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (L - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (L - len(s)) for s in seqs])
    with torch.no_grad():
        logits = model(ids, attention_mask=mask).logits.float()
    lp = torch.log_softmax(logits.double(), -1)
    seq_lp_all, seq_lp_excl = [], []
    for b, (p, c) in enumerate(rows):
        toks = [lp[b, len(p) - 1 + k, c[k]].item() for k in range(len(c))]
        seq_lp_all.append(sum(toks))
        seq_lp_excl.append(sum(toks[:-1]))
    (out / "golden.json").write_text(json.dumps({
        "rows": [{"prompt": p, "completion": c} for p, c in rows],
        "logits": [logits[b, : len(s)].tolist() for b, s in enumerate(seqs)],
        "seq_logprob_include_last": seq_lp_all, "seq_logprob_exclude_last": seq_lp_excl,
    }))
    print(name, "saved")


if __name__ == "__main__":
    torch.set_num_threads(int(os.environ.get("THREADS", "2")))
    if "--tiny-only" not in sys.argv:
        smollm2()
    tiny("llama_tied", LlamaForCausalLM, LlamaConfig, tie_word_embeddings=True)
    tiny("llama_untied", LlamaForCausalLM, LlamaConfig, tie_word_embeddings=False)
    tiny("qwen2_untied", Qwen2ForCausalLM, Qwen2Config, tie_word_embeddings=False)
    tiny("qwen2_tied", Qwen2ForCausalLM, Qwen2Config, tie_word_embeddings=True)
