#!/usr/bin/env python3
"""Load a pbrl LoRA agent with PEFT and compare its logits with pbrl's.

  python scripts/check_adapter.py AGENT_DIR CASE.safetensors [TOLERANCE]

AGENT_DIR is a PEFT adapter directory pbrl saved (adapter_config.json names the base: a Hugging
Face directory, or a GGUF file, which transformers reads with `gguf_file=`, undoing llama.cpp's
q/k row order as pbrl does); CASE holds `ids` (1, n) and `logits` (1, n, vocab) computed by pbrl. Loads the
base with transformers and the adapter with `PeftModel.from_pretrained`, prints one JSON line
(max |Δ logit|) and exits 1 above TOLERANCE (default 1e-4). Used by the tests when
PBRL_REF_PYTHON is set (a venv with peft).
"""
import json
import sys
from pathlib import Path

import torch
from peft import PeftConfig, PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

agent, case = sys.argv[1], load_file(sys.argv[2])
source = Path(PeftConfig.from_pretrained(agent).base_model_name_or_path)
if source.suffix == ".gguf":
    base = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
else:
    base = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
model = PeftModel.from_pretrained(base, agent).eval()
with torch.no_grad():
    logits = model(input_ids=case["ids"].long()).logits.float()
diff = (logits - case["logits"]).abs().max().item()
print(json.dumps({"max_abs_diff": diff}))
sys.exit(0 if diff < (float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4) else 1)
