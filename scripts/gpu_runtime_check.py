#!/usr/bin/env python
"""Section 2 of scripts/gpu_check.sh: trtbuild's runtime on a random-weight Llama-3.1-8B-shaped FP8
target (no download; weights written to a temp dir), decode tokens/s with the plugin op vs
torch._scaled_mm (TRTBUILD_GEMM), plain decoding. Prints markdown lines."""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def write_target(directory: Path, layers: int) -> None:
    import torch
    from safetensors.torch import save_file

    cfg = json.loads((ROOT / "recipes/standins/llama-3.1-8b-instruct/config.json").read_text())
    cfg["num_hidden_layers"] = layers
    cfg["quantization_config"] = {"quant_algo": "FP8", "quant_method": "modelopt"}
    (directory / "config.json").write_text(json.dumps(cfg))
    (directory / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    state = {"model.embed_tokens.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02,
             "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
             "lm_head.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02}
    shapes = {"self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
              "self_attn.o_proj": (h, h), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    for layer in range(layers):
        p = f"model.layers.{layer}"
        state[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        state[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        for name, shape in shapes.items():
            state[f"{p}.{name}.weight"] = (torch.randn(shape, device="cuda") * 30).clamp(-448, 448).to(
                torch.float8_e4m3fn).cpu()
            state[f"{p}.{name}.weight_scale"] = torch.tensor(1e-3)
            state[f"{p}.{name}.input_scale"] = torch.tensor(0.02)
    save_file(state, str(directory / "model.safetensors"))


def main() -> int:
    import torch

    from trtbuild.runtime import Generator, load_target

    layers = int(os.environ.get("TRTBUILD_GPU_CHECK_LAYERS", "8"))
    print(f"- target: Llama-3.1-8B shapes, {layers} of 32 layers (random FP8 weights), batch 1, float32 "
          "activations; o_proj/down_proj run the op (fused qkv/gate_up with per-part scales keep the "
          "dequantized GEMM)")
    with tempfile.TemporaryDirectory() as tmp:
        write_target(Path(tmp), layers)
        for mode in ("spatial_partition", "gemm_weight_shuffle", "scaled_mm"):
            try:
                os.environ["TRTBUILD_GEMM"] = mode
                target = load_target(Path(tmp), device="cuda")
                gen = Generator(target)
                prompt = list(range(100, 132))
                gen.generate(prompt, 8)  # compile / warm up
                torch.cuda.synchronize()
                start = time.perf_counter()
                out = gen.generate(prompt, 64)
                torch.cuda.synchronize()
                rate = len(out.tokens) / (time.perf_counter() - start)
                print(f"- {mode}: {rate:.1f} tokens/s plain decode ({len(out.tokens)} tokens)")
                del target, gen
                torch.cuda.empty_cache()
            except Exception as exc:  # a row per failure, never the end of the section
                print(f"- {mode}: error {type(exc).__name__}: {str(exc)[:160]}")
    print("- speculative decoding with a random draft: not run (no random EAGLE-3 draft builder yet)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
