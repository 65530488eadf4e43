"""FP8 quantization benchmark: perplexity of the base model vs its ModelOpt FP8 version, and sizes.

    python bench/quantize.py [MODEL_DIR] [--kv-cache fp8|none] [--num-samples N] [--seq-len T]
                             [--eval-samples N] [--json]

MODEL_DIR is a Hugging Face model directory, or a model-stage artifact with `hf/` inside
(default: build/tiny-cpu/model, what `trtbuild build recipes/tiny-cpu.yaml` links). The quantize stage's
own code runs (calibration, gate with no threshold, export, runtime check) into a temp dir.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import quantize_args

from trtbuild.core.progress import Progress
from trtbuild.quantize.stage import run_quantize


def main() -> int:
    args = quantize_args.parse(__doc__.splitlines()[0])
    config = quantize_args.config(args)
    with tempfile.TemporaryDirectory() as tmp:
        progress = Progress.for_terminal(not args.json)
        result = run_quantize(config, args.model_dir, Path(tmp), progress=progress)
    m = result.metrics
    if args.json:
        print(json.dumps(m, indent=2))
        return 0

    rows = [
        ("perplexity", f"{m['perplexity_base']:.4f}", f"{m['perplexity_quantized']:.4f}",
         f"{m['perplexity_ratio']:.5f}"),
        ("weight bytes", f"{m['weight_bytes_base']:,}", f"{m['weight_bytes_quantized']:,}",
         f"{m['weight_bytes_ratio']:.3f}"),
    ]
    print(f"model: {args.model_dir}   device: {m['device']}   kv cache: {args.kv_cache}   "
          f"eval: {m['eval_samples']} x {args.seq_len} tokens ({m['eval_tokens']} predicted)")
    print(f"{'':14}{'base':>16}{'FP8':>16}{'FP8 / base':>14}")
    for name, base, fp8, ratio in rows:
        print(f"{name:14}{base:>16}{fp8:>16}{ratio:>14}")
    print(f"calibration: {m['calibration_samples']} x {args.seq_len} tokens "
          f"in {m['calibration_seconds']:.1f} s; "
          f"{m['quantized_linears']} linears FP8, {m['unquantized_linears']} kept "
          f"({', '.join(result.info['excluded_modules'])})")
    if m.get("export_check") == "passed":
        print("export check (runtime on the FP8 files vs ModelOpt fake quant, layer by layer): worst layer "
              f"{m['export_layer_error_worst_layer']} off by {m['export_layer_error_median']:.2g} of its "
              f"contribution at the median position (worst position {m['export_layer_error_max']:.2g}); head "
              f"{m['export_head_noise_median']:.2g} x the FP8 effect, min cosine "
              f"{m['export_head_logits_min_cosine']:.7f}; free-running (not judged: rounding flips cascade) "
              f"{m['export_free_running_noise_median']:.2g} x the FP8 effect, argmax agreement "
              f"{m['export_free_running_argmax_agreement']:.4f}")
    else:
        print(f"export check: {m.get('export_check')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
