"""Does the exported FP8 checkpoint hold ModelOpt's quantized model? Checked layer by layer.

The reference is ModelOpt's fake-quantized model with the weights its export holds
(`modelopt_fp8.export_rounded_weights`): its embeddings, every decoder layer's output and its
logits on a few eval windows (`Trace`). trtbuild's runtime loads the export and runs each decoder
layer on the reference's own input to that layer (`TargetModel.teacher_forced`), so each layer is
judged on its own arithmetic.

Why not compare the two models' final logits: FP8 rounds every linear's input, and on a deep
checkpoint one rounding decided the other way by float noise (one float32 ulp) changes that
position's hidden state by ~1e-3; through attention that reaches every later position, and each
following layer flips more roundings. On SmolLM2-135M (30 layers) the runtime in float32 against
itself in float64 flips 1 input rounding of 147 456 in layer 0, then ~20 % of the last layers'
(bench/RESULTS.md): its logits differ by 0.59x the quantization effect at the median position
(cosine min 0.76), the same as against ModelOpt. Both are right; free-running logits of two correct
FP8 implementations cannot agree better. Layer by layer no flip can cascade: a correct export
leaves float noise (median ~1e-7 of a layer's contribution), a wrong scale moves every position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.errors import BuildError
from trtbuild.quantize.evaluation import compare_logits

if TYPE_CHECKING:
    import torch

# Per layer i and position p: err(p) = |runtime layer i(s_i) - s_{i+1}| / |s_{i+1} - s_i|, the
# error relative to what the layer adds to the residual stream. The median position of the worst
# layer must stay below this (float32). Correct exports, worst layer: 1.5e-7 (tiny target), 3.5e-7
# (SmolLM2-135M). One scale off by 2 %: 2.9e-3 (tiny, layer 1's down_proj weight_scale) and
# 2.0e-2 to 5.4e-2 (SmolLM2: a weight, an input and a KV scale; bench/RESULTS.md).
CHECK_MAX_LAYER_ERROR = 1e-3
# The head (final norm + LM head) on the reference's last hidden state, against the size of the
# quantization effect on the logits (reference vs unquantized): rms over the vocabulary per position.
CHECK_MAX_MEDIAN_NOISE = 0.1
CHECK_MIN_COSINE = 0.999
CHECK_MIN_ARGMAX = 0.95


@dataclass(frozen=True)
class Trace:
    """A full causal forward of input_ids [B, T]: logits [B, T, V] and states [L+1, B, T, H]
    (the embeddings, then each decoder layer's output), float32 on the CPU."""

    input_ids: torch.Tensor
    logits: torch.Tensor
    states: torch.Tensor


def hf_trace(model: Any, input_ids: torch.Tensor) -> Trace:
    """The trace of a transformers Llama-style model (`model.model.embed_tokens`, `.layers`)."""
    import torch

    decoder = model.model
    modules = [decoder.embed_tokens, *decoder.layers]
    captured: list[torch.Tensor | None] = [None] * len(modules)

    def keep(index: int) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            tensor = output[0] if isinstance(output, tuple) else output
            captured[index] = tensor.detach().float().cpu()
        return hook

    handles = [m.register_forward_hook(keep(i)) for i, m in enumerate(modules)]
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            logits = model(input_ids=input_ids.to(device), use_cache=False).logits.float().cpu()
    finally:
        for handle in handles:
            handle.remove()
    if any(c is None for c in captured):
        raise RuntimeError("a decoder layer of the reference model did not run")
    return Trace(input_ids=input_ids.cpu(), logits=logits, states=torch.stack(captured))  # type: ignore[arg-type]


def check_export(export_dir: Path, reference: Trace, base_logits: torch.Tensor, *,
                 device: str = "cpu", dtype: Any = None) -> dict[str, Any]:
    """trtbuild.runtime on the export vs the reference `Trace`, layer by layer; raises BuildError
    when a layer or the head does not reproduce it. `base_logits`: the unquantized model's logits
    on the same ids (the quantization effect the head's deviation is measured against). `dtype`:
    the reference's compute dtype. The runtime computes in float32 (or float64); a 16-bit reference
    carries its own rounding noise (tiny target: 1.4e-2 of a layer's contribution in bf16), so
    then each limit is widened by twice the runtime's own 16-bit noise, measured on the same trace."""
    import torch

    from trtbuild.runtime import load_target

    dtype = dtype or torch.float32
    exact = torch.float64 if dtype == torch.float64 else torch.float32
    target = load_target(export_dir, device=device, dtype=exact)
    outputs, head_logits = target.teacher_forced(reference.states)
    states = reference.states.float()
    ref, base = reference.logits.float(), base_logits.float().cpu()
    quantization_rms = max((ref - base).pow(2).mean().sqrt().item(), 1e-12)

    def layer_errors(out: torch.Tensor) -> torch.Tensor:  # [L, B, T]
        step = (states[1:] - states[:-1]).norm(dim=-1).clamp_min(1e-30)
        return (out - states[1:]).norm(dim=-1) / step

    def head_noise(logits: torch.Tensor) -> torch.Tensor:
        return (logits - ref).pow(2).mean(-1).sqrt().flatten() / quantization_rms

    errors = layer_errors(outputs)
    per_layer = errors.flatten(1).median(dim=1).values
    layer_limit = torch.full_like(per_layer, CHECK_MAX_LAYER_ERROR)
    head = head_noise(head_logits).median().item()
    head_limit = CHECK_MAX_MEDIAN_NOISE
    min_cosine, min_argmax = CHECK_MIN_COSINE, CHECK_MIN_ARGMAX
    if dtype in (torch.bfloat16, torch.float16):
        noisy = load_target(export_dir, device=device, dtype=dtype)
        noisy_outputs, noisy_head = noisy.teacher_forced(reference.states)
        floor = ((noisy_outputs - outputs).norm(dim=-1) / (states[1:] - states[:-1]).norm(dim=-1).clamp_min(1e-30))
        layer_limit = layer_limit + 2 * floor.flatten(1).median(dim=1).values
        head_limit += 2 * ((noisy_head - head_logits).pow(2).mean(-1).sqrt().flatten() / quantization_rms).median().item()
        floor_agreement = compare_logits(head_logits, noisy_head)
        min_cosine = min(min_cosine, 1 - 2 * (1 - floor_agreement.min_cosine))
        min_argmax = min(min_argmax, 1 - 2 * (1 - floor_agreement.argmax_agreement))
    worst = int((per_layer / layer_limit).argmax())
    agreement = compare_logits(ref, head_logits)
    # Reported, not judged: the free-running logits, where rounding flips cascade (see above).
    free = target.logits(reference.input_ids).float().cpu()

    metrics: dict[str, Any] = {
        "export_layer_error_median": per_layer[worst].item(),
        "export_layer_error_limit": layer_limit[worst].item(),
        "export_layer_error_worst_layer": worst,
        "export_layer_error_max": errors.max().item(),
        "export_head_noise_median": head,
        "export_head_noise_limit": head_limit,
        **agreement.as_metrics("export_head_logits"),
        "export_free_running_noise_median": head_noise(free).median().item(),
        "export_free_running_argmax_agreement": compare_logits(ref, free).argmax_agreement,
        "quantization_logits_rms": quantization_rms,
    }
    problems = []
    if per_layer[worst] > layer_limit[worst]:
        problems.append(f"decoder layer {worst} differs by {per_layer[worst].item():.3g} of its contribution at the "
                        f"median position (max {layer_limit[worst].item():.3g})")
    if head > head_limit or agreement.min_cosine < min_cosine or agreement.argmax_agreement < min_argmax:
        problems.append(f"the head's logits differ by {head:.3g} x the quantization effect (max {head_limit:.3g}), "
                        f"cosine min {agreement.min_cosine:.5f} (need >= {min_cosine:.5f}), argmax agreement "
                        f"{agreement.argmax_agreement:.3f} (need >= {min_argmax:.3f})")
    if problems:
        raise BuildError("the exported checkpoint does not reproduce ModelOpt's quantized model: "
                         + "; ".join(problems))
    return {"export_check": "passed", **metrics}
