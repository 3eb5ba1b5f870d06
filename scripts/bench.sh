#!/usr/bin/env bash
# pbrl against a PyTorch baseline, side by side on this machine, same model and token ids.
# Writes target/bench/report.json (with the CPU model, its vector ISAs, the thread count and the
# GEMM kernels pbrl uses) and prints a table of ratios. Run on an idle machine.
#   BENCH_THREADS (default 2), BENCH_STEPS (default 3), BENCH_VENV (default .venv-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${BENCH_THREADS:-2}; STEPS=${BENCH_STEPS:-3}; VENV=${BENCH_VENV:-.venv-bench}
OUT=target/bench; mkdir -p "$OUT"
scripts/fetch-model.sh
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, transformers, gguf, accelerate, comlrl, datasets, peft" 2>/dev/null; then
  echo "making the baseline venv $VENV (torch, transformers, gguf, accelerate, comlrl 1.4.3, peft)..."
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch transformers gguf accelerate datasets comlrl==1.4.3 peft
fi
cargo build --release --bin pbrl --bench runtime
BIN=$(cargo bench --bench runtime --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; print([j["executable"] for j in map(json.loads, sys.stdin) if j.get("executable") and j["target"]["name"] == "runtime"][-1])')

# Each measurement in its own process, so peak RSS is the measured work's own.
echo "== pbrl train step"; "$BIN" train --threads "$T" --steps "$STEPS" --out "$OUT/pbrl_train.json"
echo "== pytorch train step"; "$VENV/bin/python" scripts/bench_torch.py train --threads "$T" --steps "$STEPS" --pbrl "$OUT/pbrl_train.json" --out "$OUT/torch_train.json"
# LoRA (r 16, alpha 32, all 7 projections): pbrl's adapters on a frozen base,
# PEFT's on the same shapes.
echo "== pbrl train step, LoRA"; "$BIN" train --threads "$T" --steps "$STEPS" --lora 16 --out "$OUT/pbrl_train_lora.json"
echo "== pytorch train step, PEFT LoRA"; "$VENV/bin/python" scripts/bench_torch.py train --threads "$T" --steps "$STEPS" --lora 16 --pbrl "$OUT/pbrl_train.json" --out "$OUT/torch_train_peft.json"
# The same LoRA step with the base's products on bf16 inputs (a bf16 base, compute_dtype = "bf16"),
# and PEFT's under PyTorch's bf16 autocast.
echo "== pbrl train step, LoRA, bf16 products"; "$BIN" train --threads "$T" --steps "$STEPS" --lora 16 --base-dtype bf16 --compute-dtype bf16 --out "$OUT/pbrl_train_lora_bf16.json"
echo "== pytorch train step, PEFT LoRA, bf16 autocast"; "$VENV/bin/python" scripts/bench_torch.py train --threads "$T" --steps "$STEPS" --lora 16 --autocast-bf16 --pbrl "$OUT/pbrl_train.json" --out "$OUT/torch_train_peft_bf16.json"
echo "== pbrl sampling"; "$BIN" sample --threads "$T" --out "$OUT/pbrl_sample.json"
echo "== hf generate"; "$VENV/bin/python" scripts/bench_torch.py sample --threads "$T" --pbrl "$OUT/pbrl_sample.json" --out "$OUT/torch_sample.json"

# Preference collection (8 items x 4 candidates x 2 agents x 32 new tokens, the same prompts),
# then MADPO training on that round (train_batch_size 2, 1 epoch); CoMLRL trains on the same
# round file. Each pbrl stage runs in its own process, timed with its peak RSS. The reference's
# MADPO (reference-free, no keep-best), whatever the quickstart's own defaults are.
measure() { # measure OUT.json COMMAND...: wall seconds and peak RSS (MiB) of one process
  local out=$1; shift
  python3 - "$out" "$@" <<'PY'
import json, resource, subprocess, sys, time
t = time.perf_counter()
subprocess.run(sys.argv[2:], check=True)
secs = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
json.dump({"wall_s": secs, "peak_rss_mib": rss}, open(sys.argv[1], "w"))
PY
}
head -8 data/length_ratio/train.jsonl > "$OUT/train8.jsonl"
rm -rf "$OUT/collect-run"
common=(--config configs/quickstart.toml --run-dir "$OUT/collect-run" --threads "$T" task.train_file="$OUT/train8.jsonl"
  preference_num_candidates=4 preference_pairs_per_sample=2 max_new_tokens=32 temperature=0.6 top_p=0.6 top_k=50
  collect_batch_size=8 train_batch_size=2 num_train_epochs=1 agent_learning_rate=5e-6 dpo_beta=0.1 eval_interval=0
  madpo_reference=false score_last_token=false keep_best=false eval_split=eval_file)
echo "== pbrl collect"; measure "$OUT/pbrl_collect.json" target/release/pbrl collect "${common[@]}"
echo "== pbrl train-madpo"; measure "$OUT/pbrl_madpo.json" target/release/pbrl train-madpo "${common[@]}"
# The same collect + MADPO with LoRA agents, over an f32 and a q8_0 base.
for base in f32 q8_0; do
  rm -rf "$OUT/collect-run-lora-$base"
  lora=("${common[@]/$OUT\/collect-run/$OUT/collect-run-lora-$base}" agent_lora.r=16 agent_lora.alpha=32 agent_lora.base_dtype="\"$base\"")
  echo "== pbrl collect, LoRA ($base base)"; measure "$OUT/pbrl_collect_lora_$base.json" target/release/pbrl collect "${lora[@]}"
  echo "== pbrl train-madpo, LoRA ($base base)"; measure "$OUT/pbrl_madpo_lora_$base.json" target/release/pbrl train-madpo "${lora[@]}"
  # The same training on the same round with activation checkpointing (each decoder layer keeps
  # its input only): what a LoRA team needs when memory is what counts.
  rm -rf "$OUT/madpo-lora-ckpt-$base"; mkdir -p "$OUT/madpo-lora-ckpt-$base"
  cp -r "$OUT/collect-run-lora-$base/preference_replay" "$OUT/madpo-lora-ckpt-$base/"
  echo "== pbrl train-madpo, LoRA ($base base), checkpointed"
  measure "$OUT/pbrl_madpo_lora_${base}_ckpt.json" target/release/pbrl train-madpo \
    "${lora[@]/$OUT\/collect-run-lora-$base/$OUT/madpo-lora-ckpt-$base}" gradient_checkpointing=true
done
echo "== comlrl collect + MADPO on pbrl's round"
"$VENV/bin/python" scripts/bench_comlrl.py --threads "$T" --round "$OUT/collect-run/preference_replay/iteration_0001.json" \
  --out "$OUT/comlrl.json"

# MARLHF on the same round in a fresh run directory: fit-rm (the whole model, lr 1e-5, 1 epoch,
# no held-out share, as the reference), then train-marlhf (magrpo, num_generations 4, one epoch over the 8 items); CoMLRL's
# MARLHFTrainer the same way, in its own process.
rm -rf "$OUT/marlhf-run"; mkdir -p "$OUT/marlhf-run"
cp -r "$OUT/collect-run/preference_replay" "$OUT/marlhf-run/"
# The reference's reward-model settings (the quickstart's own MARLHF settings differ).
marlhf=("${common[@]/$OUT\/collect-run/$OUT/marlhf-run}" rl_algorithm=magrpo num_generations=4 reward_eval_fraction=0
  reward_freeze_backbone=false reward_learning_rate=1e-5 reward_num_train_epochs=1)
echo "== pbrl fit-rm"; measure "$OUT/pbrl_fit_rm.json" target/release/pbrl fit-rm "${marlhf[@]}"
echo "== pbrl train-marlhf"; measure "$OUT/pbrl_train_marlhf.json" target/release/pbrl train-marlhf "${marlhf[@]}"
echo "== comlrl MARLHF on pbrl's round"
"$VENV/bin/python" scripts/bench_comlrl.py --threads "$T" --marlhf \
  --round "$OUT/collect-run/preference_replay/iteration_0001.json" --out "$OUT/comlrl_marlhf.json"

# Iterative MADPO: 4 items x 2 rounds against the current team (the same candidate, pair and
# training settings, and the reference's iterative comparator_reward selection whatever the
# quickstart sets), no evaluations; CoMLRL's MADPOIterTrainer.train() the same way.
head -4 data/length_ratio/train.jsonl > "$OUT/train4.jsonl"
rm -rf "$OUT/iterate-run"
iter=("${common[@]/$OUT\/collect-run/$OUT/iterate-run}" task.train_file="$OUT/train4.jsonl" num_iterations=2
  comparator_policy=current eval_num_samples=0 pair_selection=comparator_reward)
echo "== pbrl iterate"; measure "$OUT/pbrl_iterate.json" target/release/pbrl iterate "${iter[@]}"
echo "== comlrl MADPOIter"
rm -rf "$OUT/comlrl-iterate-rounds"
"$VENV/bin/python" scripts/bench_comlrl.py --threads "$T" --items 4 --iterate 2 --out "$OUT/comlrl_iterate.json"

# A 2-turn MAGRPO epoch on the task reward over the 8 items: every agent answers, reads the
# other's answer through the default debate transition, answers again (K 2 per node, a buffer of
# one item's 3 nodes, no early termination); CoMLRL's MAGRPOTrainer with the same transition.
rm -rf "$OUT/turns-run"
turns=(--config configs/quickstart.toml --run-dir "$OUT/turns-run" --threads "$T" task.train_file="$OUT/train8.jsonl"
  max_new_tokens=32 temperature=0.6 top_p=0.6 top_k=50 num_generations=2 rollout_buffer_size=3 train_batch_size=3
  num_train_epochs=1 agent_learning_rate=5e-6 eval_interval=0 keep_best=false eval_split=eval_file
  lr_scheduler_type=constant num_turns=2 rl_reward=task early_termination_threshold=none transition.kind=debate)
echo "== pbrl train-marlhf, 2-turn debates"; measure "$OUT/pbrl_turns.json" target/release/pbrl train-marlhf "${turns[@]}"
echo "== comlrl MAGRPO, 2-turn debates"
"$VENV/bin/python" scripts/bench_comlrl.py --threads "$T" --turns --out "$OUT/comlrl_turns.json"

python3 - "$OUT" <<'PY'
import json, platform, sys
d = sys.argv[1]


def machine(gemm):
    """The CPU the figures belong to: model name, the vector ISAs it offers, what pbrl's GEMM uses."""
    info = open("/proc/cpuinfo").read() if platform.system() == "Linux" else ""
    model = next((l.split(":", 1)[1].strip() for l in info.splitlines() if l.startswith("model name")), platform.processor())
    flags = set(next((l.split(":", 1)[1].split() for l in info.splitlines() if l.startswith("flags")), []))
    isa = [f for f in ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
                       "amx_tile"] if f in flags]
    return {"cpu_model": model, "isa": isa, "logical_cpus": info.count("processor\t:"), "pbrl_gemm_kernels": gemm}


