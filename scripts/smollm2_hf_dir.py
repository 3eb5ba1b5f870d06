#!/usr/bin/env python3
"""The bundled SmolLM2 GGUF as a Hugging Face directory, converted by transformers 5 itself:
the format users bring (config.json with `rope_parameters`, chat_template.jinja, f32 safetensors).

  python scripts/smollm2_hf_dir.py [DEST]     (default models/smollm2-hf; needs torch, transformers, gguf)

tests/real_model.rs loads it beside the GGUF and checks that both give the same model.
"""
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
GGUF_DIR, GGUF_NAME = ROOT / "models" / "smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
dest = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "models" / "smollm2-hf"
tmp = dest.with_name(dest.name + ".part")
tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME)
gguf_model = AutoModelForCausalLM.from_pretrained(GGUF_DIR, gguf_file=GGUF_NAME, dtype=torch.float32)
# transformers marks a GGUF-loaded model as quantized (not serializable): move its dequantized
# weights into a plain model of the same config, then save that.
config = gguf_model.config
for attr in ("quantization_config",):
    if hasattr(config, attr):
        delattr(config, attr)
model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
model.load_state_dict(gguf_model.state_dict())
model.generation_config = gguf_model.generation_config
model.save_pretrained(tmp, safe_serialization=True)
tok.save_pretrained(tmp)
tmp.rename(dest)
print("wrote", dest, sorted(p.name for p in dest.iterdir()))
