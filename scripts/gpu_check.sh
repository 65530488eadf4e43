#!/usr/bin/env bash
# One prepared GPU check (one H100/H200, no network, <= 8 minutes): writes bench/gpu-<time>.md.
#   (1) each GEMM plugin vs torch._scaled_mm and a device copy at M = 1..16 on Llama-3.1-8B and
#       Maverick (tp 8) linear shapes, with the max error vs the torch reference;
#   (2) trtbuild's runtime decode tokens/s on a random-weight Llama-3.1-8B-shaped FP8 target, plugin
#       op vs torch._scaled_mm (TRTBUILD_GEMM), plain and speculative with a random EAGLE-3 draft;
#   (3) the draft stage's EAGLE-3 training step time on a random-weight ~1B-parameter target (speed only).
# Needs torch (CUDA), triton, safetensors, numpy (section 3: transformers and nvidia-modelopt, else its
# row says skipped); no TensorRT-LLM or network. PYTHON picks the interpreter (default python3). Exits 3
# with one line when there is no CUDA device. Each section runs under its own timeout
# (195 s + 200 s + 55 s) and keeps the rows it finished.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY="${PYTHON:-python3}"
if ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "no CUDA device: $PY cannot import torch (set PYTHON to the interpreter with CUDA torch)"; exit 3
fi
if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)' >/dev/null 2>&1; then
  echo "no CUDA device"; exit 3
fi
OUT="bench/gpu-$(date +%Y%m%d-%H%M%S).md"
mkdir -p bench
echo "# GPU check $(date -u +%FT%TZ)" > "$OUT"
"$PY" -c 'import platform, torch, triton; p = torch.cuda.get_device_properties(0)
print(f"- {p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}; torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), triton {triton.__version__}, Python {platform.python_version()}")' >> "$OUT" 2>&1
echo "## 1. kernels" >> "$OUT"
timeout -k 10 195 "$PY" scripts/gpu_bench.py --budget-s 150 \
  --shapes 6144x4096,4096x4096,28672x4096,4096x14336,896x5120,5120x640,4096x5120,5120x2048,2048x5120,5120x1024 \
  --ms 1,2,4,8,16 --out "$OUT.kernels" || echo "- section 1 exited with $?" >> "$OUT"
[ -f "$OUT.kernels" ] && cat "$OUT.kernels" >> "$OUT" && rm -f "$OUT.kernels"
echo "## 2. runtime decode (random Llama-3.1-8B-shaped FP8 target, random EAGLE-3 draft)" >> "$OUT"
timeout -k 10 200 "$PY" scripts/gpu_runtime_check.py >> "$OUT" 2>"$OUT.err" || \
  { echo "- section 2 exited with $?: $(tail -n 3 "$OUT.err" | tr '\n' ' ')" >> "$OUT"; }
rm -f "$OUT.err"
echo "## 3. draft training step (random ~1B Llama target, the draft stage's loop)" >> "$OUT"
timeout -k 10 55 "$PY" scripts/gpu_draft_train_check.py >> "$OUT" 2>"$OUT.err" || \
  { echo "- section 3 exited with $?: $(tail -n 3 "$OUT.err" | tr '\n' ' ')" >> "$OUT"; }
rm -f "$OUT.err"
echo "wrote $OUT"
