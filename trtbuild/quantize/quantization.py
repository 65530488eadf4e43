"""FP8 post-training quantization with ModelOpt, an accuracy gate, and the export (the quantize stage's work).

Steps: load the model stage's HF dir; perplexity of the unquantized model on the eval split;
`mtq.quantize` (FP8 E4M3 per-tensor weights and activations, optional FP8 KV cache) calibrated on
the calibration split; perplexity of the fake-quantized model, computed the same way; the gate
(ratio over `max_perplexity_ratio` fails the build before anything is exported); the export
(ModelOpt's unified HF checkpoint, what TensorRT-LLM's PyTorch backend loads); and an independent
check that the project's runtime, loading the exported FP8 safetensors, reproduces ModelOpt's
fake-quant model layer by layer (trtbuild/quantize/export_check.py).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.layout import QUANTIZED_HF
from trtbuild.core.progress import Progress
from trtbuild.core.stage_api import StageResult
from trtbuild.quantize.config import QuantizeConfig

# Eval windows the export check runs on (trtbuild/quantize/export_check.py has its limits).
CHECK_WINDOWS = 4


def load_for_calibration(model_dir: Path, dtype: Any, device: str) -> Any:
    """The model to calibrate. On CUDA it is loaded with `device_map="auto"`: accelerate places it on
    cuda:0 when it fits and spreads a larger one over every visible GPU, layer by layer, as ModelOpt's
    own PTQ example does (examples/llm_ptq/example_utils.py `get_model`, called by hf_ptq.py, at
    NVIDIA/Model-Optimizer 0.37.0 = df0882a63c39a001a1be384b680166a41259045c). Inputs go to the
    first parameter's device (the embeddings); accelerate's hooks move activations between GPUs."""
    from transformers import AutoModelForCausalLM

    if device == "cpu":
        return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True).eval()
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True,
                                                device_map="auto").eval()


def calibration_gpus(model: Any) -> int:
    """How many GPUs hold the model's weights (1 without a device map)."""
    placed = getattr(model, "hf_device_map", None) or {}
    return max(1, len({d for d in placed.values() if d not in ("cpu", "disk")}))


