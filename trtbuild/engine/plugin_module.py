"""The out-of-tree TensorRT-LLM module of an engine bundle: trtbuild's GEMM plugins in the server.

The bundle carries

    trtllm_module/
      sitecustomize.py          imports trtbuild_gemm in every Python process started with this
                                directory on PYTHONPATH (trtllm-serve, its MPI workers, Triton's
                                python-backend stub and its ranks), then the sitecustomize it shadows
      trtbuild_gemm/            a copy of the top-level plugins/ package (kernels, layout, torch ops,
                                plugins/trtllm_module) and config.json: kernels per arch, linears,
                                token range, and every contract's FP8-linear convention
                                (trtbuild/core/contract: fp8_linear)

and its launchers put trtllm_module/ on PYTHONPATH, plus `--custom_module_dirs` where the release's
trtllm-serve has it (contract: custom_modules.serve_flag; that flag imports the module in the serving
process only, the sitecustomize reaches its MPI workers). The checkpoint TensorRT-LLM loads stays in
its standard layout: the module shuffles the selected linears' weights once, in the post-load hook
TensorRT-LLM calls.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from trtbuild.core.contract import Contract, load_contract, module_conventions
from trtbuild.core.errors import UserError
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.engine.checkpoint_quant import checkpoint_quant
from trtbuild.engine.config import EngineConfig

MODULE_DIR = "trtllm_module"
PACKAGE = "trtbuild_gemm"
ROLES = ("attention", "dense")

_PLUGINS_ROOT = Path(__file__).resolve().parents[2] / "plugins"
# What the server needs from plugins/ (the AOT build, the trtbuild-side registry stay home).
SHIPPED = ("common/__init__.py", "common/arch.py", "common/errors.py", "common/jit.py", "common/kernels.py",
           "common/launch.py", "common/layout.py", "common/reference.py", "common/signature.py",
           "common/splitk.py", "common/torch_ops.py", "gemm_weight_shuffle/__init__.py",
           "gemm_weight_shuffle/kernel.py", "spatial_partition/__init__.py", "spatial_partition/kernel.py",
           "trtllm_module/__init__.py", "trtllm_module/patch.py", "trtllm_module/startup.py")

_PACKAGE_INIT = '''"""trtbuild's GEMM plugins for this bundle's TensorRT-LLM server (written by trtbuild).

