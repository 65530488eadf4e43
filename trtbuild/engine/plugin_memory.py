"""What the GEMM plugin adds to each GPU's memory: `trtbuild plan` prints it per arch.

Per selected FP8 linear and rank the plugin holds the weight in its tile layout, [N, K] zero-padded to
whole BLOCK_N x BLOCK_K tiles (plugins/common/layout.py). With one copy (engine.gemm_plugin.one_copy on a
release whose apply has no output-buffer argument, for a linear that calls quant_method.apply from one
token on) TensorRT-LLM's [N, K] tensor is released after loading, so only the padding is extra; otherwise
the whole tiled tensor is. Linears that never reach quant_method.apply at the plugin's token counts
(min-latency kernels) get nothing. MoE experts and the router are never the plugin's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtbuild.core.contract import Contract


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class PluginMemory:
    linears: int  # selected linears per GPU that get a tiled tensor
    one_copy: int  # of which TensorRT-LLM's tensor is released
    extra_bytes: int  # what the plugin adds per GPU
    weight_bytes: int  # TensorRT-LLM's own FP8 bytes of those linears per GPU

    def line(self, arch: str) -> str:
        kept = self.linears - self.one_copy
        how = (f"{self.one_copy} of {self.linears} linears hold one copy (TensorRT-LLM's weight released after "
               "loading; only tile padding is extra)")
        if kept:
            how += f", {kept} keep both copies (min-latency kernels, NCCL-window outputs, or one_copy: false)"
        return (f"{arch}: the plugin's extra memory per GPU: {self.extra_bytes / 2**20:.1f} MiB beside "
                f"{self.weight_bytes / 2**30:.2f} GiB of selected FP8 weights; {how}")


def linear_shapes(hf_config: dict[str, Any], tensor_parallel: int,
                  attention_dp: bool = False) -> dict[str, list[tuple[int, int, int]]]:
    """name -> [(N, K, linears per GPU)] of the FP8 linears the plugin can take (per rank)."""
    text = hf_config.get("text_config") if isinstance(hf_config.get("text_config"), dict) else hf_config
    layers = int(text.get("num_hidden_layers") or 0)
    hidden = int(text.get("hidden_size") or 0)
    heads = int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or hidden // max(1, heads))
    attn_tp = 1 if attention_dp else tensor_parallel
    shapes: dict[str, list[tuple[int, int, int]]] = {
        "fused qkv": [((heads + 2 * kv_heads) * head_dim // attn_tp, hidden, layers)],
        "o_proj": [(hidden, heads * head_dim // attn_tp, layers)],
    }
    if str(text.get("model_type", "")).startswith("llama4"):
        step = int(text.get("interleave_moe_layer_step") or 1)
        moe = sum(1 for i in range(layers) if (i + 1) % step == 0)
        per_kind = [(int(text.get("intermediate_size") or 0), moe),  # the MoE layers' shared expert
                    (int(text.get("intermediate_size_mlp") or text.get("intermediate_size") or 0), layers - moe)]
    else:
        per_kind = [(int(text.get("intermediate_size") or 0), layers)]
    per_kind = [(inter, count) for inter, count in per_kind if inter and count]
    shapes["fused gate_up"] = [(2 * inter // tensor_parallel, hidden, count) for inter, count in per_kind]
    shapes["down_proj"] = [(hidden, inter // tensor_parallel, count) for inter, count in per_kind]
    return shapes


def plugin_memory(settings: Any, arch: str, hf_config: dict[str, Any], tensor_parallel: int,
                  ranges: dict[str, tuple[int, int] | None], contract: Contract,
                  attention_dp: bool = False) -> PluginMemory:
    """`ranges`: per linear, the token counts at which it calls quant_method.apply
    (plugin_module.plugin_token_ranges; None: never)."""
    from plugins.common.arch import ARCHS

    spec = ARCHS[arch]
    roles = {"attention": ("fused qkv", "o_proj"), "dense": ("fused gate_up", "down_proj")}
    releasable = bool(getattr(settings, "one_copy", True)) and not contract.fp8_linear.get("output_buffer_kind")
    linears = one_copy = extra = weight = 0
    shapes = linear_shapes(hf_config, tensor_parallel, attention_dp)
    for role in settings.linears:
        for name in roles[role]:
            served = ranges.get(name)
            if served is None:
                continue
            for n, k, count in shapes.get(name, []):
                tiled = _cdiv(n, spec.block_n) * spec.block_n * _cdiv(k, spec.block_k) * spec.block_k
                owned = releasable and served[0] == 1
                linears += count
                one_copy += count if owned else 0
                weight += count * n * k
                extra += count * (tiled - n * k if owned else tiled)
    return PluginMemory(linears, one_copy, extra, weight)