def run_quantize(config: QuantizeConfig, model_dir: Path, out_dir: Path, *, progress: Progress | None = None,
                 base_dir: Path | None = None) -> StageResult:
    """The whole stage on an HF model dir; writes `out_dir/hf`. Raises on the gate."""
    if config.format == "nvfp4":
        from trtbuild.quantize.modelopt_nvfp4 import run_nvfp4

        return run_nvfp4(config, model_dir, out_dir, progress=progress, base_dir=base_dir)
    import torch
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    from trtbuild.quantize import evaluation, export_check, modelopt_fp8

    progress = progress or Progress()
    hf_logging.disable_progress_bar()  # transformers' tqdm bars would fight the stage's progress
    model_dir = model_dir.resolve()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # CPU: calibrate and score in float32, export in the checkpoint's dtype (trtbuild.quantize.export_dtype)
    from trtbuild.quantize.export_dtype import checkpoint_dtype, restore_dtype

    saved_dtype = checkpoint_dtype(model_dir) if device == "cpu" else None
    load_dtype = torch.float32 if saved_dtype is not None else "auto"
    model = load_for_calibration(model_dir, load_dtype, device)
    max_positions = getattr(model.config, "max_position_embeddings", None)
    for field, seq_len in (("quantize.calibration.seq_len", config.calibration.seq_len),
                           ("quantize.gate.seq_len", config.gate.seq_len)):
        if max_positions and seq_len > max_positions:
            raise UserError(f"seq_len {seq_len} exceeds the model's max_position_embeddings {max_positions}",
                            field=field, fix=f"use seq_len <= {max_positions}")
    excluded = modelopt_fp8.resolve_excludes(model, config.exclude)

    gpus = calibration_gpus(model) if device == "cuda" else 0
    if gpus > 1:
        progress.log(f"quantize: the model is spread over {gpus} GPUs (device_map=\"auto\")")
    cal_windows, eval_windows = token_data(config, tokenizer, base_dir)
    cal, gate = config.calibration, config.gate

    def ppl(lm: Any, description: str) -> evaluation.Perplexity:
        return evaluation.perplexity(evaluation.hf_logits(lm), eval_windows, batch_size=gate.batch_size,
                                     progress=progress, description=description)

    base = ppl(model, "perplexity (base)")
    check_ids = eval_windows[:CHECK_WINDOWS]
    with torch.no_grad():
        base_logits = evaluation.hf_logits(model)(check_ids).float().cpu()

    started = time.perf_counter()
    qcfg = modelopt_fp8.quant_config(kv_cache=config.kv_cache == "fp8", excluded=excluded)
    modelopt_fp8.calibrate(model, qcfg, cal_windows, batch_size=cal.batch_size, progress=progress)
    calibration_seconds = time.perf_counter() - started

    quantized = ppl(model, "perplexity (fp8)")
    ratio = quantized.value / base.value
    metrics: dict[str, Any] = {
        "perplexity_base": base.value,
        "perplexity_quantized": quantized.value,
        "perplexity_ratio": ratio,
        "max_perplexity_ratio": gate.max_perplexity_ratio,
        "eval_samples": int(eval_windows.shape[0]),
        "eval_tokens": base.tokens,
        "calibration_samples": int(cal_windows.shape[0]),
        "calibration_tokens": int(cal_windows.numel()),
        "calibration_seconds": calibration_seconds,
    }
    if ratio > gate.max_perplexity_ratio:
        error = BuildError(
            f"FP8 accuracy gate failed: perplexity {quantized.value:.4f} quantized vs {base.value:.4f} base "
            f"on {gate.eval_dataset.describe()} (ratio {ratio:.6f} > max_perplexity_ratio "
            f"{gate.max_perplexity_ratio})", field="quantize.gate.max_perplexity_ratio",
            fix=f"to accept this loss set quantize.gate.max_perplexity_ratio: {accepting_limit(ratio)}; or score text "
            "like the model's use (quantize.gate.eval_dataset: a chat .jsonl for a chat model), calibrate on closer "
            "data (quantize.calibration.dataset), or keep sensitive layers unquantized (quantize.exclude)")
        error.metrics = metrics  # type: ignore[attr-defined]  # reported by `build --json`
        raise error

    # The export packs weights in place; keep the fake-quant logits the runtime check compares to.
    dtype = model.dtype
    with torch.no_grad(), modelopt_fp8.export_rounded_weights(model) as weight_rounding_gap:
        reference = export_check.hf_trace(model, check_ids)
    metrics["export_weight_rounding_gap"] = weight_rounding_gap  # fake quant vs export, max over linears
    summary = modelopt_fp8.quantizer_summary(model)

    export_dir = out_dir / QUANTIZED_HF
    export_dir.mkdir(parents=True)
    modelopt_fp8.export_hf(model, export_dir)
    tokenizer_files = modelopt_fp8.copy_tokenizer(model_dir, export_dir)
    if saved_dtype is not None:
        restore_dtype(export_dir, saved_dtype)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()

    metrics.update({
        "weight_bytes_base": modelopt_fp8.weight_bytes(model_dir),
        "weight_bytes_quantized": modelopt_fp8.weight_bytes(export_dir),
        "quantized_linears": len(summary["quantized"]),
        "unquantized_linears": len(summary["unquantized"]),
        "export_format": config.export,
        "device": device,
        "calibration_gpus": gpus,
    })
    metrics["weight_bytes_ratio"] = metrics["weight_bytes_quantized"] / metrics["weight_bytes_base"]
    if config.check_export:
        metrics.update(export_check.check_export(export_dir, reference, base_logits, device=device, dtype=dtype))

    info = {"excluded_modules": excluded, "unquantized_linears": summary["unquantized"],
            "tokenizer_files": tokenizer_files, "calibration_dataset": cal.dataset.describe(),
            "eval_dataset": gate.eval_dataset.describe(), "export_dir": export_dir.name}
    return StageResult(metrics=metrics, info=info)


def accepting_limit(ratio: float) -> str:
    """The smallest 3-decimal max_perplexity_ratio the measured ratio passes (rounded up, not to nearest)."""
    return f"{math.ceil(ratio * 1000) / 1000:.3f}"


def token_data(config: QuantizeConfig, tokenizer: Any, base_dir: Path | None) -> tuple[Any, Any]:
    """(calibration windows, eval windows), both LongTensor [N, T] starting with BOS; paragraphs of
    one document are joined as text, separate records by EOS (`sources.joiner`).

    BOS first, as text reaches the model at inference: its large first-position activations
    belong in the calibrated ranges, and the gate scores what users will see.
    """
    from trtbuild.core.data import sources

    cal, gate = config.calibration, config.gate
    cal_texts = sources.load_texts(cal.dataset, "train", tokenizer=tokenizer, base_dir=base_dir)
    cal_windows = sources.token_windows(tokenizer, cal_texts, cal.num_samples, cal.seq_len, cal.seed,
                                        bos=True, separator=sources.joiner(cal.dataset, base_dir))
    eval_texts = sources.load_texts(gate.eval_dataset, "eval", tokenizer=tokenizer, base_dir=base_dir)
    eval_windows = sources.sequential_windows(tokenizer, eval_texts, gate.seq_len, gate.eval_samples,
                                              bos=True, separator=sources.joiner(gate.eval_dataset, base_dir))
    return cal_windows, eval_windows
