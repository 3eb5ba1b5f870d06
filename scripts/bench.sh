#!/usr/bin/env bash
# pbrl against a PyTorch baseline, side by side on this machine, same model and token ids.
# Writes target/bench/report.json and prints a table of ratios. Run on an idle machine.
#   BENCH_THREADS (default 2), BENCH_STEPS (default 3), BENCH_VENV (default .venv-bench)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${BENCH_THREADS:-2}; STEPS=${BENCH_STEPS:-3}; VENV=${BENCH_VENV:-.venv-bench}
OUT=target/bench; mkdir -p "$OUT"
scripts/fetch-model.sh
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import torch, transformers, gguf, accelerate, comlrl, datasets" 2>/dev/null; then
  echo "making the baseline venv $VENV (torch, transformers, gguf, accelerate, comlrl 1.4.3)..."
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q torch transformers gguf accelerate datasets comlrl==1.4.3
fi
cargo build --release --bin pbrl --bench runtime
BIN=$(cargo bench --bench runtime --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys; print([j["executable"] for j in map(json.loads, sys.stdin) if j.get("executable") and j["target"]["name"] == "runtime"][-1])')

# Each measurement in its own process, so peak RSS is the measured work's own.
echo "== pbrl train step"; "$BIN" train --threads "$T" --steps "$STEPS" --out "$OUT/pbrl_train.json"
echo "== pytorch train step"; "$VENV/bin/python" scripts/bench_torch.py train --threads "$T" --steps "$STEPS" --pbrl "$OUT/pbrl_train.json" --out "$OUT/torch_train.json"
echo "== pbrl sampling"; "$BIN" sample --threads "$T" --out "$OUT/pbrl_sample.json"
echo "== hf generate"; "$VENV/bin/python" scripts/bench_torch.py sample --threads "$T" --pbrl "$OUT/pbrl_sample.json" --out "$OUT/torch_sample.json"

# Preference collection: 8 items x 4 candidates x 2 agents x 32 new tokens, the same prompts.
echo "== pbrl collect"
head -8 data/length_ratio/train.jsonl > "$OUT/train8.jsonl"
rm -rf "$OUT/collect-run"
start=$(date +%s.%N)
target/release/pbrl collect --config configs/quickstart.toml --run-dir "$OUT/collect-run" --threads "$T" \
  task.train_file="$OUT/train8.jsonl" preference_num_candidates=4 preference_pairs_per_sample=2 max_new_tokens=32 \
  temperature=0.6 top_p=0.6 top_k=50 collect_batch_size=8
python3 -c "import json,sys; json.dump({'collect_s': float(sys.argv[2]) - float(sys.argv[1])}, open('$OUT/pbrl_collect.json', 'w'))" "$start" "$(date +%s.%N)"
echo "== comlrl collect"; "$VENV/bin/python" scripts/bench_comlrl_collect.py --threads "$T" --out "$OUT/comlrl_collect.json"

python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
r = {k: json.load(open(f"{d}/{k}.json")) for k in ["pbrl_train", "torch_train", "pbrl_sample", "torch_sample", "pbrl_collect", "comlrl_collect"]}
report = {
    "sampling_tokens_per_s": {"pbrl": r["pbrl_sample"]["tokens_per_s"], "hf_generate": r["torch_sample"]["tokens_per_s"]},
    "train_step_s": {"pbrl": r["pbrl_train"]["step_s"], "pytorch": r["torch_train"]["step_s"]},
    "train_step_phases_s": {k: {p: r[k][p] for p in ["forward_s", "backward_s", "adamw_s"]} for k in ["pbrl_train", "torch_train"]},
    "peak_rss_mib": {"pbrl": r["pbrl_train"]["peak_rss_mib"], "pytorch": r["torch_train"]["peak_rss_mib"]},
    "collect_s": {"pbrl": r["pbrl_collect"]["collect_s"], "comlrl": r["comlrl_collect"]["collect_s"]},
    "threads": r["pbrl_train"]["threads"],
}
json.dump(report, open(f"{d}/report.json", "w"), indent=1)
s, t, m = report["sampling_tokens_per_s"], report["train_step_s"], report["peak_rss_mib"]
ph = report["train_step_phases_s"]
print(f"\n{'measure':<34}{'pbrl':>10}{'pytorch':>10}{'ratio':>8}  target")
print(f"{'sampling tok/s (8x64 vs HF b=1)':<34}{s['pbrl']:>10.1f}{s['hf_generate']:>10.1f}{s['pbrl']/s['hf_generate']:>8.2f}  >= 2.0")
print(f"{'train step s (B=4x128)':<34}{t['pbrl']:>10.2f}{t['pytorch']:>10.2f}{t['pbrl']/t['pytorch']:>8.2f}  <= 1.0")
for p in ["forward_s", "backward_s", "adamw_s"]:
    print(f"{'  ' + p:<34}{ph['pbrl_train'][p]:>10.2f}{ph['torch_train'][p]:>10.2f}{ph['pbrl_train'][p]/ph['torch_train'][p]:>8.2f}")
print(f"{'train step peak RSS MiB':<34}{m['pbrl']:>10.0f}{m['pytorch']:>10.0f}{m['pbrl']/m['pytorch']:>8.2f}  <= 1.0")
c = report["collect_s"]
print(f"{'collect s (8 items x 4 cand, wall)':<34}{c['pbrl']:>10.1f}{c['comlrl']:>10.1f}{c['pbrl']/c['comlrl']:>8.2f}  <= 0.33")
print(f"report: {d}/report.json")
PY
