"""ModelOpt FP8 post-training quantization: the config, calibration, export and its fix-ups.

Everything that calls `modelopt` for the quantize stage lives here; the stage module only
orchestrates. Imports of torch / modelopt stay inside functions (the stage module imports this
at CLI start-up).
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import io
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.contract.hf_config import rewrite_config
from trtbuild.core.errors import UserError
from trtbuild.core.progress import Progress
from trtbuild.core.safetensors_header import read_header

if TYPE_CHECKING:
    import torch

# Files of a Hugging Face tokenizer that a runtime needs next to the weights.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja",
                   "chat_template.json")

# Entries of ModelOpt's FP8 preset that disable the LM head: our `exclude` list decides instead,
# so `exclude: []` really quantizes every linear layer.
_PRESET_LM_HEAD = ("*lm_head*",)


@contextlib.contextmanager
def quiet() -> Iterator[io.StringIO]:
    """Keep ModelOpt's prints ("Inserted 56 quantizers", ...) off stdout: `--json` owns stdout."""
    from transformers.utils import logging as hf_logging

    buffer = io.StringIO()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # ModelOpt's export calls transformers with deprecated arguments
    try:
        with contextlib.redirect_stdout(buffer), warnings.catch_warnings():
            warnings.filterwarnings("ignore", module=r"modelopt\..*")
            yield buffer
    finally:
        hf_logging.set_verbosity(verbosity)


def linear_module_names(model: Any) -> list[str]:
    import torch

    return [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]


def resolve_excludes(model: Any, patterns: list[str]) -> list[str]:
    """Linear modules matched by the glob patterns. `p` matches a name equal to `p` or ending in `.p`.

    A pattern that matches nothing is a UserError: a typo would otherwise quantize a layer the
    user meant to keep in high precision.
    """
    names = linear_module_names(model)
    excluded: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern) or fnmatch.fnmatchcase(n, "*." + pattern)]
        if not hits:
            examples = ", ".join(names[:3] + names[-1:])
            raise UserError(f"exclude pattern {pattern!r} matches no linear layer "
                            f"(names look like: {examples})", field="quantize.exclude")
        excluded.extend(n for n in hits if n not in excluded)
    return excluded


def quant_config(*, kv_cache: bool, excluded: list[str]) -> dict[str, Any]:
    """mtq.FP8_DEFAULT_CFG (per-tensor E4M3 weights and activations, max calibration), plus the
    FP8 KV-cache preset when asked, with exactly `excluded` linear modules left unquantized."""
    import modelopt.torch.quantization as mtq

    return preset_config(mtq.FP8_DEFAULT_CFG, kv_cache=kv_cache, excluded=excluded)


def preset_config(preset: dict[str, Any], *, kv_cache: bool, excluded: list[str]) -> dict[str, Any]:
    """A copy of one of ModelOpt's presets (FP8_DEFAULT_CFG, NVFP4_DEFAULT_CFG) with the FP8 KV-cache preset
    when asked and exactly `excluded` linears left unquantized (the preset's own lm_head entry dropped)."""
    import modelopt.torch.quantization as mtq

    cfg = copy.deepcopy(preset)
    if isinstance(cfg["quant_cfg"], dict):
        return _quant_config_dict(cfg, mtq.FP8_KV_CFG, kv_cache=kv_cache, excluded=excluded)
    entries = [e for e in cfg["quant_cfg"]
               if not (e.get("quantizer_name") in _PRESET_LM_HEAD and e.get("enable") is False)]
    if kv_cache:
        entries += copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"])
    # Later entries win in ModelOpt's list form, so exclusions go last.
    entries += [{"quantizer_name": f"{name}.*", "enable": False} for name in excluded]
    cfg["quant_cfg"] = entries
    return cfg


def _quant_config_dict(cfg: dict[str, Any], kv_cfg: dict[str, Any], *, kv_cache: bool,
                       excluded: list[str]) -> dict[str, Any]:
    """The same config in the pattern -> settings form of older ModelOpt (0.37, the TensorRT-LLM 1.1
    container's): later patterns win there too, so exclusions go last."""
    quant = {k: v for k, v in cfg["quant_cfg"].items() if k not in _PRESET_LM_HEAD}
    if kv_cache:
        quant.update({k: copy.deepcopy(v) for k, v in kv_cfg["quant_cfg"].items() if k != "default"})
    quant.update({f"{name}.*": {"enable": False} for name in excluded})
    cfg["quant_cfg"] = quant
    return cfg


