"""A server process's start, as far as the GEMM module is concerned; prints JSON.

Run with PYTHONPATH = the bundle's trtllm_module/ (its sitecustomize imports trtbuild_gemm first, as in
trtllm-serve, its MPI workers and Triton's python stub), a release's stand-in and this directory. Then,
as the server does: `import tensorrt_llm` (the stand-in's __init__ imports the models, hence the linear
module, before its version, as upstream's 1.1 / 1.2 do), load FP8 linears through the loader, and run a
decode-sized call (argv[1] == "no-descriptor": with a Triton that lacks tl.make_tensor_descriptor, as an
older container's would, so the kernel cannot be built).
"""

from __future__ import annotations

import json
import os
import sys

import tensorrt_llm  # noqa: F401  (the package first, as trtllm-serve imports it)
import torch
import trtbuild_gemm
from tensorrt_llm._torch.modules import linear as L
from tensorrt_llm._torch.pyexecutor import model_loader

if len(sys.argv) > 1 and sys.argv[1] == "no-descriptor":
    import triton.language as tl

    del tl.make_tensor_descriptor

torch.manual_seed(0)
H, N = 96, 160  # o_proj of the bundle config in tests/test_trtllm_module.py: 4 heads x 24 in


def fp8_weights(shape: tuple[int, int]) -> dict[str, torch.Tensor]:
    w = torch.randn(shape) * 0.05
    scale = (w.abs().amax() / 448.0).float()
    return {"weight": (w / scale).clamp(-448, 448).to(torch.float8_e4m3fn), "weight_scale": scale.reshape(1),
            "input_scale": torch.tensor([0.02], dtype=torch.float32)}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.o_proj = L.Linear(H, N, bias=False, dtype=torch.float32, tensor_parallel_mode=L.TensorParallelMode.ROW)


checkpoint = {"o_proj": [fp8_weights((N, H))]}
block = model_loader.load(Block(), checkpoint)
prepared = "_trtbuild_gemm" in block.o_proj.__dict__
# TensorRT-LLM's own load and GEMM on the same checkpoint (no post-load hook, so no plugin) to compare with.
reference = Block()
L.Linear.load_weights.__wrapped__(reference.o_proj, checkpoint["o_proj"])
x = torch.randn(2, H)
y = block.o_proj(x)
y_own = L.FP8QDQLinearMethod.apply.__wrapped__(reference.o_proj.quant_method, reference.o_proj, x, None)
y_again = block.o_proj(x)
print(json.dumps({"version": tensorrt_llm.__version__, "pid": os.getpid(), "report": trtbuild_gemm.report(),
                  "prepared": prepared,
                  "patched": hasattr(L.FP8QDQLinearMethod.apply, "__wrapped__"),
                  "max_abs_vs_own": float((y - y_own).abs().max()),
                  "again_vs_own": float((y_again - y_own).abs().max()),
                  "ref_scale": float(y_own.abs().max())}))