r = {k: json.load(open(f"{d}/{k}.json")) for k in ["pbrl_train", "torch_train", "pbrl_sample", "torch_sample", "pbrl_collect",
                                                   "pbrl_madpo", "comlrl", "pbrl_fit_rm", "pbrl_train_marlhf",
                                                   "comlrl_marlhf", "pbrl_iterate", "comlrl_iterate", "pbrl_train_lora",
                                                   "torch_train_peft", "pbrl_train_lora_bf16", "torch_train_peft_bf16", "pbrl_collect_lora_f32", "pbrl_madpo_lora_f32",
                                                   "pbrl_collect_lora_q8_0", "pbrl_madpo_lora_q8_0",
                                                   "pbrl_madpo_lora_f32_ckpt", "pbrl_madpo_lora_q8_0_ckpt",
                                                   "pbrl_turns", "comlrl_turns"]}
num_pairs = json.load(open(f"{d}/collect-run/preference_replay/iteration_0001.json"))["num_pairs"]


def update_seconds(run, stage):
    """pbrl's time in its updates (`time/update_s` of the stage's records in metrics.jsonl): the
    phase CoMLRL's `madpo_train_s` times, model loading and saving left out."""
    records = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
    return sum(x["time/update_s"] for x in records if x.get("stage") == stage and "time/update_s" in x)


