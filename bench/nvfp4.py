"""NVFP4 beside FP8 on one model, in one run: perplexity ratio vs the unquantized model and weight bytes.

    python bench/nvfp4.py [MODEL_DIR] [--kv-cache fp8|none] [--num-samples N] [--seq-len T]
                          [--eval-samples N] [--json]

MODEL_DIR is a Hugging Face model directory or a model-stage artifact with `hf/` inside (default:
build/tiny-cpu/model). FP8 runs the quantize stage's own code (trtbuild.quantize.quantization.run_quantize);
NVFP4 runs ModelOpt's flow with mtq.NVFP4_DEFAULT_CFG on CPU (trtbuild.quantize.modelopt_nvfp4, its block
fake quantization substituted by trtbuild.runtime.nvfp4_blocks), then its export and the bit-for-bit export check.
Both use the same calibration and evaluation windows of the same config.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import quantize_args

from trtbuild.core.progress import Progress
from trtbuild.quantize.modelopt_nvfp4 import quantize_nvfp4
from trtbuild.quantize.quantization import run_quantize


def main() -> int:
    args = quantize_args.parse(__doc__.splitlines()[0])
    if not (args.model_dir / "config.json").is_file():
        print(f"bench/nvfp4.py: {args.model_dir} has no config.json: pass a Hugging Face model directory",
              file=sys.stderr)
        return 2
    # the FP8 runtime check is bench/quantize.py's; this bench compares formats
    config = quantize_args.config(args, check_export=False)
    progress = Progress.for_terminal(not args.json)
    with tempfile.TemporaryDirectory() as tmp:
        fp8 = run_quantize(config, args.model_dir, Path(tmp) / "fp8", progress=progress).metrics
        nv = quantize_nvfp4(config, args.model_dir, Path(tmp) / "nvfp4", progress=progress)
    if args.json:
        print(json.dumps({"fp8": fp8, "nvfp4": nv}, indent=2))
        return 0
    base_bytes = fp8["weight_bytes_base"]
    print(f"model: {args.model_dir}   kv cache: {args.kv_cache}   eval: {nv['eval_tokens']} tokens predicted; "
          f"calibration {nv['calibration_samples']} x {args.seq_len} tokens")
    print(f"{'':10}{'perplexity':>12}{'ratio':>10}{'weight bytes':>16}{'/ base':>9}")
    print(f"{'base':10}{fp8['perplexity_base']:>12.4f}{1.0:>10.5f}{base_bytes:>16,}{1.0:>9.3f}")
    for label, m in (("FP8", fp8), ("NVFP4", nv)):
        print(f"{label:10}{m['perplexity_quantized']:>12.4f}{m['perplexity_ratio']:>10.5f}"
              f"{m['weight_bytes_quantized']:>16,}{m['weight_bytes_quantized'] / base_bytes:>9.3f}")
    if abs(fp8["perplexity_base"] - nv["perplexity_base"]) > 1e-9 * fp8["perplexity_base"]:
        print(f"warning: the two runs' base perplexities differ ({fp8['perplexity_base']} vs {nv['perplexity_base']})")
    print(f"NVFP4 export check: {nv['nvfp4_linears_checked']} linears' packed values, weight_scale, "
          f"weight_scale_2 and input_scale equal trtbuild.runtime.nvfp4_blocks of the calibrated weights bit for bit; "
          f"kept: {', '.join(nv['excluded_modules']) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
