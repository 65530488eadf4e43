"""Drives a stand-in TensorRT-LLM release with the bundle's trtbuild_gemm module; prints JSON.

Run by tests/test_trtllm_module.py as a fresh process whose PYTHONPATH is the bundle's trtllm_module/
(so its sitecustomize imports trtbuild_gemm first, as in the server), the release's stand-in package
and this directory. A small Llama-like block of FP8 per-tensor linears is loaded the way the
release's ModelLoader does, then each linear runs at several token counts through the patched
apply and through TensorRT-LLM's own apply (the wrapped function).
"""

from __future__ import annotations

import json
import sys

import standin_ops
import torch
import trtbuild_gemm
from tensorrt_llm._torch.modules import linear as L
from tensorrt_llm._torch.pyexecutor import model_loader
from trtbuild_gemm.common.layout import shuffle, unshuffle
from trtbuild_gemm.trtllm_module.patch import prepare

torch.manual_seed(0)
H, NQ, NKV, D, INTER = 96, 4, 2, 24, 160  # hidden, heads, kv heads, head_dim, intermediate
DTYPE = torch.float32 if sys.argv[1] == "float32" else torch.bfloat16


def fp8_tensor(shape: tuple[int, ...]) -> dict[str, torch.Tensor]:
    w = torch.randn(shape) * 0.05
    scale = (w.abs().amax() / 448.0).float()
    return {"weight": (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(1),
            "input_scale": torch.tensor([0.02], dtype=torch.float32)}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        mode, tp = L.WeightMode, L.TensorParallelMode
        cfg = L.WeightsLoadingConfig
        self.qkv_proj = L.Linear(H, (NQ + 2 * NKV) * D, bias=False, dtype=DTYPE, tensor_parallel_mode=tp.COLUMN,
                                 weights_loading_config=cfg(weight_mode=mode.FUSED_QKV_LINEAR))
        self.o_proj = L.Linear(NQ * D, H, bias=False, dtype=DTYPE, tensor_parallel_mode=tp.ROW)
        self.gate_up_proj = L.Linear(H, 2 * INTER, bias=False, dtype=DTYPE, tensor_parallel_mode=tp.COLUMN,
                                     weights_loading_config=cfg(weight_mode=mode.FUSED_GATE_UP_LINEAR))
        self.down_proj = L.Linear(INTER, H, bias=True, dtype=DTYPE, tensor_parallel_mode=tp.ROW)


checkpoint = {
    "qkv_proj": [fp8_tensor((NQ * D, H)), fp8_tensor((NKV * D, H)), fp8_tensor((NKV * D, H))],
    "o_proj": [fp8_tensor((H, NQ * D))],
    "gate_up_proj": [fp8_tensor((INTER, H)), fp8_tensor((INTER, H))],
    "down_proj": [dict(fp8_tensor((H, INTER)), bias=torch.randn(H).to(DTYPE))],
}
block = model_loader.load(Block(), checkpoint)
own_apply = L.FP8QDQLinearMethod.apply.__wrapped__
# The same checkpoint through TensorRT-LLM's own load_weights only (no post-load hook, so no plugin): the
# weight TensorRT-LLM would hold, and its own GEMM on it, to compare with.
reference = Block()
for name, weights in checkpoint.items():
    L.Linear.load_weights.__wrapped__(getattr(reference, name), weights)
out: dict = {"release": trtbuild_gemm.report(), "linears": {}}


def fp8_bytes(module: torch.nn.Module) -> int:
    """Bytes of every fp8 tensor a linear holds: its parameters and the plugin's shuffled tensor."""
    total = sum(t.numel() for t in module.parameters() if t.dtype == torch.float8_e4m3fn)
    state = module.__dict__.get("_trtbuild_gemm")
    return total + (state.weight.numel() if state is not None else 0)


for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"):
    lin, ref_lin = getattr(block, name), getattr(reference, name)
    state = lin.__dict__.get("_trtbuild_gemm")
    entry = {"prepared": state is not None, "role": getattr(state, "role", None),
             "kernel": getattr(state, "kernel", None), "owns_weight": getattr(state, "owns_weight", None),
             "weight_layout": [list(lin.weight.shape), str(lin.weight.dtype)],
             "fp8_bytes": fp8_bytes(lin), "weight_shape": list(ref_lin.weight.shape)}
    if state is not None:
        entry["shuffled_equals_weight"] = bool(torch.equal(
            unshuffle(state.weight, state.n, state.k).view(torch.uint8), ref_lin.weight.view(torch.uint8)))
        entry["shuffled_is_layout_of_weight"] = bool(torch.equal(
            state.weight.view(torch.uint8), shuffle(ref_lin.weight.detach(), 128, 128).view(torch.uint8)))
    runs = {}
    for tokens in (1, 3, 16, 17, 40):
        x = (torch.randn(tokens, lin.in_features) * 2).to(DTYPE)
        before = dict(trtbuild_gemm.report())
        mm_before = standin_ops.CALLS["cublas_scaled_mm"]
        y = lin(x)
        after = trtbuild_gemm.report()
        path = "plugin" if after.get("plugin", 0) > before.get("plugin", 0) else "own"
        own_called = standin_ops.CALLS["cublas_scaled_mm"] > mm_before
        y_own = own_apply(ref_lin.quant_method, ref_lin, x, ref_lin.bias)
        # Independent reference: the quantized input and weight, float64.
        xq = (x.float() / lin.input_scale).clamp(-448, 448).to(torch.float8_e4m3fn)
        ref = (xq.double() @ ref_lin.weight.double().t()) * (lin.input_scale.double() * lin.weight_scale.double())
        if lin.bias is not None:
            ref = ref + lin.bias.double()
        runs[tokens] = {"path": path, "own_gemm_called": own_called,
                        "shape": list(y.shape), "dtype": str(y.dtype),
                        "max_abs_vs_own": float((y.double() - y_own.double()).abs().max()),
                        "max_abs_vs_ref": float((y.double() - ref).abs().max()),
                        "ref_scale": float(ref.abs().max())}
    entry["runs"] = runs
    out["linears"][name] = entry

# 3-D input (batch, tokens, hidden) is counted by tokens.
x3 = torch.randn(2, 4, H).to(DTYPE)
before = trtbuild_gemm.report().get("plugin", 0)
y3 = block.qkv_proj(x3)
out["three_d"] = {"shape": list(y3.shape), "plugin": trtbuild_gemm.report().get("plugin", 0) > before}

if hasattr(L, "BufferKind"):  # main: an NCCL-window output keeps TensorRT-LLM's GEMM
    before = trtbuild_gemm.report().get("plugin", 0)
    block.o_proj(torch.randn(2, NQ * D).to(DTYPE), prefer_window_output=True)
    out["window_output_plugin"] = trtbuild_gemm.report().get("plugin", 0) > before

# A weight update reloads and re-runs the hook: the shuffled copy follows the new weight (TensorRT-LLM's
# load_weights gets its [N, K] tensor back first, then the hook takes it again).
old = block.o_proj.__dict__["_trtbuild_gemm"].weight
update = {"o_proj": [fp8_tensor((H, NQ * D))]}
model_loader.load(block, update)
L.Linear.load_weights.__wrapped__(reference.o_proj, update["o_proj"])
new = block.o_proj.__dict__["_trtbuild_gemm"].weight
out["reload_reshuffled"] = bool(not torch.equal(old.view(torch.uint8), new.view(torch.uint8)) and torch.equal(
    unshuffle(new, H, NQ * D).view(torch.uint8), reference.o_proj.weight.view(torch.uint8)))
out["reload_fp8_bytes"] = fp8_bytes(block.o_proj)

# Selection: a config naming only attention leaves the dense linears to TensorRT-LLM.
with open(trtbuild_gemm.__path__[0] + "/config.json") as file:
    config = json.load(file)
only_attention = dict(config, linears=["attention"])
out["attention_only"] = {name: prepare(getattr(block, name), L.FP8QDQLinearMethod, only_attention) is not None
                         for name in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")}
# A linear the plugin no longer takes has TensorRT-LLM's weight back, bit for bit.
out["deselected_weight_restored"] = bool(torch.equal(block.gate_up_proj.weight.view(torch.uint8),
                                                     reference.gate_up_proj.weight.view(torch.uint8)))
out["imported"] = sorted(m for m in ("trtbuild", "plugins") if m in sys.modules)
out["report"] = trtbuild_gemm.report()
print(json.dumps(out))