report = {
    "sampling_tokens_per_s": {"pbrl": r["pbrl_sample"]["tokens_per_s"], "hf_generate": r["torch_sample"]["tokens_per_s"]},
    "train_step_s": {"pbrl": r["pbrl_train"]["step_s"], "pytorch": r["torch_train"]["step_s"],
                     "pbrl_lora": r["pbrl_train_lora"]["step_s"], "pytorch_peft": r["torch_train_peft"]["step_s"],
                     "pbrl_lora_bf16": r["pbrl_train_lora_bf16"]["step_s"],
                     "pytorch_peft_bf16": r["torch_train_peft_bf16"]["step_s"]},
    "train_step_phases_s": {k: {p: r[k][p] for p in ["forward_s", "backward_s", "adamw_s"]} for k in ["pbrl_train", "torch_train"]},
    "collect_s": {"pbrl": r["pbrl_collect"]["wall_s"], "comlrl": r["comlrl"]["collect_s"]},
    "madpo_train_s": {"pbrl": r["pbrl_madpo"]["wall_s"], "comlrl": r["comlrl"]["madpo_train_s"], "num_pairs": num_pairs,
                      "pbrl_lora": r["pbrl_madpo_lora_f32"]["wall_s"], "pbrl_lora_q8_0": r["pbrl_madpo_lora_q8_0"]["wall_s"],
                      "pbrl_lora_ckpt": r["pbrl_madpo_lora_f32_ckpt"]["wall_s"],
                      "pbrl_lora_q8_0_ckpt": r["pbrl_madpo_lora_q8_0_ckpt"]["wall_s"],
                      "pbrl_updates": update_seconds(f"{d}/collect-run", "train-madpo")},
    # pbrl: each process's wall time (model loading included); CoMLRL: the phase alone
    "marlhf_rm_s": {"pbrl": r["pbrl_fit_rm"]["wall_s"], "comlrl": r["comlrl_marlhf"]["marlhf_rm_s"]},
    "marlhf_rl_s": {"pbrl": r["pbrl_train_marlhf"]["wall_s"], "comlrl": r["comlrl_marlhf"]["marlhf_rl_s"]},
    "madpo_iter_s": {"pbrl": r["pbrl_iterate"]["wall_s"], "comlrl": r["comlrl_iterate"]["madpo_iter_s"]},
    "magrpo_turns_s": {"pbrl": r["pbrl_turns"]["wall_s"], "comlrl": r["comlrl_turns"]["magrpo_turns_s"]},
    "peak_rss_mib": {
        "train_step": {"pbrl": r["pbrl_train"]["peak_rss_mib"], "pytorch": r["torch_train"]["peak_rss_mib"]},
        # pbrl: the larger of its collect and train-madpo processes; CoMLRL: its one collect + train process
        "madpo_run": {"pbrl": max(r["pbrl_collect"]["peak_rss_mib"], r["pbrl_madpo"]["peak_rss_mib"]),
                      "comlrl": r["comlrl"]["peak_rss_mib"],
                      **{f"pbrl_lora{'' if b == 'f32' else '_' + b}": max(r[f"pbrl_collect_lora_{b}"]["peak_rss_mib"],
                                                                          r[f"pbrl_madpo_lora_{b}"]["peak_rss_mib"])
                         for b in ("f32", "q8_0")},
                      # the same with checkpointed training (collection does not train)
                      **{f"pbrl_lora{'' if b == 'f32' else '_' + b}_ckpt":
                         max(r[f"pbrl_collect_lora_{b}"]["peak_rss_mib"], r[f"pbrl_madpo_lora_{b}_ckpt"]["peak_rss_mib"])
                         for b in ("f32", "q8_0")}},
        # pbrl: the largest of its collect, fit-rm and train-marlhf processes; CoMLRL: its one process
        "marlhf_run": {"pbrl": max(r["pbrl_collect"]["peak_rss_mib"], r["pbrl_fit_rm"]["peak_rss_mib"],
                                   r["pbrl_train_marlhf"]["peak_rss_mib"]),
                       "comlrl": r["comlrl_marlhf"]["peak_rss_mib"]},
        "madpo_iter_run": {"pbrl": r["pbrl_iterate"]["peak_rss_mib"], "comlrl": r["comlrl_iterate"]["peak_rss_mib"]},
        "magrpo_turns_run": {"pbrl": r["pbrl_turns"]["peak_rss_mib"], "comlrl": r["comlrl_turns"]["peak_rss_mib"]},
    },
    "threads": r["pbrl_train"]["threads"],
    # the kernel rule pbrl's linear layers followed (crates/pbrl-model/src/gemm/; PBRL_GEMM forces one)
    "machine": machine(r["pbrl_train"]["gemm_kernels"]),
}
json.dump(report, open(f"{d}/report.json", "w"), indent=1)
s, t, m = report["sampling_tokens_per_s"], report["train_step_s"], report["peak_rss_mib"]
ph = report["train_step_phases_s"]
mc = report["machine"]
print(f"\nCPU: {mc['cpu_model']} ({', '.join(mc['isa'])}); {report['threads']} threads; pbrl GEMM: {mc['pbrl_gemm_kernels']}")
print(f"{'measure':<40}{'pbrl':>10}{'baseline':>10}{'ratio':>8}  target")
print(f"{'sampling tok/s (8x64 vs HF b=1)':<40}{s['pbrl']:>10.1f}{s['hf_generate']:>10.1f}{s['pbrl']/s['hf_generate']:>8.2f}  >= 3.0")
print(f"{'train step s (B=4x128)':<40}{t['pbrl']:>10.2f}{t['pytorch']:>10.2f}{t['pbrl']/t['pytorch']:>8.2f}  <= 1.0")
for p in ["forward_s", "backward_s", "adamw_s"]:
    print(f"{'  ' + p:<40}{ph['pbrl_train'][p]:>10.2f}{ph['torch_train'][p]:>10.2f}{ph['pbrl_train'][p]/ph['torch_train'][p]:>8.2f}")
