#!/usr/bin/env bash
# The GPU flow, for a machine with a CUDA device (run from the repository root):
#   1. every op's kernels on the device against the LLVM path (pytest -m gpu),
#   2. meta_schedule tuning of a handful of kernels for the device's arch, shipped as a database,
#   3. an AOT library for that arch from the tuned database.
# Usage: scripts/gpu_check.sh [ARCH] [TRIALS]     (default sm_90, 64 trials per kernel)
set -euo pipefail
ARCH="${1:-sm_90}"
TRIALS="${2:-64}"
OUT="${OUT:-gpu-results}"
PY="${PY:-.venv/bin/python}"
mkdir -p "$OUT"
"$PY" -m pytest -m gpu tests/test_gpu.py -q -p no:cacheprovider | tee "$OUT/pytest-gpu.txt"
"$PY" -m tvmgrad.cli tune --target "cuda:$ARCH" --dtype float32 --trials "$TRIALS" --db "$OUT/tuning" \
    --ops relu_grad gelu_grad atan2_grad layer_norm_grad log_softmax_grad softmax_grad 2>&1 | tee "$OUT/tune.txt"
TVMGRAD_TUNING_DB="$OUT/tuning" "$PY" -m tvmgrad.cli build --target cuda --arch "$ARCH" \
    --dtype float32,float16,bfloat16 --out "$OUT/lib-cuda" 2>&1 | tail -5 | tee "$OUT/build.txt"
