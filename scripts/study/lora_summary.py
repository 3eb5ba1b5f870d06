#!/usr/bin/env python3
"""The LoRA study's table (scripts/study/lora_study.sh): per seed, the paired gains of the full
and the LoRA agents over the base (eval reports: the first of a run directory is the base team's,
the last its saved agents'), their paired difference, and the mean ± s.e. over seeds.

  lora_summary.py DIR [NAME [OTHER]]   (NAME: lora_study.sh's LoRA run name without -sSEED,
                                        default lora-lr1e-4; OTHER: a second LoRA run name,
                                        e.g. the f32 base's, to pair NAME's saved agents with)

Where the run has `final-after/` (keep-best saved earlier agents), its final agents' evaluation
against the saved ones is printed too.

  lora_summary.py --marlhf LORA_STUDY FULL_STUDY TASK BACKEND
      MARLHF with LoRA agents against whole agents (two scripts/study/marlhf_study.sh
      directories with the same bases and reward models): per seed, each run's paired gain over
      the base evaluation (`eval0.log`) and LoRA − full, the saved agents' (`eval.log`), then the
      mean ± s.e. over seeds.
"""
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_summary import mean_se, paired, per_prompt, report_of  # noqa: E402


def saved_agents(run):
    """The per-prompt means of a run's last evaluation (its saved agents)."""
    return per_prompt(sorted((run / "eval").glob("*.json"))[-1])[0]


def main(root, name, other=None):
    gains = defaultdict(list)
    for full in sorted(root.glob("full-s*")):
        seed = full.name.split("-s")[-1]
        lora = root / f"{name}-s{seed}"
        reports = [sorted((d / "eval").glob("*.json")) for d in (full, lora)]
        if any(len(r) < 2 for r in reports):
            print(f"seed {seed}: incomplete")
            continue
        base, _ = per_prompt(reports[0][0])
        after = [per_prompt(r[-1])[0] for r in reports]
        rows = {"full": paired(base, after[0]), "lora": paired(base, after[1]),
                "lora - full": paired(after[0], after[1])}
        final = sorted((lora / "final-after" / "eval").glob("*.json"))
        if final:
            rows["lora final - saved"] = paired(after[1], per_prompt(final[-1])[0])
        if other:
            rows[f"- {other}"] = paired(saved_agents(root / f"{other}-s{seed}"), after[1])
        print(f"seed {seed}: base {sum(base.values()) / len(base):.3f}  "
              + "  ".join(f"{k} {m:+.3f} ± {s:.3f}" for k, (m, s) in rows.items()))
        for k, (m, _) in rows.items():
            gains[k].append(m)
    if len(gains["full"]) > 1:
        gains.pop("lora final - saved", None)  # only the seeds where keep-best saved earlier agents
        print(f"over {len(gains['full'])} seeds: "
              + "  ".join(f"{k} {m:+.3f} ± {s:.3f}" for k, (m, s) in ((k, mean_se(v)) for k, v in gains.items())))


def marlhf(lora_root, full_root, task, backend):
    gains = defaultdict(list)
    for lora_seed in sorted((lora_root / task).glob("seed*")):
        seeds = [lora_seed, full_root / task / lora_seed.name]
        if not all((s / backend / "done").exists() for s in seeds):
            print(f"{lora_seed.name}: incomplete")
            continue
        base, full_base = (per_prompt(report_of(s / "eval0.log"))[0] for s in seeds)
        if base != full_base:
            print(f"{lora_seed.name}: the two runs start from different base evaluations")
            continue
        lora, full = (per_prompt(report_of(s / backend / "eval.log"))[0] for s in seeds)
        rows = {"lora": paired(base, lora), "full": paired(base, full), "lora - full": paired(full, lora)}
        print(f"{lora_seed.name}: base {sum(base.values()) / len(base):.3f}  "
              + "  ".join(f"{k} {m:+.3f} ± {s:.3f}" for k, (m, s) in rows.items()))
        for k, (m, _) in rows.items():
            gains[k].append(m)
    if len(gains["lora"]) > 1:
        print(f"over {len(gains['lora'])} seeds: "
              + "  ".join(f"{k} {m:+.3f} ± {s:.3f}" for k, (m, s) in ((k, mean_se(v)) for k, v in gains.items())))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--marlhf"]:
        marlhf(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5])
        sys.exit(0)
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "lora-lr1e-4", sys.argv[3] if len(sys.argv) > 3 else None)
