#!/usr/bin/env python
"""Section 2 of scripts/gpu_check.sh: trtbuild's runtime on a random-weight Llama-3.1-8B-shaped FP8
target and a random EAGLE-3 draft of the same shapes (no download; both written to a temp dir):
decode tokens/s with each GEMM plugin's op vs torch._scaled_mm (TRTBUILD_GEMM), plain and
speculative (chain of --draft-len). Speed only: a random draft's proposals are almost never
accepted, so every speculative step verifies draft-len + 1 tokens (the plugins' M range) and keeps
about one. Prints markdown lines, each as soon as it is measured (a timeout keeps what is done).

    python scripts/gpu_runtime_check.py                 # CUDA, what gpu_check.sh runs
    python scripts/gpu_runtime_check.py --dry-run       # CPU, tiny shapes: the op's torch reference
                                                        # vs the dequantized GEMM (checks the script)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TINY = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 64, "vocab_size": 512, "max_position_embeddings": 512}


def say(line: str) -> None:
    print(line, flush=True)


def target_config(layers: int, tiny: bool) -> dict:
    cfg = json.loads((ROOT / "recipes/standins/llama-3.1-8b-instruct/config.json").read_text())
    if tiny:
        cfg.update(TINY)
        cfg.pop("rope_scaling", None)  # llama3 scaling assumes an 8192-token original context
    cfg["num_hidden_layers"] = layers
    cfg["quantization_config"] = {"quant_algo": "FP8", "quant_method": "modelopt"}
    return cfg


def write_target(directory: Path, cfg: dict, device: str) -> None:
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(cfg))
    (directory / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    state = {"model.embed_tokens.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02,
             "model.norm.weight": torch.ones(h, dtype=torch.bfloat16),
             "lm_head.weight": torch.randn(v, h, dtype=torch.bfloat16) * 0.02}
    shapes = {"self_attn.q_proj": (q, h), "self_attn.k_proj": (kv, h), "self_attn.v_proj": (kv, h),
              "self_attn.o_proj": (h, q), "mlp.gate_proj": (i, h), "mlp.up_proj": (i, h), "mlp.down_proj": (h, i)}
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}"
        state[f"{p}.input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        state[f"{p}.post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        for name, shape in shapes.items():
            # ~N(0, 0.03) after the 1e-3 scale; generated on the device (an 8B layer is 218M numbers)
            state[f"{p}.{name}.weight"] = (torch.randn(shape, device=device) * 30).clamp(-448, 448).to(
                torch.float8_e4m3fn).cpu()
            state[f"{p}.{name}.weight_scale"] = torch.tensor(1e-3)
            state[f"{p}.{name}.input_scale"] = torch.tensor(0.02)
    save_file(state, str(directory / "model.safetensors"))


def write_draft(directory: Path, target_cfg: dict, device: str) -> None:
    """A random EAGLE-3 draft in the layout TensorRT-LLM 1.1 reads (midlayer.*), the target's shapes:
    one decoder layer reading 2 x hidden, fc over three aux layers, the target's vocabulary (so it
    shares the target's embeddings and lm_head, as TensorRT-LLM does when the draft has none)."""
    import torch
    from safetensors.torch import save_file

    from trtbuild.draft.format import LAYER_TENSORS

    directory.mkdir(parents=True)
    h, i = target_cfg["hidden_size"], target_cfg["intermediate_size"]
    d = target_cfg.get("head_dim") or h // target_cfg["num_attention_heads"]
    q, kv = target_cfg["num_attention_heads"] * d, target_cfg["num_key_value_heads"] * d
    layers = target_cfg["num_hidden_layers"]
    aux = sorted({1, max(0, layers // 2 - 1), max(0, layers - 4)})  # TensorRT-LLM's default capture set
    shapes = {"self_attn.q_proj.weight": (q, 2 * h), "self_attn.k_proj.weight": (kv, 2 * h),
              "self_attn.v_proj.weight": (kv, 2 * h), "self_attn.o_proj.weight": (h, q),
              "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i)}

    def rand(shape: tuple[int, ...]) -> torch.Tensor:
        return (torch.randn(shape, device=device) * 0.02).to(torch.bfloat16).cpu()

    tensors = {f"midlayer.{n}": rand(shapes[n]) if n in shapes else torch.ones(h, dtype=torch.bfloat16)
               for n in LAYER_TENSORS}
    tensors["fc.weight"] = rand((h, len(aux) * h))
    tensors["norm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    save_file(tensors, str(directory / "model.safetensors"))
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
            "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling")
    cfg = {k: target_cfg[k] for k in keys if k in target_cfg}
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "num_hidden_layers": 1,
                "draft_vocab_size": target_cfg["vocab_size"], "torch_dtype": "bfloat16",
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True}})
    (directory / "config.json").write_text(json.dumps(cfg))


def measure(target_dir: Path, draft_dir: Path, mode: str, device: str, args: argparse.Namespace) -> None:
    import torch

    from trtbuild.runtime import Generator, SpecParams, load_draft, load_target

    os.environ["TRTBUILD_GEMM"] = mode  # read once, when the target's linears are built
    target = load_target(target_dir, device=device)
    plugin_linears = sum(getattr(layer, name).plugin is not None for layer in target.layers
                         for name in ("o_proj", "down"))
    gen = Generator(target, load_draft(draft_dir, target))
    prompt = list(range(100, 100 + args.prompt_len))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    for label, spec in (("plain", None), (f"speculative k={args.draft_len}", SpecParams(max_draft_len=args.draft_len))):
        gen.generate(prompt, 8, spec=spec)  # compile / warm up
        sync()
        start = time.perf_counter()
        out = gen.generate(prompt, args.new_tokens, spec=spec)
        sync()
        seconds = time.perf_counter() - start
        stats = out.stats
        say(f"| {mode} | {label} | {len(out.tokens) / seconds:.1f} | {stats.tokens_per_s_per_user:.1f} | "
            f"{stats.acceptance_length:.2f} | {stats.target_forwards} | {plugin_linears} |")
    del gen, target
    if device == "cuda":
        torch.cuda.empty_cache()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (checks the script)")
    parser.add_argument("--layers", type=int, default=int(os.environ.get("TRTBUILD_GPU_CHECK_LAYERS", "8")))
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--draft-len", type=int, default=3)
    args = parser.parse_args()
    import torch

    if args.dry_run:
        device, modes, args.layers = "cpu", ("reference", "off"), min(args.layers, 4)
        args.new_tokens = min(args.new_tokens, 12)
    else:
        if not torch.cuda.is_available():
            say("no CUDA device")
            return 3
        device, modes = "cuda", ("spatial_partition", "scaled_mm", "gemm_weight_shuffle")
    torch.manual_seed(0)
    cfg = target_config(args.layers, tiny=args.dry_run)
    shape = "tiny Llama shapes (dry run, CPU)" if args.dry_run else "Llama-3.1-8B shapes"
    say(f"- target: {shape}, {args.layers} of 32 layers, random FP8 weights, batch 1, prompt {args.prompt_len}, "
        f"{args.new_tokens} new tokens; o_proj / down_proj run the mode's GEMM for <= 16 tokens (the fused "
        "qkv / gate_up with per-part scales keep the dequantized GEMM)")
    say(f"- draft: random EAGLE-3 draft of the target's shapes (midlayer.*, bf16), chain of {args.draft_len}: "
        "speed only, its proposals are almost never accepted")
    say("")
    say("| GEMM (TRTBUILD_GEMM) | decoding | tokens/s (wall) | tokens/s/user after the first | tau | "
        "target forwards | linears on the op |")
    say("|---|---|---|---|---|---|---|")
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        write_target(Path(tmp) / "target", cfg, device)
        write_draft(Path(tmp) / "draft", cfg, device)
        for mode in modes:
            try:
                measure(Path(tmp) / "target", Path(tmp) / "draft", mode, device, args)
            except Exception as exc:  # a row per failure, never the end of the section
                failures += 1
                say(f"| {mode} | error | {type(exc).__name__}: {str(exc)[:160]} | | | | |")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