Importing this package patches TensorRT-LLM's FP8 linears (now, or when TensorRT-LLM's linear module
is imported) as config.json says; TRTBUILD_GEMM=off leaves TensorRT-LLM's own GEMMs in place.
"""

from pathlib import Path

from .trtllm_module import install_from_file, report  # noqa: F401

install_from_file(Path(__file__).with_name("config.json"))
'''

_SITECUSTOMIZE = '''"""Written by trtbuild: imports trtbuild_gemm (the bundle's TensorRT-LLM GEMM plugins) in every
Python process started with this directory on PYTHONPATH, then runs the sitecustomize it shadows."""

import os
import sys

try:
    import trtbuild_gemm  # noqa: F401
except Exception as exc:  # an unrelated process (pip, a shell tool) must still start
    print(f"trtbuild_gemm: not installed in {sys.argv[:1]}: {exc}", file=sys.stderr)

_here = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:
    _path = os.path.join(os.path.abspath(_entry or "."), "sitecustomize.py")
    if os.path.dirname(_path) != _here and os.path.isfile(_path):
        exec(compile(open(_path).read(), _path, "exec"), {"__name__": "sitecustomize", "__file__": _path})
        break
'''


def convention(contract: Contract) -> dict[str, Any]:
    """The release's recorded FP8-linear convention; UserError when its contract has none."""
    known = module_conventions()
    if contract.version not in known:
        raise UserError(f"the TensorRT-LLM {contract.version} contract records no FP8-linear convention "
                        f"(fp8_linear), so the GEMM-plugin module cannot patch it (recorded: {', '.join(known)})",
                        field="engine.gemm_plugin", fix="set engine.trtllm_version to a release with one, "
                        "or remove engine.gemm_plugin")
    return known[contract.version]


def text_config(hf_config: dict[str, Any]) -> dict[str, Any]:
    text = hf_config.get("text_config")
    return text if isinstance(text, dict) else hf_config


def role_in_features(hf_config: dict[str, Any], tensor_parallel: int,
                     attention_dp: bool = False) -> tuple[list[int], list[int]]:
    """Per-rank in_features of o_proj and of down_proj (dense MLPs, shared experts): how the module
    tells those two plain (unfused) FP8 linears apart."""
    text = text_config(hf_config)
    heads = int(text.get("num_attention_heads") or 0)
    head_dim = int(text.get("head_dim") or (int(text.get("hidden_size") or 0) // max(1, heads)))
    attn_tp = 1 if attention_dp else tensor_parallel
    o_proj = sorted({heads * head_dim // attn_tp}) if heads else []
    inter = {int(text[k]) for k in ("intermediate_size", "intermediate_size_mlp") if text.get(k)}
    return o_proj, sorted(i // tensor_parallel for i in inter)


def module_config(settings: Any, hf_config: dict[str, Any], tensor_parallel: int,
                  attention_dp: bool = False) -> dict[str, Any]:
    """config.json of the bundled module."""
    o_proj, down = role_in_features(hf_config, tensor_parallel, attention_dp)
    if set(o_proj) & set(down) and set(settings.linears) != set(ROLES):
        raise UserError(f"o_proj and down_proj both take {sorted(set(o_proj) & set(down))} input features "
                        "per rank, so the module cannot apply the plugin to only one of them",
                        field="engine.gemm_plugin.linears", fix="list both attention and dense")
    return {"kernels": dict(settings.kernels), "linears": list(settings.linears),
            "max_tokens": settings.max_tokens, "own_weight": bool(getattr(settings, "one_copy", True)),
            "o_proj_in_features": o_proj,
            "down_proj_in_features": down, "releases": module_conventions()}


def write_module(bundle: Path, config: dict[str, Any]) -> list[str]:
    """trtllm_module/{sitecustomize.py, trtbuild_gemm/...} under `bundle`; returns the files written."""
    root = bundle / MODULE_DIR
    package = root / PACKAGE
    written = []
    for rel in SHIPPED:
        dst = package / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(_PLUGINS_ROOT / rel, dst)
        written.append(str(dst.relative_to(bundle)))
    for path, text in ((package / "__init__.py", _PACKAGE_INIT), (root / "sitecustomize.py", _SITECUSTOMIZE),
                       (package / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")):
        path.write_text(text)
        written.append(str(path.relative_to(bundle)))
    return written


def launch(contract: Contract) -> dict[str, Any]:
    """How the launchers load the module for a release: PYTHONPATH always (the sitecustomize reaches
    the MPI workers and Triton's python backend too), the release's custom-module flag where its
    trtllm-serve has one (contract: custom_modules.serve_flag)."""
    flag = contract.custom_module_flag
    return {"python_path": MODULE_DIR, "serve_flag": flag,
            "custom_module_dirs": [f"{MODULE_DIR}/{PACKAGE}"] if flag else []}


class _MinLatencyLinear:
    """What TensorRT-LLM builds as a Llama4MinLatencyLinear, for the shared rule (first_plugin_token)."""

    def __init__(self, in_features: int, out_features: int, enable_fused_gemm_swiglu: bool = False) -> None:
        self.in_features, self.out_features = in_features, out_features
        self.enable_fused_gemm_swiglu = enable_fused_gemm_swiglu


_MinLatencyLinear.__name__ = "Llama4MinLatencyLinear"


def plugin_token_ranges(settings: Any, hf_config: dict[str, Any] | None, tensor_parallel: int,
                        enable_min_latency: bool, contract: Contract) -> dict[str, tuple[int, int] | None]:
    """Per linear, the token counts at which it calls quant_method.apply within 1..max_tokens (None: never).

    Without min-latency every selected linear does for all of them. With enable_min_latency, TensorRT-LLM
    builds Llama4MinLatencyLinear for a Llama 4 model's qkv (hidden 5120, 40 heads, 8 KV heads, tp 8) and
    its dense MLP / shared expert (hidden 5120, intermediate 16384 or 8192, tp 8), whose own kernels take
    the small token counts (contract: fp8_linear.min_latency; the module applies the same rule)."""
    from plugins.trtllm_module.patch import first_plugin_token

    top = settings.max_tokens
    ranges: dict[str, tuple[int, int] | None] = {"fused qkv": (1, top), "o_proj": (1, top),
                                                 "fused gate_up": (1, top), "down_proj": (1, top)}
    rule = contract.fp8_linear.get("min_latency")
    text = text_config(hf_config or {})
    if not (enable_min_latency and rule and str(text.get("model_type", "")).startswith("llama4")):
        return ranges
    hidden, heads = int(text.get("hidden_size") or 0), int(text.get("num_attention_heads") or 0)
    kv_heads = int(text.get("num_key_value_heads") or 0)
    head_dim = int(text.get("head_dim") or hidden // max(1, heads))
    built: dict[str, Any] = {}
    if (hidden, heads, kv_heads, tensor_parallel) == (5120, 40, 8, 8):  # Llama4MinLatencyAttention
        built["fused qkv"] = _MinLatencyLinear(hidden, (heads + 2 * kv_heads) * head_dim // tensor_parallel)
    inters = {int(text[k]) for k in ("intermediate_size_mlp", "intermediate_size") if text.get(k)}
    if hidden == 5120 and tensor_parallel == 8 and inters and inters <= {16384, 8192}:  # Llama4MinLatencyGatedMLP
        inter = max(inters)
        built["fused gate_up"] = _MinLatencyLinear(hidden, 2 * inter // tensor_parallel, True)
        built["down_proj"] = _MinLatencyLinear(inter // tensor_parallel, hidden)
    for name, linear in built.items():
        first = first_plugin_token(linear, rule)
        ranges[name] = (first, top) if first <= top else None
    return ranges


def describe(settings: Any, archs: list[str], contract: Contract, hf_config: dict[str, Any] | None = None,
             tensor_parallel: int = 1, enable_min_latency: bool = False) -> list[str]:
    """One line per arch for `trtbuild plan` and bundle.json: which linears, which kernel, which M, and
    how the release's server loads the module."""
    ranges = plugin_token_ranges(settings, hf_config, tensor_parallel, enable_min_latency, contract)
    roles = {"attention": ("fused qkv", "o_proj"), "dense": ("fused gate_up", "down_proj")}
    served = [f"{name} {r[0]}..{r[1]}" for role in settings.linears for name in roles[role]
              if (r := ranges[name]) is not None]
    never = [name for role in settings.linears for name in roles[role] if ranges[name] is None]
    where = "attention" + (" and dense MLP / shared-expert" if "dense" in settings.linears else "")
    if "attention" not in settings.linears:
        where = "dense MLP / shared-expert"
    flag = contract.custom_module_flag
    loaded = "PYTHONPATH (sitecustomize)" + (f" and trtllm-serve {flag}" if flag else "")
    lines = []
    for arch in archs:
        kernel = settings.kernels.get(arch)
        if kernel is None:
            lines.append(f"{arch}: TensorRT-LLM's own FP8 GEMM for every token count (no kernel named)")
            continue
        line = (f"{arch}: FP8 per-tensor {where} linears run {kernel} at these token counts: "
                f"{', '.join(served) or 'none'} (decode, speculative verification)")
        if never:
            line += (f"; {', '.join(never)} never call quant_method.apply at 1..{settings.max_tokens} tokens "
                     "(TensorRT-LLM's min-latency kernels, enable_min_latency), so they get no shuffled copy")
        one_copy = bool(getattr(settings, "one_copy", True)) and not contract.fp8_linear.get("output_buffer_kind")
        prefill = ("more tokens (prefill) run the same kernel on the plugin-owned weight, where it holds the only "
                   "copy; MoE experts keep TensorRT-LLM's GEMMs" if one_copy else
                   "more tokens (prefill) and MoE experts keep TensorRT-LLM's GEMMs")
        lines.append(line + f"; {prefill}; "
                     f"{MODULE_DIR}/{PACKAGE} loaded through {loaded} (TensorRT-LLM {contract.version})")
        if hf_config:
            from trtbuild.engine.plugin_memory import plugin_memory

            lines.append(plugin_memory(settings, arch, hf_config, tensor_parallel, ranges, contract).line(arch))
    return lines


def nvfp4_notes(archs: list[str]) -> list[str]:
    """What the FP8 GEMM plugins take when the checkpoint is NVFP4: nothing. Every quantized linear is
    NVFP4 (TensorRT-LLM's NVFP4LinearMethod: fp4_quantize of the activations, then nvfp4_gemm; contract
    `nvfp4`), which the module, patching FP8QDQLinearMethod only, never sees."""
    return [f"{arch}: NVFP4 checkpoint: the FP8 plugins take no GEMM; every quantized linear (fused qkv, o_proj, "
            "fused gate_up, down_proj, MoE experts) stays TensorRT-LLM's NVFP4 GEMM (NVFP4LinearMethod: "
            "fp4_quantize + nvfp4_gemm) and excluded linears (exclude_modules, lm_head) its unquantized GEMM "
            "at every token count; the module loads but patches FP8QDQLinearMethod only" for arch in archs]


def plan_notes(recipe: RecipeInfo, hf_config: dict[str, Any] | None = None) -> list[str]:
    """`trtbuild plan` lines: the GEMM plugin per arch, or nothing when the recipe has none."""
    engine = recipe.section(EngineConfig)
    if engine is None or engine.gemm_plugin is None:
        return []
    if checkpoint_quant(recipe)[0] == "NVFP4":
        return ["gemm plugin (engine.gemm_plugin):", *(f"  {line}" for line in nvfp4_notes(list(recipe.gpu_archs)))]
    return ["gemm plugin (engine.gemm_plugin):",
            *(f"  {line}" for line in describe(engine.gemm_plugin, list(recipe.gpu_archs),
                                                load_contract(engine.trtllm_version), hf_config,
                                                engine.tensor_parallel, bool(engine.enable_min_latency)))]
