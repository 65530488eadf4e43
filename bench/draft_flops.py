"""What a shipped draft's training pipeline cost in FLOPs, phase by phase, and what a GPU hour would buy
at that pipeline (issue 34). An estimate from the real files, not a measurement on a GPU.

    python bench/draft_flops.py drafts/smollm2-135m-instruct-eagle3 --target <hf dir> \
        [--cpu-hours 3.4,0.7,2.9] [--peak-tflops 989] [--bandwidth-tbs 3.35] [--utilization 0.3]

The matmul parameters come from the safetensors headers (the target's 2-D weights but its input
embedding, plus its LM head, tied or not; the draft's 2-D weights), the pool and schedule from the
draft's training-config.yaml and metrics.json, the request prefix from its chat template. A forward is
2 FLOPs per matmul parameter per token plus attention (4 x heads x head_dim x context per layer), a
training pass 3 forwards. Phases:
- requests: the target writes each request (Magpie): prefix + synthetic_request_tokens forwards, whole LM;
- answers: each pool row, seq_len positions through the whole LM (prefill and decode alike);
- dump: each row once through the decoder alone;
- training: steps x batch x seq_len tokens, each ttt_steps draft passes forward and backward, plus the
  target's LM head on the stored final state (the distillation labels).
The GPU time takes the slower of compute (FLOPs / peak / utilization) and, for the decoding phases,
memory traffic at the stage's batches (weights once a step, each row's K/V cache every step). The
defaults are an H100 SXM's datasheet figures (989 TFLOP/s dense BF16, 3.35 TB/s); `--cpu-hours`
(requests + answers, dump, training: what the run took here) turns into GFLOP/s this CPU reached.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import yaml

BF16_BYTES = 2


def weight_shapes(model_dir: Path) -> dict[str, list[int]]:
    from trtbuild.core.safetensors_header import read_header

    return {name: entry["shape"] for file in sorted(model_dir.glob("*.safetensors"))
            for name, entry in read_header(file).items()}


def matmul_params(shapes: dict[str, list[int]], skip: str = "embed_tokens") -> int:
    return sum(shape[0] * shape[1] for name, shape in shapes.items() if len(shape) == 2 and skip not in name)


def head_dim(config: dict[str, Any]) -> int:
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def attention_flops(config: dict[str, Any], layers: int, context: float) -> float:
    return 4.0 * config["num_attention_heads"] * head_dim(config) * context * layers


def pipeline(draft_dir: Path, target_dir: Path) -> dict[str, Any]:
    target_config = json.loads((target_dir / "config.json").read_text())
    draft_config = json.loads((draft_dir / "config.json").read_text())
    recipe = yaml.safe_load((draft_dir / "training-config.yaml").read_text())["draft"]
    metrics = json.loads((draft_dir / "metrics.json").read_text())
    hidden, vocab, layers = target_config["hidden_size"], target_config["vocab_size"], target_config["num_hidden_layers"]
    target_shapes = weight_shapes(target_dir)
    decoder = matmul_params({n: s for n, s in target_shapes.items() if "lm_head" not in n})
    head = hidden * vocab
    draft = matmul_params(weight_shapes(draft_dir))
    seq_len, rows = recipe["seq_len"], metrics["pool_sequences"]
    prefix = len(_request_prefix(draft_dir))
    request_len = prefix + recipe["synthetic_request_tokens"]

    def whole_lm(tokens: float, length: int) -> float:  # `tokens` positions of rows `length` long
        return tokens * (2.0 * (decoder + head) + attention_flops(target_config, layers, length / 2))

    train_tokens = metrics["train_steps"] * recipe["batch_size"] * seq_len
    draft_pass = 2.0 * draft + attention_flops(draft_config, draft_config["num_hidden_layers"], seq_len / 2)
    flops = {
        "requests": whole_lm(recipe["synthetic_requests"] * request_len, request_len),
        "answers": whole_lm(rows * seq_len, seq_len),
        "dump": rows * seq_len * (2.0 * decoder + attention_flops(target_config, layers, seq_len / 2)),
        "training": train_tokens * (3 * recipe["ttt_steps"] * draft_pass + 2.0 * head),
    }
    from trtbuild.draft.data import DataPlan
    from trtbuild.draft.requests import BATCH as REQUEST_BATCH

    kv_per_token = 2 * layers * target_config["num_key_value_heads"] * head_dim(target_config) * BF16_BYTES
    weights = (decoder + head) * BF16_BYTES

    def decode_bytes(count: int, length: int, batch: int) -> float:  # each step reads the weights once a batch
        return count / batch * length * weights + count * kv_per_token * length * length / 2

    traffic = {"requests": decode_bytes(recipe["synthetic_requests"], request_len, REQUEST_BATCH),
               "answers": decode_bytes(rows, seq_len, DataPlan.gen_batch), "dump": 0.0, "training": 0.0}
    return {"target_matmul_params": decoder + head, "draft_matmul_params": draft, "rows": rows,
            "seq_len": seq_len, "request_prefix_tokens": prefix, "train_tokens": train_tokens,
            "flops": flops, "decode_bytes": traffic}


def _request_prefix(draft_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    from trtbuild.draft.requests import user_turn_prefix
    return user_turn_prefix(AutoTokenizer.from_pretrained(draft_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("draft", type=Path, help="a shipped draft directory (scripts/ship_draft.py)")
    parser.add_argument("--target", type=Path, required=True, help="the target's HF directory")
    parser.add_argument("--cpu-hours", help="requests+answers,dump,training hours this machine took")
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--bandwidth-tbs", type=float, default=3.35)
    parser.add_argument("--utilization", type=float, default=0.3)
    args = parser.parse_args()
    result = pipeline(args.draft, args.target)
    flops, traffic = result["flops"], result["decode_bytes"]
    compute_rate = args.peak_tflops * 1e12 * args.utilization
    memory_rate = args.bandwidth_tbs * 1e12 * args.utilization
    gpu_seconds = {phase: max(flops[phase] / compute_rate, traffic[phase] / memory_rate) for phase in flops}
    total_seconds = sum(gpu_seconds.values())
    result["gpu_seconds"] = {phase: round(s, 1) for phase, s in gpu_seconds.items()}
    result["assumed"] = {"peak_tflops": args.peak_tflops, "bandwidth_tbs": args.bandwidth_tbs,
                         "utilization": args.utilization}
    result["pflop"] = {phase: round(f / 1e15, 3) for phase, f in flops.items()}
    result["pflop_total"] = round(sum(flops.values()) / 1e15, 3)
    result["gpu_seconds_total"] = round(total_seconds, 1)
    result["rows_per_gpu_hour"] = round(result["rows"] * 3600 / total_seconds)
    if args.cpu_hours:
        hours = [float(h) for h in args.cpu_hours.split(",")]
        if len(hours) != 3:
            parser.error("--cpu-hours takes three numbers: requests+answers, dump, training")
        done = [flops["requests"] + flops["answers"], flops["dump"], flops["training"]]
        result["cpu_gflops_per_s"] = [round(f / (h * 3600) / 1e9, 1) for f, h in zip(done, hours, strict=True)]
        result["cpu_over_gpu"] = round(sum(hours) * 3600 / total_seconds)
    for name in ("flops", "decode_bytes"):
        result.pop(name)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
