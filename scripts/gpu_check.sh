#!/usr/bin/env bash
# One prepared GPU check (one H100/H200, no network, <= 8 minutes): writes bench/gpu-<time>.md.
#   (1) each GEMM plugin vs torch._scaled_mm and a device copy at M = 1..16 on Llama-3.1-8B and
#       Maverick (tp 8) linear shapes, with the max error vs the torch reference;
#   (2) trtbuild's runtime decode tokens/s on a random-weight Llama-3.1-8B-shaped FP8 target,
#       plugin op vs torch._scaled_mm (TRTBUILD_GEMM), plain decoding.
# Exits 3 with one line when there is no CUDA device. Each section runs under its own timeout.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' 2>/dev/null; then
  echo "no CUDA device"; exit 3
fi
OUT="bench/gpu-$(date +%Y%m%d-%H%M%S).md"
mkdir -p bench
echo "# GPU check $(date -u +%FT%TZ)" > "$OUT"
echo "## 1. kernels" >> "$OUT"
timeout -k 10 300 "$PY" scripts/gpu_bench.py --budget-s 240 \
  --shapes 6144x4096,4096x4096,28672x4096,4096x14336,896x5120,5120x640,4096x5120,5120x2048,2048x5120,5120x1024 \
  --ms 1,2,4,8,16 --out "$OUT.kernels" || echo "- section 1 exited with $?" >> "$OUT"
[ -f "$OUT.kernels" ] && cat "$OUT.kernels" >> "$OUT" && rm -f "$OUT.kernels"
echo "## 2. runtime decode (random Llama-3.1-8B-shaped FP8 target)" >> "$OUT"
timeout -k 10 150 "$PY" scripts/gpu_runtime_check.py >> "$OUT" 2>"$OUT.err" || \
  { echo "- section 2 exited with $?: $(tail -n 3 "$OUT.err" | tr '\n' ' ')" >> "$OUT"; }
rm -f "$OUT.err"
echo "wrote $OUT"
