"""ModelOpt NVFP4 post-training quantization on CPU: config, calibration, export and its check.

The flow is ModelOpt's own (`mtq.quantize` with `mtq.NVFP4_DEFAULT_CFG`, then
`export_hf_checkpoint`); on CPU the one CUDA-only function, the dynamic block fake quantization,
runs trtbuild.runtime.nvfp4_blocks's equal CPU implementation (`nvfp4.cpu_fake_quant`). `check_export` reads the
export back and compares every quantized linear with trtbuild.runtime.nvfp4_blocks.quantize of the weight the
model held and its calibrated amax, bit for bit.

Export facts, read in nvidia-modelopt 0.47.0 (.venv): modelopt/torch/export/quant_utils.py
`preprocess_linear_fusion` unifies the weight amax (max) and the input amax (max) over linears that
TensorRT-LLM fuses (q/k/v, gate/up: modules sharing an input), so their `weight_scale_2` and
`input_scale` are one value; `input_scale = input_amax / (6 * 448)`
(`NVFP4QTensor.get_activation_scaling_factor`, maxbound 6); `hf_quant_config.json` carries
`quant_algo: NVFP4`, `group_size: 16`, `exclude_modules` (`convert_hf_quant_config_format`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.errors import BuildError
from trtbuild.core.layout import QUANTIZED_HF
from trtbuild.core.progress import Progress
from trtbuild.core.stage_api import StageResult
from trtbuild.quantize import evaluation, export_check, modelopt_fp8
from trtbuild.quantize.quantization import CHECK_WINDOWS, accepting_limit, load_for_calibration, token_data

if TYPE_CHECKING:
    import torch

# Linears TensorRT-LLM fuses into one GEMM; ModelOpt's export gives each group one weight_scale_2
# and one input_scale (the max of the members' amax).
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def quant_config(*, kv_cache: bool, excluded: list[str]) -> dict[str, Any]:
    """mtq.NVFP4_DEFAULT_CFG (e2m1 weights and activations in blocks of 16, e4m3 block scales,
    max calibration of the per-tensor amax), the FP8 KV-cache preset when asked, exactly `excluded`
    linears left unquantized (the preset's lm_head entry dropped, as modelopt_fp8 does)."""
    import modelopt.torch.quantization as mtq

    return modelopt_fp8.preset_config(mtq.NVFP4_DEFAULT_CFG, kv_cache=kv_cache, excluded=excluded)


def calibrate(model: Any, cfg: dict[str, Any], batches: torch.Tensor, *, batch_size: int,
              progress: Progress) -> str:
    """modelopt_fp8.calibrate (mtq.quantize over the windows) with the CPU block fake quantizer."""
    import trtbuild.runtime.nvfp4_blocks as nvfp4

    with nvfp4.cpu_fake_quant():
        return modelopt_fp8.calibrate(model, cfg, batches, batch_size=batch_size, progress=progress)


def unify_fused_groups(model: Any) -> int:
    """ModelOpt's own `preprocess_linear_fusion` (modelopt/torch/export/quant_utils.py, 0.47.0) on each
    FUSED_GROUPS group of quantized linears: one input amax and one weight amax (the max) per group.
    The export does this in place before packing; done right after calibration, the fake-quant model
    the gate scores and the export check traces is the model the export holds. Returns the groups."""
    import torch
    from modelopt.torch.export.quant_utils import preprocess_linear_fusion

    modules = dict(model.named_modules())
    groups = 0
    for name, module in modules.items():
        if not isinstance(module, torch.nn.Linear) or name.rpartition(".")[2] not in {g[0] for g in FUSED_GROUPS}:
            continue
        members = [modules.get(m) for m in _group(name)]
        quantized = [m for m in members if m is not None and getattr(getattr(m, "weight_quantizer", None),
                                                                        "is_enabled", False)]
        if len(quantized) > 1:
            preprocess_linear_fusion(quantized)
            groups += 1
    return groups


@dataclass(frozen=True)
class Calibrated:
    """What one quantized linear holds before the export packs it in place."""

    weight: torch.Tensor
    weight_amax: torch.Tensor
    input_amax: torch.Tensor | None


def snapshot(model: Any) -> dict[str, Calibrated]:
    """The weight and calibrated amaxes of every linear with an enabled NVFP4 weight quantizer."""
    import torch

    out: dict[str, Calibrated] = {}
    for name, module in model.named_modules():
        wq = getattr(module, "weight_quantizer", None)
        if not isinstance(module, torch.nn.Linear) or wq is None or not getattr(wq, "is_enabled", False):
            continue
        iq = getattr(module, "input_quantizer", None)
        input_amax = iq.amax if iq is not None and getattr(iq, "is_enabled", False) else None
        out[name] = Calibrated(module.weight.detach().clone(), wq.amax.detach().float().clone(),
                               None if input_amax is None else input_amax.detach().float().clone())
    return out


def _group(name: str) -> tuple[str, ...]:
    parent, _, leaf = name.rpartition(".")
    for members in FUSED_GROUPS:
        if leaf in members:
            return tuple(f"{parent}.{m}" for m in members)
    return (name,)


def check_export(export_dir: Path, calibrated: dict[str, Calibrated], excluded: list[str]) -> dict[str, Any]:
    """The export's files against what NVFP4 of the calibrated model must give; raises BuildError
    naming the first tensor that differs. Returns counts for the stage's metrics."""
    import torch
    from safetensors.torch import load_file

    import trtbuild.runtime.nvfp4_blocks as nvfp4

    def fail(what: str) -> BuildError:
        return BuildError(f"NVFP4 export check: {what} ({export_dir})")

    quant = json.loads((export_dir / "hf_quant_config.json").read_text())["quantization"]
    if quant.get("quant_algo") != "NVFP4" or quant.get("group_size") != nvfp4.BLOCK_SIZE:
        raise fail(f"hf_quant_config.json has quant_algo {quant.get('quant_algo')!r}, group_size "
                   f"{quant.get('group_size')!r}; expected 'NVFP4', {nvfp4.BLOCK_SIZE}")
    listed = set(quant.get("exclude_modules") or [])
    if missing := [n for n in excluded if n not in listed]:
        raise fail(f"exclude_modules lacks {missing}")
    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(export_dir.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    packed_bytes = 0
    for name, cal in calibrated.items():
        members = [m for m in _group(name) if m in calibrated]
        amax = torch.stack([calibrated[m].weight_amax.reshape(()) for m in members]).max()
        want = nvfp4.quantize(cal.weight, amax)
        expect = {f"{name}.weight": (torch.uint8, want.packed), f"{name}.weight_scale": (nvfp4.FP8, want.weight_scale),
                  f"{name}.weight_scale_2": (torch.float32, want.weight_scale_2)}
        if cal.input_amax is not None:
            input_amax = torch.stack([calibrated[m].input_amax.reshape(()) for m in members  # type: ignore[union-attr]
                                      if calibrated[m].input_amax is not None]).max()
            expect[f"{name}.input_scale"] = (torch.float32, nvfp4.global_scale(input_amax))
        for key, (dtype, value) in expect.items():
            got = tensors.get(key)
            if got is None:
                raise fail(f"{key} is missing")
            if got.dtype != dtype or tuple(got.shape) != tuple(value.shape):
                raise fail(f"{key} is {got.dtype} {tuple(got.shape)}; expected {dtype} {tuple(value.shape)}")
            if not torch.equal(got.reshape(-1).view(torch.uint8), value.reshape(-1).contiguous().view(torch.uint8)):
                raise fail(f"{key} differs from NVFP4 of the calibrated weight in "
                           f"{int((got.view(torch.uint8) != value.view(torch.uint8)).sum())} bytes")
        packed_bytes += want.packed.numel()
    tied = _tied_output_embedding(export_dir, tensors)
    for name in excluded:
        # a tied LM head is stored once, as the input embedding (SmolLM2, Llama 3.2): that tensor must stay
        weight = tensors.get(f"{name}.weight", tied if name == "lm_head" else None)
        if weight is None or not weight.is_floating_point() or f"{name}.weight_scale" in tensors:
            raise fail(f"{name} was to stay unquantized")
    return {"nvfp4_linears_checked": len(calibrated), "nvfp4_packed_bytes": packed_bytes}


def _tied_output_embedding(export_dir: Path, tensors: dict[str, Any]) -> Any:
    """The input embedding's weight when config.json ties the LM head to it and the export stores
    no lm_head.weight of its own; else None."""
    config = json.loads((export_dir / "config.json").read_text())
    if not config.get("tie_word_embeddings") or "lm_head.weight" in tensors:
        return None
    return next((value for key, value in tensors.items() if key.endswith("embed_tokens.weight")), None)


def quantize_nvfp4(config: Any, model_dir: Path, out_dir: Path, *, progress: Progress | None = None,
                   base_dir: Path | None = None) -> dict[str, Any]:
    """The quantize stage's steps for NVFP4: perplexity of the base and the NVFP4 fake-quant model
    on the gate's windows, the gate (before anything is written), the export to `out_dir` and its
    check (bit for bit against NVFP4 of the calibrated weights; then, unless quantize.check_export is
    false, trtbuild's runtime on the export against the fake-quant model layer by layer). `config` is
    a QuantizeConfig (its format field is not read: this path is NVFP4). On CPU ModelOpt's CUDA-only
    block fake quantization runs trtbuild.runtime.nvfp4_blocks's (`cpu_fake_quant`); CUDA tensors still go
    to ModelOpt's kernel. Returns the metrics."""
    import torch
    from transformers import AutoTokenizer

    import trtbuild.runtime.nvfp4_blocks as nvfp4
    from trtbuild.quantize.export_dtype import checkpoint_dtype, restore_dtype  # torch at import

    progress = progress or Progress()
    model_dir = model_dir.resolve()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    saved_dtype = checkpoint_dtype(model_dir) if device == "cpu" else None
    model = load_for_calibration(model_dir, torch.float32 if device == "cpu" else "auto", device)
    excluded = modelopt_fp8.resolve_excludes(model, config.exclude)
    cal_windows, eval_windows = token_data(config, tokenizer, base_dir)
    cal, gate = config.calibration, config.gate

    def ppl(description: str) -> Any:
        with torch.no_grad():
            return evaluation.perplexity(evaluation.hf_logits(model), eval_windows, batch_size=gate.batch_size,
                                         progress=progress, description=description)

    base = ppl("perplexity (base)")
    check_ids = eval_windows[:CHECK_WINDOWS]
    with torch.no_grad():
        base_logits = evaluation.hf_logits(model)(check_ids).float().cpu()
    started = time.perf_counter()
    calibrate(model, quant_config(kv_cache=config.kv_cache == "fp8", excluded=excluded), cal_windows,
              batch_size=cal.batch_size, progress=progress)
    calibration_seconds = time.perf_counter() - started
    unify_fused_groups(model)  # what the export does: the gate and the export check score the exported model
    with nvfp4.cpu_fake_quant():
        quantized = ppl("perplexity (nvfp4)")
    ratio = quantized.value / base.value
    metrics: dict[str, Any] = {
        "format": "nvfp4",
        "perplexity_base": base.value, "perplexity_quantized": quantized.value,
        "perplexity_ratio": ratio, "max_perplexity_ratio": gate.max_perplexity_ratio,
        "eval_samples": int(eval_windows.shape[0]), "eval_tokens": base.tokens,
        "calibration_samples": int(cal_windows.shape[0]), "calibration_tokens": int(cal_windows.numel()),
        "calibration_seconds": calibration_seconds, "device": device,
    }
    if ratio > gate.max_perplexity_ratio:
        error = BuildError(
            f"NVFP4 accuracy gate failed: perplexity {quantized.value:.4f} quantized vs {base.value:.4f} base "
            f"on {gate.eval_dataset.describe()} (ratio {ratio:.6f} > max_perplexity_ratio "
            f"{gate.max_perplexity_ratio})", field="quantize.gate.max_perplexity_ratio",
            fix=f"to accept this loss set quantize.gate.max_perplexity_ratio: {accepting_limit(ratio)}; or use "
            "quantize.format: fp8, or keep sensitive layers unquantized (quantize.exclude)")
        error.metrics = metrics  # type: ignore[attr-defined]  # reported by `build --json`
        raise error
    with torch.no_grad(), nvfp4.cpu_fake_quant():
        reference = export_check.hf_trace(model, check_ids)  # the fake-quant model the runtime must reproduce
    calibrated = {name: Calibrated(c.weight.cpu(), c.weight_amax.cpu(),
                                   None if c.input_amax is None else c.input_amax.cpu())
                  for name, c in snapshot(model).items()}
    dtype = model.dtype
    out_dir.mkdir(parents=True, exist_ok=True)
    modelopt_fp8.export_hf(model, out_dir)
    tokenizer_files = modelopt_fp8.copy_tokenizer(model_dir, out_dir)
    if saved_dtype is not None:
        restore_dtype(out_dir, saved_dtype)
    metrics.update({
        "weight_bytes_base": modelopt_fp8.weight_bytes(model_dir),
        "weight_bytes_quantized": modelopt_fp8.weight_bytes(out_dir),
        "excluded_modules": excluded, "tokenizer_files": tokenizer_files,
    })
    metrics["weight_bytes_ratio"] = metrics["weight_bytes_quantized"] / metrics["weight_bytes_base"]
    metrics.update(check_export(out_dir, calibrated, excluded))
    if config.check_export:  # trtbuild's runtime on the export vs the fake-quant model, layer by layer
        metrics.update(export_check.check_export(out_dir, reference, base_logits, device=device, dtype=dtype))
    return metrics


def run_nvfp4(config: Any, model_dir: Path, out_dir: Path, *, progress: Progress | None = None,
              base_dir: Path | None = None) -> StageResult:
    """The quantize stage for `quantize.format: nvfp4`: quantize_nvfp4 into `out_dir/hf`."""
    metrics = quantize_nvfp4(config, model_dir, out_dir / QUANTIZED_HF, progress=progress, base_dir=base_dir)
    info = {key: metrics.pop(key) for key in ("excluded_modules", "tokenizer_files")}
    info.update({"calibration_dataset": config.calibration.dataset.describe(),
                 "eval_dataset": config.gate.eval_dataset.describe(), "export_dir": QUANTIZED_HF})
    return StageResult(metrics=metrics, info=info)
