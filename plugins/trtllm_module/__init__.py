"""Routes TensorRT-LLM's FP8 (per-tensor) linears through the GEMM plugins' torch ops at decode.

Shipped inside the engine bundle (trtbuild.engine.plugin_module writes it as the package
`trtbuild_gemm`, with a copy of the kernels and a config.json) and imported by the server process
and its MPI workers; it imports torch, triton and tensorrt_llm only, never trtbuild.

    install(config)   patch now if TensorRT-LLM's linear module is imported, else when it is

What the patch does, per the release's recorded convention (trtbuild/core/contract/*.yaml, fp8_linear):
- after TensorRT-LLM loaded a linear's weights (the `post_load_weights` hook its model loader calls
  on every module), each selected FP8 linear gets its weight shuffled once into the plugin layout;
  on 1.1 / 1.2 (no NCCL-window outputs) TensorRT-LLM's [N, K] tensor is then released, so the plugin
  holds the only copy (given back, unshuffled, whenever TensorRT-LLM needs it: a reload, a call the
  kernel cannot take, a kernel that cannot run here);
- FP8QDQLinearMethod.apply sends a call to the arch's plugin op, quantizing the input with
  TensorRT-LLM's own static-scale op: every token count where the plugin owns the weight, else
  at most `max_tokens` tokens (decode, speculative verification); dynamic scales and NCCL-window
  outputs run TensorRT-LLM's GEMM;
- the first forward writes one line on stderr (startup.py): release, linears patched, kernel per
  shape, fallbacks.
"""

from .patch import install, install_from_file, report, select_release

__all__ = ["install", "install_from_file", "report", "select_release"]