def calibrate(model: Any, cfg: dict[str, Any], batches: torch.Tensor, *, batch_size: int,
              progress: Progress) -> str:
    """mtq.quantize with a forward loop over the calibration windows; returns ModelOpt's log."""
    import modelopt.torch.quantization as mtq
    import torch

    device = next(model.parameters()).device
    starts = range(0, batches.shape[0], batch_size)

    def forward_loop(m: Any) -> None:
        with torch.no_grad(), progress.task("calibrate", total=len(starts)) as bar:
            for start in starts:
                m(input_ids=batches[start: start + batch_size].to(device), use_cache=False)
                bar.advance(1)

    with quiet() as log:
        mtq.quantize(model, cfg, forward_loop)
    return log.getvalue()


def quantizer_summary(model: Any) -> dict[str, list[str]]:
    """Which linear layers ended up with enabled weight quantizers, and which did not."""
    import torch

    quantized, unquantized = [], []
    for name, module in model.named_modules():
        quantizer = getattr(module, "weight_quantizer", None)
        if quantizer is None or not isinstance(module, torch.nn.Linear):
            continue
        (quantized if getattr(quantizer, "is_enabled", False) else unquantized).append(name)
    return {"quantized": quantized, "unquantized": unquantized}


def export_hf(model: Any, out: Path) -> None:
    """ModelOpt's unified HF checkpoint. The export packs weights to FP8 in place: the model can
    not run afterwards, so take every fake-quant measurement before calling this.

    Under transformers 5 the exported config.json carries RoPE only as `rope_parameters`; the
    transformers 4.57 of TensorRT-LLM 1.1 would then run Llama 3.1 with rope_theta 10000 and no
    llama3 scaling, silently. The config is rewritten with top-level rope_theta / rope_scaling
    (and torch_dtype), the form every supported release reads (trtbuild/core/contract: hf_config)."""
    from modelopt.torch.export import export_hf_checkpoint

    with quiet():
        export_hf_checkpoint(model, export_dir=out)
    rewrite_config(Path(out) / "config.json")


def copy_tokenizer(src: Path, dst: Path) -> list[str]:
    copied = []
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, dst / name)
            copied.append(name)
    return copied


def weight_bytes(directory: Path) -> int:
    """Bytes of all tensors in a checkpoint directory (from headers, without reading the data)."""
    total = 0
    for file in sorted(Path(directory).glob("*.safetensors")):
        total += sum(end - start for start, end in (t["data_offsets"] for t in read_header(file).values()))
    return total


@contextlib.contextmanager
def export_rounded_weights(model: Any) -> Iterator[float]:
    """Within the block, each FP8 linear computes with the weight its export will hold.

    ModelOpt's fake quantizer rounds w * (448 / amax) to FP8; its exporter rounds w / (amax / 448)
    (modelopt/torch/export/quant_utils.py `to_quantized_weight`). The two differ by one float32
    ulp, which decides ties: on a coarse weight grid (a checkpoint dequantized from GGUF Q4_1,
    SmolLM2-135M) 0.9-1.0 % of an MLP weight's norm, where most layers' attention weights agree to
    1e-7. The export check compares the runtime with the exported numbers, so its reference runs
    with them; yields the largest relative weight difference (fake quant vs export) it replaced."""
    import torch

    saved: list[tuple[Any, torch.Tensor]] = []
    worst = 0.0
    try:
        with torch.no_grad():
            for module in model.modules():
                quantizer = getattr(module, "weight_quantizer", None)
                weight = getattr(module, "weight", None)
                if quantizer is None or weight is None or not getattr(quantizer, "is_enabled", False):
                    continue
                amax = getattr(quantizer, "amax", None)
                if amax is None or amax.numel() != 1:
                    continue
                scale = amax.to(torch.float32) / 448.0
                exported = (weight.to(torch.float32) / scale).to(torch.float8_e4m3fn).to(torch.float32) * scale
                fake = quantizer(weight).to(torch.float32)
                worst = max(worst, ((fake - exported).norm() / exported.norm().clamp_min(1e-30)).item())
                saved.append((module, weight.detach().clone()))
                weight.copy_(exported.to(weight.dtype))
                quantizer.disable()
        yield worst
    finally:
        with torch.no_grad():
            for module, original in saved:
                module.weight.copy_(original)
                module.weight_quantizer.enable()
