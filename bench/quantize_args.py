"""The command line both quantize benches take (bench/quantize.py, bench/nvfp4.py) and the QuantizeConfig
it gives: the same calibration and evaluation windows, a gate that reports and never fails."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from trtbuild.quantize.config import QuantizeConfig


def parse(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("model_dir", nargs="?", default="build/tiny-cpu/model", type=Path)
    parser.add_argument("--kv-cache", choices=["fp8", "none"], default="fp8")
    parser.add_argument("--num-samples", type=int, default=128)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--eval-samples", type=int, default=None)
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON instead of a table")
    args = parser.parse_args()
    if (args.model_dir / "hf" / "config.json").is_file():  # an artifact dir of the model stage
        args.model_dir = args.model_dir / "hf"
    return args


def config(args: argparse.Namespace, **fields: Any) -> QuantizeConfig:
    return QuantizeConfig.model_validate({
        "kv_cache": args.kv_cache,
        "calibration": {"num_samples": args.num_samples, "seq_len": args.seq_len},
        # The benches report the ratio; they do not enforce a threshold.
        "gate": {"seq_len": args.seq_len, "eval_samples": args.eval_samples, "max_perplexity_ratio": 1000},
        **fields,
    })
