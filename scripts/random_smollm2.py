#!/usr/bin/env python3
"""A SmolLM2-135M-shaped Llama with random weights, as a Hugging Face directory, for timing runs
on machines that cannot hold the bundled GGUF (scripts/gpu_check.sh): same layer sizes, heads,
vocabulary and tied head, so every kernel does the real model's work. Its tokenizer is a
word-level one over the same vocabulary size (no chat template); nothing it writes is meaningful.

  random_smollm2.py OUT_DIR        (needs torch, transformers, tokenizers)
"""
import json
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB = 49152


def main(out: Path):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True,
                      bos_token_id=1, eos_token_id=2, pad_token_id=2)
    model = LlamaForCausalLM(cfg)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    words = {"<unk>": 0, "<|endoftext|>": 1, "<|im_end|>": 2}
    words.update({f"w{i}": i for i in range(3, VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}))
    n = sum(p.numel() for p in model.parameters())
    print(f"random SmolLM2-135M-shaped model ({n / 1e6:.1f}M parameters) in {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
