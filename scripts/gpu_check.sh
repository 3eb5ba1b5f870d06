#!/usr/bin/env bash
# GPU checks of the `cuda` build, on a machine with a CUDA GPU (docs/benchmarks.md, "GPU").
# Needs binaries built elsewhere with `--features cuda`, gathered in $BIN:
#   pbrl, runtime (the bench), and the test binaries cuda, transformers_fixtures, golden_madpo
# and python3 with torch, transformers and tokenizers (for the random model and the baseline).
#   BIN=.gpu OUT=/tmp/gpu scripts/gpu_check.sh
# 1. tests/cuda.rs (GPU against CPU, stages end to end on cuda:0), then the transformers and
#    CoMLRL fixture tests with PBRL_TEST_DEVICE=cuda:0;
# 2. a SmolLM2-135M-shaped model with random weights: pbrl's train step and sampling against
#    PyTorch on the same GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.gpu}
OUT=${OUT:-target/gpu}
mkdir -p "$OUT"
status=0
nvidia-smi -L || true
# candle's cuBLAS/cuRAND/NVRTC: the system's, else PyTorch's wheels.
libs=$(python3 -c 'import nvidia, os, glob; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(d + "/**/lib*.so*", recursive=True)})))' 2>/dev/null)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$libs"
export PBRL_TEST_REPO=$PWD PBRL_TEST_BIN=$PWD/$BIN/pbrl

echo "=== tests on cuda:0 ==="
for t in cuda transformers_fixtures golden_madpo; do
  PBRL_TEST_DEVICE=cuda:0 "$BIN/$t" --test-threads=1 --nocapture 2>&1 | tee "$OUT/test_$t.log" || status=1
done

echo "=== SmolLM2-135M-shaped model, random weights ==="
M=/tmp/random-smollm2
python3 scripts/fixtures/random_smollm2.py "$M" || exit 1
for mode in train sample; do
  "$BIN/runtime" $mode --model "$M" --device cuda:0 --steps 5 --out "$OUT/pbrl_$mode.json" || status=1
  python3 scripts/bench_torch.py $mode --pbrl "$OUT/pbrl_$mode.json" --model "$M" --device cuda \
    --steps 5 --out "$OUT/torch_$mode.json" || status=1
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
r = {}
for mode in ("train", "sample"):
    p, t = (json.load(open(f"{o}/{w}_{mode}.json")) for w in ("pbrl", "torch"))
    r[mode] = {"pbrl": {k: v for k, v in p.items() if k not in ("rows", "prompt", "losses")},
               "torch": {k: v for k, v in t.items() if k != "losses"}}
r["train_step_ratio"] = r["train"]["pbrl"]["step_s"] / r["train"]["torch"]["step_s"]
r["sample_tok_s_ratio"] = r["sample"]["pbrl"]["tokens_per_s"] / r["sample"]["torch"]["tokens_per_s"]
json.dump(r, open(f"{o}/gpu_report.json", "w"), indent=1)
print(json.dumps(r, indent=1))
PY
exit $status
