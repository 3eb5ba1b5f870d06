#!/usr/bin/env python3
"""Load a pbrl export with transformers and compare its logits with pbrl's.

  python scripts/check_export.py AGENT_DIR CASE.safetensors [TOLERANCE]

CASE holds `ids` (1, n) and `logits` (1, n, vocab) computed by pbrl on the exported weights.
Prints one JSON line (max |Δ logit|, the generation settings transformers reads) and exits 1
when the logits differ by more than TOLERANCE (default 1e-4; the 30-layer SmolLM2 uses 1e-3,
as its logits test against transformers does). Used by the tests when PBRL_REF_PYTHON is set.
"""
import json
import sys

import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

agent, case = sys.argv[1], load_file(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(agent, dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(case["ids"].long()).logits.float()
diff = (logits - case["logits"]).abs().max().item()
gen = GenerationConfig.from_pretrained(agent)
tok = AutoTokenizer.from_pretrained(agent)
chat = tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True) \
    if tok.chat_template else None
print(json.dumps({"max_abs_diff": diff, "rope": model.config.rope_parameters, "chat_hi": chat,
                  "generation": {k: getattr(gen, k) for k in ("do_sample", "temperature", "top_p", "top_k", "max_new_tokens")}}))
sys.exit(0 if diff < (float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4) else 1)
