#!/usr/bin/env bash
# GPU checks of the `cuda` build, on a machine with a CUDA GPU (docs/benchmarks.md, "GPU").
# Needs binaries built elsewhere with `--features cuda`, gathered in $BIN:
#   pbrl, runtime (the bench), and the test binaries named in TESTS below
# and python3 with torch, transformers, tokenizers and peft (for the random model and the
# baselines).
#   BIN=.gpu OUT=/tmp/gpu scripts/gpu_check.sh
# 1. tests/cuda.rs (GPU against CPU, stages end to end on cuda:0, a LoRA team too), then the
#    device-generic fixture tests (transformers, CoMLRL, PEFT, bf16/q8_0 bases) with
#    PBRL_TEST_DEVICE=cuda:0;
# 2. a SmolLM2-135M-shaped model with random weights: pbrl's train step (full, and LoRA r 8 over
#    an f32, bf16 and q8_0 base) and sampling against PyTorch (and PEFT) on the same GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu}
OUT=${OUT:-target/gpu}   # gets tests.log and gpu_report.json; the rest goes to $WORK
WORK=${WORK:-/tmp/pbrl-gpu-work}
mkdir -p "$OUT" "$WORK"
# The GPU memory in use, sampled every 50 ms while a command runs: gpu_mem NAME CMD...
gpu_mem() {
  local name=$1; shift
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 50 >"$WORK/mem_$name.txt" 2>/dev/null &
  local sampler=$! rc
  "$@"; rc=$?
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  return $rc
}
status=0
nvidia-smi -L || true
# candle's cuBLAS/cuRAND/NVRTC: the system's, else PyTorch's wheels.
libs=$(python3 -c 'import nvidia, os, glob; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/**/lib*.so*", recursive=True)})))' 2>/dev/null)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs"
export PBRL_TEST_REPO=$PWD PBRL_TEST_BIN=$PWD/$BIN/pbrl

echo "=== tests on cuda:0 ==="
TESTS=${TESTS:-cuda transformers_fixtures golden_madpo golden_lora families golden_reward_model golden_policy_gradient golden_actor_critic}
for t in $TESTS; do
  echo "--- $t" | tee -a "$OUT/tests.log"
  PBRL_TEST_DEVICE=cuda:0 "$BIN/$t" --test-threads=1 2>&1 | tee -a "$OUT/tests.log" || status=1
done

echo "=== SmolLM2-135M-shaped model, random weights ==="
M=/tmp/random-smollm2
python3 scripts/fixtures/random_smollm2.py "$M" || exit 1
for mode in train sample; do
  gpu_mem pbrl_$mode "$BIN/runtime" $mode --model "$M" --device cuda:0 --steps 5 --out "$WORK/pbrl_$mode.json" || status=1
  gpu_mem torch_$mode python3 scripts/bench_torch.py $mode --pbrl "$WORK/pbrl_$mode.json" --model "$M" --device cuda \
    --steps 5 --out "$WORK/torch_$mode.json" || status=1
done
for base in f32 bf16 q8_0; do
  gpu_mem pbrl_lora_$base "$BIN/runtime" train --model "$M" --device cuda:0 --steps 5 --lora 8 --base-dtype $base \
    --out "$WORK/pbrl_lora_$base.json" || status=1
done
gpu_mem torch_lora python3 scripts/bench_torch.py train --pbrl "$WORK/pbrl_train.json" --model "$M" --device cuda \
  --steps 5 --lora 8 --out "$WORK/torch_lora.json" || status=1
python3 - "$WORK" "$OUT" <<'PY'
import glob, json, os, sys
o, out = sys.argv[1], sys.argv[2]
r = {}
for mode in ("train", "sample"):
    p, t = (json.load(open(f"{o}/{w}_{mode}.json")) for w in ("pbrl", "torch"))
    r[mode] = {"pbrl": {k: v for k, v in p.items() if k not in ("rows", "prompt", "losses")},
               "torch": {k: v for k, v in t.items() if k != "losses"}}
r["train_step_ratio"] = r["train"]["pbrl"]["step_s"] / r["train"]["torch"]["step_s"]
drop = ("rows", "prompt", "losses")
r["lora_r8"] = {b: {k: v for k, v in json.load(open(f"{o}/pbrl_lora_{b}.json")).items() if k not in drop}
                for b in ("f32", "bf16", "q8_0")}
r["lora_r8"]["peft"] = {k: v for k, v in json.load(open(f"{o}/torch_lora.json")).items() if k != "losses"}
r["lora_step_ratio_vs_peft"] = r["lora_r8"]["f32"]["step_s"] / r["lora_r8"]["peft"]["step_s"]
r["sample_tok_s_ratio"] = r["sample"]["pbrl"]["tokens_per_s"] / r["sample"]["torch"]["tokens_per_s"]
# Peak GPU memory in use while each run ran (nvidia-smi, MiB; includes the CUDA context).
r["peak_gpu_used_mib"] = {os.path.basename(p)[4:-4]: max([int(x) for x in open(p).read().split() if x.isdigit()] or [0])
                          for p in sorted(glob.glob(f"{o}/mem_*.txt"))}
json.dump(r, open(f"{out}/gpu_report.json", "w"), indent=1)
print(json.dumps(r, indent=1))
PY
exit $status
