"""Llama 4's mixture-of-experts feed-forward: a top-k sigmoid router, routed SwiGLU experts and a
shared expert, computed as transformers' Llama4TextMoe does.

The router's logits pick each token's top-k experts; a chosen expert's weight is the sigmoid of
its logit, and it scales the expert's *input* (Llama4TextMoe multiplies `routed_in` before the
experts). The output is the shared expert's plus the sum of the chosen experts'. transformers runs
every expert on every token with weight 0 for the unchosen ones; a SwiGLU without biases maps a
zero input to exactly zero, so running only the chosen rows gives the same numbers at 1/E of
the cost.

FP8 (ModelOpt's export of Llama4TextExperts): `experts.gate_up_proj` / `experts.down_proj` are
float8_e4m3fn in transformers' [experts, in, out] layout with one per-tensor `<name>_weight_scale`
and `<name>_input_scale` shared by all experts (ModelOpt calibrates one quantizer per stacked
parameter); the router stays unquantized (ModelOpt lists it in exclude_modules, and TensorRT-LLM
builds Llama4MoE.router with quant_config=None).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trtbuild.core.errors import UserError
from trtbuild.runtime.checkpoint import Weights
from trtbuild.runtime.layers import Linear, LinearParts, apply_linears, fuse_linears


@dataclass
class Expert:
    """One SwiGLU: fused gate|up, then down."""

    gate_up: list[Linear]
    down: Linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = apply_linears(self.gate_up, x).chunk(2, -1)
        return self.down(F.silu(gate) * up)


@dataclass
class MoE:
    router: torch.Tensor  # [experts, hidden], in the compute dtype (never quantized)
    experts: list[Expert]
    shared: Expert
    top_k: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        logits = flat @ self.router.t()
        top_value, top_index = torch.topk(logits, self.top_k, dim=1)
        scores = torch.sigmoid(top_value.float()).to(flat.dtype)
        out = self.shared(flat)
        routed = torch.zeros_like(out)
        for k in range(self.top_k):
            for e in top_index[:, k].unique().tolist():
                rows = (top_index[:, k] == e).nonzero().squeeze(1)
                routed.index_add_(0, rows, self.experts[e](flat[rows] * scores[rows, k:k + 1]))
        return (out + routed).view(shape)


# (input scale, weight scale) of one expert's FP8 stacked parameter; None when unquantized
StackedScales = tuple[torch.Tensor | None, torch.Tensor] | None


def expert_from_hf(gate_up_proj: torch.Tensor, down_proj: torch.Tensor, gate_up: StackedScales = None,
                   down: StackedScales = None) -> Expert:
    """An expert from Llama4TextExperts' stacked parameters of one expert: gate_up_proj [hidden,
    2 * inter] (gate columns first) and down_proj [inter, hidden], both used as x @ W; with (input
    scale, weight scale) pairs, each GEMM's input is rounded to FP8 first (see
    trtbuild.runtime.layers.Linear)."""
    inter = down_proj.shape[0]
    gate_up_scales = gate_up or (None, None)
    down_scales = down or (None, None)
    gate = LinearParts(gate_up_proj[:, :inter].t(), None, *gate_up_scales)
    up = LinearParts(gate_up_proj[:, inter:].t(), None, *gate_up_scales)
    return Expert(fuse_linears([gate, up]), Linear(down_proj.t(), None, *down_scales))


def _stacked(w: Weights, name: str, shape: tuple[int, ...]) -> tuple[torch.Tensor, list[StackedScales]]:
    """(weights in the compute dtype, each expert's scales) of a stacked expert parameter, FP8 or not."""
    weight = w.get(name, shape)
    if weight.dtype != torch.float8_e4m3fn:
        return weight.to(w.device, w.dtype), [None] * shape[0]
    scale = w.get(f"{name}_weight_scale").to(torch.float32)
    if scale.numel() == 1:
        scale = scale.reshape(1, 1, 1)
    elif scale.numel() == shape[0]:
        scale = scale.reshape(shape[0], 1, 1)  # one scale per expert
    else:
        raise UserError(f"{name}_weight_scale has shape {tuple(scale.shape)}; per-tensor or per-expert scales "
                        "are supported", file=str(w.source))
    input_scale = w.state.get(f"{name}_input_scale")
    if input_scale is not None:
        input_scale = input_scale.to(w.device, torch.float32).reshape(())
    per_expert = [(input_scale, scale[e if scale.shape[0] > 1 else 0].reshape(())) for e in range(shape[0])]
    return (weight.to(torch.float32) * scale).to(w.device, w.dtype), per_expert


def load_moe(w: Weights, prefix: str, hidden: int, inter: int, num_experts: int, top_k: int) -> MoE:
    """`prefix`.{router, experts, shared_expert} of a Llama4TextMoe as transformers saves it."""
    gate_up, gate_up_scales = _stacked(w, f"{prefix}.experts.gate_up_proj", (num_experts, hidden, 2 * inter))
    down, down_scales = _stacked(w, f"{prefix}.experts.down_proj", (num_experts, inter, hidden))
    experts = [expert_from_hf(gate_up[e], down[e], gate_up_scales[e], down_scales[e]) for e in range(num_experts)]
    shared = f"{prefix}.shared_expert"
    shared_gate_up = fuse_linears([w.linear(f"{shared}.gate_proj", inter, hidden),
                                   w.linear(f"{shared}.up_proj", inter, hidden)])
    shared_down = Linear(*w.linear(f"{shared}.down_proj", hidden, inter), fp8=w.fp8(f"{shared}.down_proj"))
    router = w.get(f"{prefix}.router.weight", (num_experts, hidden))
    if router.dtype == torch.float8_e4m3fn:  # neither ModelOpt nor TensorRT-LLM quantizes it
        raise UserError(f"{prefix}.router.weight is FP8; the runtime reads an unquantized router",
                        file=str(w.source), fix="exclude the routers from quantization")
    return MoE(router=router.to(w.device, w.dtype), experts=experts,
               shared=Expert(shared_gate_up, shared_down), top_k=top_k)
