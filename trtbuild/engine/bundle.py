"""Assemble the engine bundle: target, draft, LLM-API options, launchers, the GEMM-plugin module.

Unchanged files are hard-linked from the input artifacts (a 16 GB checkpoint costs no space and
no time); the checkpoint TensorRT-LLM reads keeps its standard layout. See trtbuild/engine/stage.py for the
layout. The stage's temp dir is renamed into the cache only after this returns, so a failure
leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core import plugins
from trtbuild.core.contract import Contract, load_contract
from trtbuild.core.contract import validate as contract_validate
from trtbuild.core.contract.hf_config import rewrite_config
from trtbuild.core.errors import BuildError, UserError
from trtbuild.core.layout import BUNDLE, DRAFT_EAGLE3, MODEL_HF, QUANTIZED_HF, served_checkpoint
from trtbuild.core.llm_args import (
    CudaGraphConfig,
    KvCacheConfig,
    LlmApiOptions,
    SpeculativeConfig,
    parse_options,
    write_options,
)
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage_api import StageResult
from trtbuild.draft.config import DraftConfig
from trtbuild.engine import boundary, conformance, launchers, plugin_module
from trtbuild.engine.checkpoint_quant import quant_of_dir
from trtbuild.engine.config import draft_len, has_draft
from trtbuild.engine.facts import ModelFacts, facts_from_dir
from trtbuild.engine.llama4_wrap import text_only_env, wrap_target
from trtbuild.engine.release_fields import refuse_unless_written
from trtbuild.model.config import ModelConfig

if TYPE_CHECKING:
    from trtbuild.core.stage_api import StageContext, StageResult
    from trtbuild.engine.config import EngineConfig

BUNDLE_FORMAT = "trtbuild-engine-bundle/1"
TOKENIZER_PATTERNS = ("tokenizer*", "special_tokens_map.json", "vocab.json", "merges.txt",
                      "added_tokens.json", "chat_template.*", "generation_config.json")
OPTIONS_FILE = "llm_api_options.yaml"


@dataclass
class LinkStats:
    linked: int = 0
    copied: int = 0
    written: int = 0
    bytes_linked: int = 0
    bytes_copied: int = 0
    bytes_written: int = 0

    def to_dict(self) -> dict[str, int]:
        return dict(vars(self))


def link_file(src: Path, dst: Path, stats: LinkStats) -> None:
    """Hard-link `src` (symlinks resolved) to `dst`; copy when the filesystems differ."""
    real = src.resolve()
    dst.parent.mkdir(parents=True, exist_ok=True)
    size = real.stat().st_size
    try:
        os.link(real, dst)
        stats.linked += 1
        stats.bytes_linked += size
    except OSError:
        shutil.copy2(real, dst)
        stats.copied += 1
        stats.bytes_copied += size


def link_tree(src: Path, dst: Path, stats: LinkStats, *, skip: tuple[str, ...] = ()) -> list[str]:
    """Mirror the files under `src` (a directory or a link to one) into `dst`; returns their names."""
    root = src.resolve()
    names = []
    for file in sorted(root.rglob("*")):
        rel = file.relative_to(root)
        if file.is_dir() or rel.name.startswith(".") or str(rel) in skip:
            continue
        link_file(file, dst / rel, stats)
        names.append(str(rel))
    return names


def link_tokenizer(sources: list[Path], dst: Path, stats: LinkStats) -> list[str]:
    """Tokenizer files from the first source that has a tokenizer (the export, else the model's hf/)."""
    for source in sources:
        files = sorted({f for pattern in TOKENIZER_PATTERNS for f in source.glob(pattern) if f.is_file()})
        if any(f.name.startswith("tokenizer") for f in files):
            for file in files:
                if not (dst / file.name).exists():
                    link_file(file, dst / file.name, stats)
            return [f.name for f in files]
    return []


def _write_text(path: Path, text: str, stats: LinkStats, executable: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if executable:
        path.chmod(0o755)
    stats.written += 1
    stats.bytes_written += len(text.encode())


# --- inputs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Inputs:
    model_hf: Path  # the model stage's HF directory (tokenizer fallback)
    target: Path  # what TRT-LLM reads: the quantize export or the model's hf/
    quantized: bool
    draft: Path | None


def resolve_inputs(config: EngineConfig, ctx: StageContext) -> Inputs:
    model_hf = ctx.input("model").path / MODEL_HF
    target = served_checkpoint({name: artifact.path for name, artifact in ctx.inputs.items()})
    quantized = "quantize" in ctx.inputs
    if quantized and not target.is_dir():
        raise BuildError(f"the quantize artifact {target.parent} has no {QUANTIZED_HF}/ export", field="quantize",
                         fix="rebuild the quantize stage (trtbuild quantize RECIPE --force quantize)")
    draft = None
    if "draft" in ctx.inputs and has_draft(ctx.recipe):
        candidate = ctx.inputs["draft"].path / DRAFT_EAGLE3
        draft = candidate if candidate.is_dir() else None
    return Inputs(model_hf, target, quantized, draft)


# --- options --------------------------------------------------------------------------------------

def default_layers_to_capture(num_layers: int) -> list[int]:
    """TRT-LLM's default EAGLE-3 capture set {1, L/2 - 1, L - 4}."""
    return sorted({1, num_layers // 2 - 1, num_layers - 4})


def draft_capture_layers(draft_dir: Path) -> list[int] | None:
    try:
        cfg = json.loads((draft_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return sorted(int(i) for i in ids) if isinstance(ids, list) and ids else None


def build_options(config: EngineConfig, recipe: RecipeInfo, facts: ModelFacts | None,
                  draft_dir: Path | None, draft_rel: str = "draft", *, with_draft: bool | None = None,
                  contract: Contract | None = None) -> LlmApiOptions:
    """The LLM() arguments of this deployment, validated by the typed model, with the names of the
    selected release (contract): its EAGLE-3 decoding type and draft path key.

    `with_draft` (default: a draft directory was given) writes speculative_config without reading
    the draft, for checks before any build."""
    contract = contract or load_contract(config.trtllm_version)
    with_draft = draft_dir is not None if with_draft is None else with_draft
    kv = KvCacheConfig(enable_block_reuse=config.kv_cache.enable_block_reuse,
                       free_gpu_memory_fraction=config.kv_cache.free_gpu_memory_fraction)
    refuse_unless_written(contract, "kv_cache_config.dtype", config.kv_cache.dtype, "auto")
    refuse_unless_written(contract, "kv_cache_config.tokens_per_block", config.kv_cache.tokens_per_block, 32)
    if config.kv_cache.dtype != "auto":
        kv.dtype = config.kv_cache.dtype
    if config.kv_cache.tokens_per_block != 32:
        kv.tokens_per_block = config.kv_cache.tokens_per_block
    values: dict[str, Any] = {
        "tensor_parallel_size": config.tensor_parallel,
        "pipeline_parallel_size": config.pipeline_parallel,
        "max_batch_size": config.max_batch_size,
        "max_num_tokens": config.max_num_tokens,
        "kv_cache_config": kv,
        "enable_attention_dp": config.enable_attention_dp,
    }
    max_seq_len = config.max_seq_len or (facts.max_position_embeddings if facts else None)
    if max_seq_len:
        values["max_seq_len"] = max_seq_len
    if config.expert_parallel > 1 or (facts is not None and facts.num_experts):
        values["moe_expert_parallel_size"] = config.expert_parallel
    if config.launcher.nodes > 1:
        values["gpus_per_node"] = config.launcher.gpus_per_node
    model = recipe.section(ModelConfig)
    if model is not None and model.trust_remote_code:
        values["trust_remote_code"] = True
    if config.cuda_graphs is False:
        values["cuda_graph_config"] = None
    elif config.cuda_graphs is True:
        values["cuda_graph_config"] = CudaGraphConfig(max_batch_size=config.max_batch_size,
                                                      enable_padding=config.cuda_graph_padding)
    else:
        values["cuda_graph_config"] = CudaGraphConfig(batch_sizes=sorted(set(config.cuda_graphs)),
                                                      enable_padding=config.cuda_graph_padding)
    if config.enable_min_latency:
        values["enable_min_latency"] = True
    if not config.enable_autotuner:
        values["enable_autotuner"] = False
    ngram = ngram_config(recipe, draft_len(config, recipe))
    if ngram is not None:  # prompt lookup: no draft model
        values["speculative_config"] = ngram
    elif with_draft:
        spec = SpeculativeConfig(decoding_type=contract.eagle3_decoding_type,
                                 max_draft_len=draft_len(config, recipe) or 1,
                                 **{contract.draft_model_key: f"./{draft_rel}"},  # type: ignore[arg-type]
                                 eagle3_one_model=config.eagle3_one_model)
        layers = draft_capture_layers(draft_dir) if draft_dir is not None else None
        if layers and facts and facts.num_hidden_layers and \
                layers != default_layers_to_capture(facts.num_hidden_layers):
            refuse_unless_written(contract, "speculative_config.eagle3_layers_to_capture", layers,
                                  default_layers_to_capture(facts.num_hidden_layers))
            spec.eagle3_layers_to_capture = layers  # trained on other layers than TRT-LLM's default
        values["speculative_config"] = spec
    extra = parse_options(config.llm_api_options, "engine.llm_api_options")
    for key in extra.model_fields_set:
        values[key] = getattr(extra, key)
    options = LlmApiOptions(**values)
    # Re-validate the assembled object exactly as a reader of the file will.
    return parse_options(options.to_dict(), "llm_api_options.yaml")


def ngram_config(recipe: RecipeInfo, max_draft_len: int | None = None) -> SpeculativeConfig | None:
    """draft.source ngram: TRT-LLM's prompt lookup with a pool per request (what the runtime rehearses)."""
    draft = recipe.section(DraftConfig)
    if draft is None or draft.source != "ngram":
        return None
    return SpeculativeConfig(decoding_type="NGram", max_draft_len=max_draft_len or draft.max_draft_len,
                             max_matching_ngram_size=draft.max_matching_ngram_size, is_public_pool=False)


def with_absolute_paths(options: LlmApiOptions, bundle: Path) -> dict[str, Any]:
    """The options for an in-process LLM() call (relative paths made absolute against the bundle)."""
    data = options.to_dict()
    spec = data.get("speculative_config")
    for key in ("speculative_model_dir", "speculative_model"):
        if spec and spec.get(key) and not Path(spec[key]).is_absolute():
            spec[key] = str((bundle / spec[key]).resolve())
    return data


# --- plugins --------------------------------------------------------------------------------------

def plugin_key_material(names: list[str]) -> dict[str, Any]:
    """Hash of each plugin's kernel sources (the top-level plugins/ package is outside trtbuild)."""
    material: dict[str, Any] = {}
    for name in names:
        try:
            plugin = plugins.get(name)
        except (UserError, ImportError):
            material[name] = None  # preflight reports it
            continue
        digest = hashlib.sha256()
        for module in sorted({type(plugin).__module__, *plugin.code_modules}):
            for file in _module_files(module):
                digest.update(file.name.encode())
                digest.update(file.read_bytes())
        material[name] = digest.hexdigest()[:16]
    return material


def _module_files(module: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or spec.origin is None:
        return []
    if spec.submodule_search_locations:
        return sorted(p for loc in spec.submodule_search_locations for p in Path(loc).rglob("*.py"))
    return [Path(spec.origin)]


def aot_plugins(kernels: dict[str, str], bundle: Path, progress: Any) -> dict[str, Any]:
    """Compile each named kernel for the archs that run it into plugins/<name>/ and check the SASS.

    The server JIT-compiles the same source on first use; this is the build-time proof that it
    compiles for those archs to FP8 tensor-core code without spills."""
    reports: dict[str, Any] = {}
    for name in sorted(set(kernels.values())):
        archs = sorted(a for a, k in kernels.items() if k == name)
        plugin = plugins.get(name)
        out = bundle / "plugins" / name
        out.mkdir(parents=True, exist_ok=True)
        progress.log(f"engine: AOT-compiling {name} for {', '.join(archs)}")
        report = plugin.aot_build(out, archs, progress=progress)
        (out / "sass_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
        reports[name] = report
    failed = {n: r for n, r in reports.items() if not r.ok}
    if failed:
        name, report = next(iter(failed.items()))
        detail = report.problems[0] if report.problems else "no kernel was compiled"
        raise BuildError(f"plugin {name}: SASS check failed: {detail}", field="engine.gemm_plugin",
                         fix=f"see plugins/{name}/sass_report.json in the failed build's log")
    return {n: _sass_summary(r) for n, r in reports.items()}


def _sass_summary(report: Any) -> dict[str, Any]:
    kernels = report.kernels
    return {"ok": report.ok, "kernels": len(kernels), "archs": sorted({k.arch for k in kernels}),
            "mma": sorted({m.split(".")[0] for k in kernels for m in k.mma}),
            "spill_bytes": sum((k.spill_stores or 0) + (k.spill_loads or 0) for k in kernels),
            "local_memory_ops": sum(len(k.local_memory_ops) for k in kernels)}


# --- the stage ------------------------------------------------------------------------------------

def build_bundle(config: EngineConfig, ctx: StageContext) -> StageResult:
    recipe, progress = ctx.recipe, ctx.progress
    archs = list(recipe.gpu_archs)
    contract = load_contract(config.trtllm_version)
    version = boundary.probe()
    if version is None:
        if config.require_tensorrt_llm:
            raise UserError("tensorrt_llm is not importable and engine.require_tensorrt_llm is true",
                            field="engine.require_tensorrt_llm",
                            fix="install TensorRT-LLM on a CUDA host, "
                            "or set engine.require_tensorrt_llm: false")
        progress.log("engine: tensorrt_llm is not importable here; writing the bundle without the "
                     "TensorRT-LLM build / load check")
    inputs = resolve_inputs(config, ctx)
    bundle = ctx.out_dir / BUNDLE
    bundle.mkdir(parents=True)
    stats = LinkStats()
    model_facts = facts_from_dir(inputs.model_hf.resolve())

    # Target, with the tokenizer when the export carries none.
    target_files = link_tree(inputs.target, bundle / "target", stats)
    link_tokenizer([inputs.model_hf], bundle / "target", stats)
    # The release's transformers reads RoPE at the top level of config.json (contract: hf_config).
    if (bundle / "target" / "config.json").is_file() and rewrite_config(bundle / "target" / "config.json"):
        stats.written += 1
    wrapped = wrap_llama4(bundle / "target", contract)
    stats.written += len(wrapped)
    # A text-only Llama 4 target: the release builds no vision encoder (and does not read the checkpoint a
    # second time for one) only with the contract's environment (llama4_model.text_only_load_needs).
    server_env = {**text_only_env(contract), **config.env} if wrapped else dict(config.env)
    served = "target"
    target_facts = facts_from_dir(inputs.target.resolve()) or model_facts
    if stats.copied:
        progress.log(f"engine: {stats.copied} files ({stats.bytes_copied / 1e9:.2f} GB) copied, not "
                     "hard-linked: the input artifacts are on another filesystem than the cache")

    draft_rel = None
    if inputs.draft is not None:
        link_tree(inputs.draft, bundle / "draft", stats)
        draft_rel = "draft"

    # GEMM plugins: the module TensorRT-LLM's server imports, and the kernels' AOT build check.
    gemm: dict[str, Any] | None = None
    launch = conformance.module_launch(config, contract)
    if config.gemm_plugin is not None:
        release = contract.version
        plugin_module.convention(contract)  # a release without a recorded FP8-linear convention: one line
        hf_config = _hf_config(inputs.target) or _hf_config(inputs.model_hf) or {}
        quant, _, said = quant_of_dir(inputs.target)  # what TensorRT-LLM reads: hf_quant_config.json first
        if quant != "FP8" and not inputs.quantized:
            said = said or "neither hf_quant_config.json nor config.json"
            raise UserError(f"engine.gemm_plugin runs FP8 per-tensor linears but {inputs.target} is not an FP8 "
                            f"checkpoint (quant_algo {quant} in {said})", field="engine.gemm_plugin",
                            fix="add a quantize: section (FP8), or remove gemm_plugin")
        module_config = plugin_module.module_config(config.gemm_plugin, hf_config, config.tensor_parallel,
                                                    config.enable_attention_dp)
        files = plugin_module.write_module(bundle, module_config)
        stats.written += len(files)
        sass = aot_plugins(config.gemm_plugin.kernels, bundle, progress)
        gemm = {"module": f"{plugin_module.MODULE_DIR}/{plugin_module.PACKAGE}", "release": release,
                "kernels": dict(config.gemm_plugin.kernels), "linears": list(config.gemm_plugin.linears),
                "max_tokens": config.gemm_plugin.max_tokens,
                "torch_ops": {k: plugins_op(k) for k in sorted(set(config.gemm_plugin.kernels.values()))},
                "conventions": sorted(module_config["releases"]),
                "loaded_by": {"trtllm-serve": launch, "triton_llmapi": {"python_path": launch["python_path"]}},
                "plan": plugin_module.describe(config.gemm_plugin, archs, contract, hf_config,
                                               config.tensor_parallel, bool(config.enable_min_latency)),
                "token_ranges": {k: list(v) if v else None for k, v in plugin_module.plugin_token_ranges(
                    config.gemm_plugin, hf_config, config.tensor_parallel, bool(config.enable_min_latency),
                    contract).items()},
                "aot": {"dirs": {k: f"plugins/{k}" for k in sass}, "sass": sass,
                        "note": "build-time check; the server JIT-compiles the same kernel source"}}

    options = build_options(config, recipe, target_facts, inputs.draft, draft_rel or "draft", contract=contract)
    write_options(options, bundle / OPTIONS_FILE)
    stats.written += 1

    # Launchers.
    serve = dataclasses.replace(conformance.serve_spec(config, recipe, contract, served=served), env=server_env)
    cluster = launchers.ClusterSpec(
        nodes=config.launcher.nodes, gpus_per_node=config.launcher.gpus_per_node,
        partition=config.launcher.slurm.partition, account=config.launcher.slurm.account,
        time_limit=config.launcher.slurm.time_limit, job_name=config.launcher.slurm.job_name,
        container_image=config.launcher.container_image,
        container_mounts=tuple(config.launcher.container_mounts))
    for name, text in (("serve.sh", launchers.single_node_script(serve)),
                       ("mpirun.sh", launchers.mpirun_script(serve, cluster)),
                       ("slurm.sbatch", launchers.slurm_script(serve, cluster))):
        _write_text(bundle / "launch" / name, text, stats, executable=True)

    # Everything written so far against the release the bundle is for (one line, exit 2).
    contract_validate.raise_first(
        conformance.bundle_violations(bundle, options, serve, config, contract, draft=draft_rel, served=served),
        fix=f"see docs/gpu-path.md (engine.trtllm_version: {contract.version})")

    # The real TensorRT-LLM load check, when it is here and a GPU is too.
    trt: dict[str, Any] = {"importable": version is not None, "version": version}
    if version is not None:
        if boundary.gpu_count() == 0:
            progress.log("engine: tensorrt_llm is importable but no GPU is visible; skipping the load check")
            trt["load_check"] = "skipped: no GPU"
        else:
            trt.update(boundary.load_check(bundle / served, with_absolute_paths(options, bundle)))

    description = {
        "format": BUNDLE_FORMAT,
        "backend": "pytorch",
        "trtllm_version": contract.version,
        "model": served,
        "tokenizer": served,
        "draft": draft_rel,
        "llm_api_options": OPTIONS_FILE,
        "launch": {"single_node": "launch/serve.sh", "mpirun": "launch/mpirun.sh",
                   "slurm": "launch/slurm.sbatch"},
        "env": server_env,
        "parallel": {"tensor": config.tensor_parallel, "pipeline": config.pipeline_parallel,
                     "expert": config.expert_parallel, "nodes": config.launcher.nodes,
                     "gpus_per_node": config.launcher.gpus_per_node},
        "gpu_archs": archs,
        "quantized": inputs.quantized,
        "target_format": "hf",
        "target_files": target_files,
        "gemm_plugin": gemm,
        "tensorrt_llm": trt,
    }
    _write_text(bundle / "bundle.json", json.dumps(description, indent=2, default=str) + "\n", stats)

    metrics: dict[str, Any] = {
        "backend": "pytorch",
        "speculative": draft_rel is not None,
        "max_draft_len": options.speculative_config.max_draft_len if options.speculative_config else None,
        "world_size": config.tensor_parallel * config.pipeline_parallel,
        "tensorrt_llm": version or "absent",
        "files_linked": stats.linked,
        "files_copied": stats.copied,
        "files_written": stats.written,
        "bytes_linked": stats.bytes_linked,
        "bytes_written": stats.bytes_written,
    }
    if gemm is not None:
        metrics["gemm_plugin"] = {"kernels": gemm["kernels"], "sass": gemm["aot"]["sass"]}
    metrics.update({k: v for k, v in trt.items() if k not in ("importable", "version")})
    info = {"bundle": description, "inputs": {"target": str(inputs.target.resolve()),
                                              "draft": str(inputs.draft.resolve()) if inputs.draft else None}}
    return StageResult(metrics=metrics, info=info)


def wrap_llama4(target: Path, contract: Contract) -> list[str]:
    """A text-only Llama 4 target rewritten as the release's registered Llama 4 class (contract
    llama4_model: architectures, weight_prefix); other targets: nothing."""
    section = contract.section("llama4_model") or {}
    archs = section.get("architectures") or []
    if not (target / "config.json").is_file() or not archs:
        return []
    return wrap_target(target, str(archs[0]), str(section.get("weight_prefix", "language_model.")))


def plugins_op(name: str) -> str:
    return plugins.get(name).torch_op_name


def _hf_config(directory: Path) -> dict[str, Any] | None:
    try:
        cfg = json.loads((directory.resolve() / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return cfg if isinstance(cfg, dict) else None
