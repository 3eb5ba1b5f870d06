#!/usr/bin/env python3
"""MARLHF's MAGRPO-family advantages from CoMLRL 1.4.3's own code, as a fixture for pbrl's tests.

Run once: `python3 scripts/golden_advantages.py` (the venv of scripts/golden_madpo.py; GOLDEN_VENV
names another). For fixed groups of returns and per-sample reference KLs it calls
`MAGRPOTrainer._apply_reference_kl_to_returns` and `_compute_advantages` for every
advantage_mode, with reference KL on and off, then normalizes as `_compute_loss_with_gradients`
does (population std, floored at 1e-6, when the group has more than one sample), and writes
tests/fixtures/golden_advantages.json.
"""
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("golden_madpo", HERE / "golden_madpo.py")
golden_madpo = importlib.util.module_from_spec(spec)
spec.loader.exec_module(golden_madpo)
OUT = HERE.parent / "tests" / "fixtures" / "golden_advantages.json"

GROUPS = [  # (returns, reference KLs per sample)
    ([0.2, 0.9, 0.4, 0.9], [0.01, 0.3, 0.0, 0.12]),
    ([1.0, 1.0, 1.0], [0.5, 0.0, 0.25]),       # equal returns: std 0 before the KL
    ([-0.3], [0.2]),                           # one sample: rloo falls back to mean, no normalization
    ([0.0, 2.5], [1.5, 0.0]),
    ([0.7, 0.1, 0.1, 0.3, 0.95, 0.05], [0.0, 0.02, 0.4, 0.1, 0.0, 0.3]),
]


def main():
    golden_madpo.ensure_venv()
    import torch
    from comlrl.trainers.reinforce.magrpo import MAGRPOTrainer
    cases = []
    for mode in ["mean", "raw", "max", "rloo"]:
        for kl in [False, True]:
            for norm in [False, True]:
                t = MAGRPOTrainer.__new__(MAGRPOTrainer)  # only the advantage methods are used
                t.args = SimpleNamespace(reference_kl_enabled=kl, reference_kl_coef=0.3, advantage_normalization=norm)
                t.advantage_mode = mode
                for returns, kls in GROUPS:
                    r = torch.tensor(returns, dtype=torch.float)
                    eff = t._apply_reference_kl_to_returns(r, {"reference_kls": kls})
                    a = t._compute_advantages(eff)
                    if t.args.advantage_normalization and a.numel() > 1:  # as _compute_loss_with_gradients
                        a = (a - a.mean()) / a.std(unbiased=False).clamp(min=1e-6)
                    cases.append({"mode": mode, "reference_kl": kl, "normalize": norm, "kl_coef": 0.3,
                                  "returns": returns, "kls": kls, "advantages": a.tolist()})
    OUT.write_text(json.dumps({"comlrl": "1.4.3", "torch": torch.__version__, "cases": cases}, indent=1))
    print("wrote", OUT, len(cases), "cases")


if __name__ == "__main__":
    main()
