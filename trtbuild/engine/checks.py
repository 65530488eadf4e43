"""Cross-stage preflight of the engine section: what would fail at engine build or server start.

Run by `trtbuild validate`, `plan` and `build` before any work, from the recipe alone (plus the
target's config.json when it is already on disk). Each mismatch is one line: the field, both
values, and the fix. Nothing here imports torch, transformers or tensorrt_llm.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from trtbuild.core import plugins
from trtbuild.core.contract import load_contract
from trtbuild.core.errors import UserError
from trtbuild.core.llm_args import parse_options
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.draft.config import DraftConfig
from trtbuild.engine import plugin_module
from trtbuild.engine.checkpoint_quant import checkpoint_quant
from trtbuild.engine.config import draft_len, has_draft
from trtbuild.engine.facts import ModelFacts, target_facts
from trtbuild.quantize.config import QuantizeConfig

if TYPE_CHECKING:
    from trtbuild.engine.config import EngineConfig

# Archs with FP8 tensor cores (Ada and newer) / with programmatic dependent launch (Hopper and newer).
FP8_ARCHS = ("sm_89", "sm_90a", "sm_100a", "sm_120a")
PDL_ARCHS = ("sm_90a", "sm_100a", "sm_120a")
# Archs TensorRT-LLM runs NVFP4 on (Blackwell; every contract's `nvfp4.archs`, read from
# docs/source/features/quantization.md@09d4c79ba941a5c2c62c878c3572c0dcc8b85efa): not Hopper, Ada, Ampere.
NVFP4_ARCHS = ("sm_100a", "sm_120a")
# LLM() arguments the engine section sets itself; llm_api_options must not set them a second time.
OWNED_OPTIONS = {
    "tensor_parallel_size": "engine.tensor_parallel", "pipeline_parallel_size": "engine.pipeline_parallel",
    "moe_expert_parallel_size": "engine.expert_parallel", "max_batch_size": "engine.max_batch_size",
    "max_num_tokens": "engine.max_num_tokens", "max_seq_len": "engine.max_seq_len",
    "kv_cache_config": "engine.kv_cache", "cuda_graph_config": "engine.cuda_graphs",
    "speculative_config": "engine.draft_len / the draft section", "enable_attention_dp":
    "engine.enable_attention_dp", "enable_min_latency": "engine.enable_min_latency",
    "enable_autotuner": "engine.enable_autotuner", "model": "the bundle (target/)",
    "trust_remote_code": "model.trust_remote_code",
}


def _line(field: str, message: str, fix: str) -> str:
    return f"{field}: {message} (fix: {fix})"


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def engine_problems(config: EngineConfig, recipe: RecipeInfo) -> list[str]:
    """The engine section against the rest of the recipe and the target's facts. The bundle this
    renders, checked against its release (which reads the deploy section too), is the app's
    (trtbuild/app/recipe_conformance.py); trtbuild/app/preflight.py runs it when these find nothing."""
    facts = target_facts(recipe)
    problems: list[str] = []
    problems += _speculation(config, recipe)
    problems += _parallelism(config, facts)
    problems += _lengths(config, recipe, facts)
    problems += _checkpoint_format(config, recipe, facts)
    problems += _plugins(config, recipe)
    problems += _launcher(config)
    problems += _archs(config, recipe)
    problems += _options(config)
    return problems


def toolchain_problems(config: EngineConfig) -> list[str]:
    """engine.require_tensorrt_llm on a machine without it."""
    if config.require_tensorrt_llm and importlib.util.find_spec("tensorrt_llm") is None:
        return [_line("engine.require_tensorrt_llm", "is true but tensorrt_llm is not importable "
                      "here", "install TensorRT-LLM (pip install tensorrt-llm, on a CUDA host) "
                      "or set engine.require_tensorrt_llm: false")]
    return []


def _speculation(config: EngineConfig, recipe: RecipeInfo) -> list[str]:
    out: list[str] = []
    if not has_draft(recipe):
        if config.draft_len is not None:
            out.append(_line("engine.draft_len", f"{config.draft_len} is set but the recipe has no draft",
                             "add a draft: section or remove engine.draft_len"))
        return out
    draft = recipe.section(DraftConfig)
    trained = draft.max_draft_len if draft is not None else None
    if config.draft_len is not None and trained is not None and config.draft_len > trained:
        out.append(_line("engine.draft_len", f"{config.draft_len} exceeds draft.max_draft_len {trained} "
                         "the draft was built and measured for",
                         f"set engine.draft_len <= {trained} or raise draft.max_draft_len"))
    k = draft_len(config, recipe) or 0
    needed = config.max_batch_size * (1 + k)
    if config.max_num_tokens < needed:
        out.append(_line("engine.max_num_tokens", f"{config.max_num_tokens} is below max_batch_size "
                         f"{config.max_batch_size} x (1 + draft_len {k}) = {needed}, the tokens of one "
                         "decode step",
                         f"set engine.max_num_tokens >= {needed} or lower engine.max_batch_size"))
    return out


def _parallelism(config: EngineConfig, facts: ModelFacts | None) -> list[str]:
    out: list[str] = []
    tp, pp, ep = config.tensor_parallel, config.pipeline_parallel, config.expert_parallel
    if tp % ep:
        out.append(_line("engine.expert_parallel", f"{ep} does not divide engine.tensor_parallel {tp} "
                         "(TRT-LLM splits the tensor-parallel ranks into expert x expert-tensor groups)",
                         f"use an expert_parallel among {_divisors(tp)}"))
    if config.enable_attention_dp and tp == 1:
        out.append(_line("engine.enable_attention_dp", "is true but engine.tensor_parallel is 1: attention "
                         "data parallelism spreads requests over the tensor-parallel ranks",
                         "set tensor_parallel > 1 or enable_attention_dp: false"))
    if facts is None:
        return out
    where = facts.source
    heads, kv = facts.num_attention_heads, facts.num_key_value_heads
    if heads and heads % tp:
        out.append(_line("engine.tensor_parallel", f"{tp} does not divide the target's num_attention_heads "
                         f"{heads} ({where})", f"use a tensor_parallel among {_divisors(heads)}"))
    if kv and kv % tp and tp % kv:
        out.append(_line("engine.tensor_parallel", f"{tp} and the target's num_key_value_heads {kv} "
                         f"({where}) divide neither way, so KV heads cannot be split or replicated evenly",
                         f"use a tensor_parallel that divides {kv} or is a multiple of it"))
    layers = facts.num_hidden_layers
    if layers and pp > layers:
        out.append(_line("engine.pipeline_parallel", f"{pp} exceeds the target's num_hidden_layers {layers} "
                         f"({where})", f"use pipeline_parallel <= {layers}"))
    if ep > 1 and not facts.num_experts:
        out.append(_line("engine.expert_parallel", f"{ep} but the target ({where}) is dense (no experts)",
                         "set engine.expert_parallel: 1"))
    elif facts.num_experts and facts.num_experts % ep:
        out.append(_line("engine.expert_parallel", f"{ep} does not divide the target's "
                         f"{facts.num_experts} experts ({where})",
                         f"use an expert_parallel among {_divisors(facts.num_experts)}"))
    return out


def _lengths(config: EngineConfig, recipe: RecipeInfo, facts: ModelFacts | None) -> list[str]:
    out: list[str] = []
    if isinstance(config.cuda_graphs, list) and max(config.cuda_graphs) > config.max_batch_size:
        out.append(_line("engine.cuda_graphs", f"batch size {max(config.cuda_graphs)} exceeds "
                         f"engine.max_batch_size {config.max_batch_size}",
                         f"list sizes <= {config.max_batch_size} or raise max_batch_size"))
    if facts is None or config.max_seq_len is None:
        return out
    context = facts.max_position_embeddings
    if context and config.max_seq_len > context and not facts.rope_scaling:
        out.append(_line("engine.max_seq_len", f"{config.max_seq_len} exceeds the target's context "
                         f"max_position_embeddings {context} ({facts.source}) and it has no rope_scaling",
                         f"set engine.max_seq_len <= {context}"))
    return out


def _checkpoint_format(config: EngineConfig, recipe: RecipeInfo, facts: ModelFacts | None) -> list[str]:
    out: list[str] = []
    quantize = recipe.section(QuantizeConfig)
    _, kv_algo = checkpoint_quant(recipe)
    if config.kv_cache.dtype == "fp8" and kv_algo != "FP8":
        have = f"quantize.kv_cache: {quantize.kv_cache}" if quantize is not None \
            else "no quantize section"
        out.append(_line("engine.kv_cache.dtype", f"fp8 but the checkpoint has no calibrated FP8 KV scales "
                         f"({have})", "set quantize.kv_cache: fp8, or engine.kv_cache.dtype: auto"))
    if config.kv_cache.dtype in ("bfloat16", "float16") and kv_algo == "FP8":
        out.append(_line("engine.kv_cache.dtype", f"{config.kv_cache.dtype} discards the FP8 KV scales "
                         "the checkpoint carries (quantize.kv_cache: fp8)",
                         "set engine.kv_cache.dtype: auto, or quantize.kv_cache: none"))
    return out


def _plugins(config: EngineConfig, recipe: RecipeInfo) -> list[str]:
    """engine.gemm_plugin: each named kernel exists, serves its arch, and has an FP8 checkpoint and a
    recorded TensorRT-LLM convention to patch."""
    settings = config.gemm_plugin
    if settings is None:
        return []
    out: list[str] = []
    quant_algo, _ = checkpoint_quant(recipe)
    # A Hub target whose weights are not here yet: its quantization is checked at build time.
    quantize = recipe.section(QuantizeConfig)
    unknown = quant_algo is None and quantize is None and recipe.uses_standin()
    # NVFP4: accepted, though the plugins take none of its GEMMs (`trtbuild plan` says which stay TensorRT-LLM's).
    if quant_algo not in ("FP8", "NVFP4") and not unknown:
        have = "no quantize section" if quantize is None else f"quant_algo {quant_algo}"
        out.append(_line("engine.gemm_plugin", f"the plugins run FP8 per-tensor linears but the engine reads "
                         f"a checkpoint with {have}", "add a quantize: section (FP8), or remove gemm_plugin"))
    for arch, name in settings.kernels.items():
        where = f"engine.gemm_plugin.kernels.{arch}"
        if arch not in recipe.gpu_archs:
            out.append(_line(where, f"{arch} is not among gpu_archs ({', '.join(recipe.gpu_archs)})",
                             "name kernels for the recipe's gpu_archs only"))
            continue
        try:
            plugin = plugins.get(name)
        except UserError:
            out.append(_line(where, f"unknown plugin '{name}'", f"use one of: {', '.join(plugins.available())}"))
            continue
        except ImportError as exc:
            out.append(_line(where, f"'{name}' could not be imported ({exc})",
                             "run trtbuild from the repository root, where the plugins/ package is"))
            continue
        for reason in plugin.compatibility_problems(arch=arch):
            out.append(_line(where, reason, "use gemm_weight_shuffle where warp specialization is unavailable"
                             f" ({', '.join(plugins.get('gemm_weight_shuffle').supported_archs)})"))
    try:
        plugin_module.convention(load_contract(config.trtllm_version))
    except UserError as exc:
        out.append(_line("engine.gemm_plugin", exc.message, exc.fix or "remove gemm_plugin"))
    return out


def _launcher(config: EngineConfig) -> list[str]:
    out: list[str] = []
    launcher = config.launcher
    world = config.tensor_parallel * config.pipeline_parallel
    gpus = launcher.nodes * launcher.gpus_per_node
    if world > gpus:
        out.append(_line("engine.tensor_parallel", f"tp {config.tensor_parallel} x pp "
                         f"{config.pipeline_parallel} = {world} ranks but engine.launcher has nodes "
                         f"{launcher.nodes} x gpus_per_node {launcher.gpus_per_node} = {gpus} GPUs",
                         f"raise launcher.nodes to {-(-world // launcher.gpus_per_node)} "
                         "or lower the parallel sizes"))
    elif launcher.nodes > 1 and world != gpus:
        out.append(_line("engine.launcher.nodes", f"{launcher.nodes} nodes x {launcher.gpus_per_node} GPUs = "
                         f"{gpus} MPI ranks but tp x pp = {world}: a multi-node launch starts one rank "
                         "per GPU",
                         f"set tp x pp = {gpus}, or nodes: {max(1, world // launcher.gpus_per_node)}"))
    return out


def _archs(config: EngineConfig, recipe: RecipeInfo) -> list[str]:
    out: list[str] = []
    archs = list(recipe.gpu_archs)
    quant_algo, _ = checkpoint_quant(recipe)
    no_fp8 = [a for a in archs if a not in FP8_ARCHS]
    if quant_algo == "FP8" and no_fp8:
        out.append(_line("gpu_archs", f"{', '.join(no_fp8)} has no FP8 tensor cores but the engine reads an "
                         "FP8 checkpoint (quantize section)",
                         "target sm_89 or newer, or drop the quantize section"))
    no_nvfp4 = [a for a in archs if a not in NVFP4_ARCHS]
    if quant_algo == "NVFP4" and no_nvfp4:
        out.append(_line("gpu_archs", f"{', '.join(no_nvfp4)} cannot run the NVFP4 checkpoint the engine reads "
                         "(TensorRT-LLM runs NVFP4 GEMMs on Blackwell only: sm_100a, sm_120a)",
                         f"set gpu_archs to [{', '.join(a for a in archs if a in NVFP4_ARCHS) or 'sm_100a'}], "
                         "or quantize.format: fp8 for Hopper"))
    no_pdl = [a for a in archs if a not in PDL_ARCHS]
    if config.env.get("TRTLLM_ENABLE_PDL") == "1" and no_pdl:
        out.append(_line("engine.env.TRTLLM_ENABLE_PDL", f"1 but gpu_archs {', '.join(no_pdl)} lacks "
                         "programmatic dependent launch (Hopper and newer)",
                         "remove TRTLLM_ENABLE_PDL or target sm_90a / sm_100a only"))
    return out


def _options(config: EngineConfig) -> list[str]:
    out: list[str] = []
    for key in sorted(set(config.llm_api_options) & set(OWNED_OPTIONS)):
        out.append(_line(f"engine.llm_api_options.{key}", "is set by the engine section itself",
                         f"set {OWNED_OPTIONS[key]} instead"))
    try:
        parse_options(config.llm_api_options, "engine.llm_api_options")
    except UserError as exc:
        out.append(_line(f"engine.llm_api_options.{exc.field}", exc.message, exc.fix or "give a valid value"))
    return out
