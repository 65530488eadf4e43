"""Maverick's min-latency linears (tp 8 shapes) on the 1.2.1 stand-in with the bundle's module; prints JSON:
which linears the module prepared, from which token count, and which path each call took."""
from __future__ import annotations

import json

import tensorrt_llm  # noqa: F401
import torch
import trtbuild_gemm
from tensorrt_llm._torch.models import modeling_llama_min_latency as ML
from tensorrt_llm._torch.modules import linear as L
from tensorrt_llm._torch.pyexecutor import model_loader

torch.manual_seed(0)
HIDDEN, Q, KV, INTER = 5120, 640, 128, 2048  # per rank at tp 8: 40 heads x 128 / 8, 8 KV heads x 128 / 8, 16384 / 8


def fp8(shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    w = torch.randn(shape) * 0.02
    scale = (w.abs().amax() / 448.0).float()
    return {"weight": (w / scale).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(1),
            "input_scale": torch.tensor([0.05])}


class Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        cfg, mode = L.WeightsLoadingConfig, L.WeightMode
        self.qkv_proj = ML.Llama4MinLatencyLinear(HIDDEN, Q + 2 * KV, bias=False, dtype=torch.float32,
                                                  weights_loading_config=cfg(weight_mode=mode.FUSED_QKV_LINEAR))
        self.o_proj = L.Linear(Q, HIDDEN, bias=False, dtype=torch.float32)
        self.gate_up_proj = ML.Llama4MinLatencyLinear(HIDDEN, 2 * INTER, bias=False, dtype=torch.float32,
                                                      weights_loading_config=cfg(weight_mode=mode.FUSED_GATE_UP_LINEAR),
                                                      enable_fused_gemm_swiglu=True)
        self.down_proj = ML.Llama4MinLatencyLinear(INTER, HIDDEN, bias=False, dtype=torch.float32)


layer = model_loader.load(Layer(), {"qkv_proj": [fp8((Q, HIDDEN)), fp8((KV, HIDDEN)), fp8((KV, HIDDEN))],
                                    "o_proj": [fp8((HIDDEN, Q))], "gate_up_proj": [fp8((INTER, HIDDEN))] * 2,
                                    "down_proj": [fp8((HIDDEN, INTER))]})
out = {"prepared": {}, "paths": {}}
for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
    lin = getattr(layer, name)
    state = lin.__dict__.get("_trtbuild_gemm")
    out["prepared"][name] = None if state is None else state.min_tokens
    for tokens in (1, 8, 9, 16):
        before, own = dict(trtbuild_gemm.report()), ML.CALLS["own_kernel"]
        lin(torch.randn(tokens, lin.in_features))
        after = trtbuild_gemm.report()
        out["paths"][f"{name}:{tokens}"] = ("min-latency kernel" if ML.CALLS["own_kernel"] > own else
                                            "plugin" if after.get("plugin", 0) > before.get("plugin", 0) else "own")
out["report"] = trtbuild_gemm.report()
print(json.dumps(out))