ts = m["train_step"]
print(f"{'train step peak RSS MiB':<40}{ts['pbrl']:>10.0f}{ts['pytorch']:>10.0f}{ts['pbrl']/ts['pytorch']:>8.2f}  <= 1.0")
def row(label, x, target, digits=1):
    """One line against CoMLRL: pbrl, CoMLRL, their ratio and the target."""
    print(f"{label:<40}{x['pbrl']:>10.{digits}f}{x['comlrl']:>10.{digits}f}{x['pbrl']/x['comlrl']:>8.2f}  {target}")


row("collect s (8 items x 4 cand, wall)", report["collect_s"], "<= 0.33")
row(f"MADPO train s ({num_pairs} pairs, batch 2, wall)", report["madpo_train_s"], "<= 0.5")
mt = report["madpo_train_s"]
row("  the updates alone, as CoMLRL's figure", {"pbrl": mt["pbrl_updates"], "comlrl": mt["comlrl"]}, "<= 0.5")
row("collect + MADPO peak RSS MiB", m["madpo_run"], "<= 0.6", 0)
row("MARLHF reward model s (fit, wall)", report["marlhf_rm_s"], "<= 0.5")
row("MARLHF RL s (magrpo, 8 items)", report["marlhf_rl_s"], "<= 0.5")
row("collect + MARLHF peak RSS MiB", m["marlhf_run"], "<= 0.6", 0)
row("iterative MADPO s (4 items x 2 rounds)", report["madpo_iter_s"], "<= 0.5")
row("iterative MADPO peak RSS MiB", m["madpo_iter_run"], "<= 0.6", 0)
row("2-turn MAGRPO epoch s (8 items, wall)", report["magrpo_turns_s"], "<= 0.5")
row("2-turn MAGRPO peak RSS MiB", m["magrpo_turns_run"], "<= 0.6", 0)
# LoRA against the full fine-tunes of the same run.
print(f"{'LoRA train step s vs PEFT':<40}{t['pbrl_lora']:>10.2f}{t['pytorch_peft']:>10.2f}{t['pbrl_lora']/t['pytorch_peft']:>8.2f}  <= 0.8")
print(f"{'LoRA train step s vs pbrl full':<40}{t['pbrl_lora']:>10.2f}{t['pbrl']:>10.2f}{t['pbrl_lora']/t['pbrl']:>8.2f}  <= 0.6")
print(f"{'  bf16 products vs PEFT bf16 autocast':<40}{t['pbrl_lora_bf16']:>10.2f}{t['pytorch_peft_bf16']:>10.2f}"
      f"{t['pbrl_lora_bf16']/t['pytorch_peft_bf16']:>8.2f}")
print(f"{'  bf16 products vs pbrl full':<40}{t['pbrl_lora_bf16']:>10.2f}{t['pbrl']:>10.2f}{t['pbrl_lora_bf16']/t['pbrl']:>8.2f}")
for key, target in [("pbrl_lora", "<= 0.25"), ("pbrl_lora_q8_0", "<= 0.15"), ("pbrl_lora_ckpt", "<= 0.25"),
                    ("pbrl_lora_q8_0_ckpt", "<= 0.15")]:
    row(f"collect + MADPO RSS, {key}", {"pbrl": m["madpo_run"][key], "comlrl": m["madpo_run"]["comlrl"]}, target, 0)
    mt = report["madpo_train_s"]
    row(f"MADPO train s, {key}", {"pbrl": mt[key], "comlrl": mt["comlrl"]}, "")
print(f"report: {d}/report.json")
PY
