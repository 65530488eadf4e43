"""Assemble the engine bundle: target, draft, LLM-API options, launchers, legacy commands, plugins.

Unchanged files are hard-linked from the input artifacts (a 16 GB checkpoint costs no space and
no time); only tensors a plugin rewrites are written anew. See trtbuild/stages/engine.py for the
layout. The stage's temp dir is renamed into the cache only after this returns, so a failure
leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.errors import BuildError, UserError
from trtbuild.trtllm import boundary, launchers, legacy
from trtbuild.trtllm.checks import draft_len, has_draft
from trtbuild.trtllm.facts import ModelFacts, facts_from_dir
from trtbuild.trtllm.llm_args import (
    CudaGraphConfig,
    Eagle3DecodingConfig,
    KvCacheConfig,
    LlmApiOptions,
    NGramDecodingConfig,
    parse_options,
    write_options,
)

if TYPE_CHECKING:
    from trtbuild.stages.base import StageContext, StageResult
    from trtbuild.stages.engine import EngineConfig

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
    model_hf: Path  # the model stage's HF directory (tokenizer fallback, converter input)
    target: Path  # what TRT-LLM reads: quantize export or model hf
    target_kind: str  # "hf" | "trtllm_checkpoint"
    quantized: bool
    draft: Path | None


def resolve_inputs(config: EngineConfig, ctx: StageContext) -> Inputs:
    model_hf = ctx.input("model").path / "hf"
    target, kind, quantized = model_hf, "hf", False
    if "quantize" in ctx.inputs:
        q = ctx.inputs["quantize"].path
        if (q / "hf").is_dir():
            target, kind, quantized = q / "hf", "hf", True
        elif (q / "trtllm_ckpt").is_dir():
            target, kind, quantized = q / "trtllm_ckpt", "trtllm_checkpoint", True
        else:
            raise BuildError(f"the quantize artifact {q} has neither hf/ nor trtllm_ckpt/", field="quantize")
    if config.backend == "pytorch" and kind != "hf":
        raise UserError("engine.backend pytorch needs a Hugging Face checkpoint but the quantize stage "
                        "exported trtllm_checkpoint", field="quantize.export", fix="set quantize.export: hf")
    if config.backend == "tensorrt" and quantized and kind != "trtllm_checkpoint":
        raise UserError("engine.backend tensorrt needs the quantize stage's TensorRT-LLM checkpoint",
                        field="quantize.export", fix="set quantize.export: trtllm_checkpoint")
    draft = None
    if "draft" in ctx.inputs and has_draft(ctx.recipe):
        candidate = ctx.inputs["draft"].path / "eagle3"
        draft = candidate if candidate.is_dir() else None
    return Inputs(model_hf, target, kind, quantized, draft)


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


def build_options(config: EngineConfig, recipe: Any, facts: ModelFacts | None,
                  draft_dir: Path | None, draft_rel: str = "draft") -> LlmApiOptions:
    """The LLM() arguments of this deployment, validated by the typed model."""
    torch_backend = config.backend == "pytorch"
    kv = KvCacheConfig(enable_block_reuse=config.kv_cache.enable_block_reuse,
                       free_gpu_memory_fraction=config.kv_cache.free_gpu_memory_fraction)
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
    model = getattr(recipe, "model", None)
    if model is not None and getattr(model, "trust_remote_code", False):
        values["trust_remote_code"] = True
    if torch_backend:
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
    if draft_dir is not None:
        spec = Eagle3DecodingConfig(decoding_type="Eagle3", max_draft_len=draft_len(config, recipe) or 1,
                                    speculative_model_dir=f"./{draft_rel}",
                                    eagle3_one_model=config.eagle3_one_model)
        layers = draft_capture_layers(draft_dir)
        if layers and facts and facts.num_hidden_layers and \
                layers != default_layers_to_capture(facts.num_hidden_layers):
            spec.eagle3_layers_to_capture = layers  # trained on other layers than TRT-LLM's default
        values["speculative_config"] = spec
    elif ngram_config(recipe) is not None:
        values["speculative_config"] = ngram_config(recipe, draft_len(config, recipe))
    extra = parse_options(config.llm_api_options, "engine.llm_api_options")
    for key in extra.model_fields_set:
        values[key] = getattr(extra, key)
    options = LlmApiOptions(**values)
    # Re-validate the assembled object exactly as a reader of the file will.
    return parse_options(options.to_dict(), "llm_api_options.yaml")


def ngram_config(recipe: Any, max_draft_len: int | None = None) -> NGramDecodingConfig | None:
    """draft.source ngram: TRT-LLM's prompt lookup with a pool per request (what the runtime rehearses)."""
    draft = getattr(recipe, "draft", None)
    if draft is None or getattr(draft, "source", None) != "ngram":
        return None
    return NGramDecodingConfig(decoding_type="NGram", max_draft_len=max_draft_len or draft.max_draft_len,
                               max_matching_ngram_size=draft.max_matching_ngram_size, is_public_pool=False)


def with_absolute_paths(options: LlmApiOptions, bundle: Path) -> dict[str, Any]:
    """The options for an in-process LLM() call (relative paths made absolute against the bundle)."""
    data = options.to_dict()
    spec = data.get("speculative_config")
    if spec and spec.get("speculative_model_dir") and not Path(spec["speculative_model_dir"]).is_absolute():
        spec["speculative_model_dir"] = str((bundle / spec["speculative_model_dir"]).resolve())
    return data


# --- plugins --------------------------------------------------------------------------------------

def plugin_key_material(names: list[str]) -> dict[str, Any]:
    """Hash of each plugin's kernel sources (the top-level plugins/ package is outside trtbuild)."""
    from trtbuild import plugins

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


def transform_targets(plugin_names: list[str], target: Path, bundle: Path, archs: list[str],
                      stats: LinkStats, progress: Any) -> dict[str, Any]:
    """Per GPU arch, `target-<arch>/` with the weights in the plugins' layout; unchanged files linked.

    Archs whose tile is the same share the rewritten files through hard links."""
    from trtbuild import plugins

    if not plugin_names:
        return {}
    plugin = plugins.get(plugin_names[0])  # preflight guarantees one shared layout
    done: dict[tuple[int, int], Path] = {}
    report: dict[str, Any] = {}
    for arch in archs:
        tile = tuple(plugin.tile_for(arch))
        out = bundle / f"target-{arch}"
        if tile in done:
            link_tree(done[tile], out, stats)
            report[arch] = {"dir": out.name, "tile": list(tile), "shared_with": done[tile].name}
            continue
        rewritten = _transform_dir(plugin, target, out, arch, stats, progress)
        done[tile] = out
        report[arch] = {"dir": out.name, "tile": list(tile), "rewritten_tensors": rewritten}
    return {"layout": plugin.layout, "by": plugin.name, "archs": report}


def _transform_dir(plugin: Any, target: Path, out: Path, arch: str, stats: LinkStats, progress: Any) -> int:
    from safetensors.torch import load_file, save_file

    from trtbuild.safetensors_header import read_header

    root = target.resolve()
    weights = sorted(root.glob("*.safetensors"))
    # Only shards holding FP8 tensors are rewritten; the others (embeddings, norms) are linked as is.
    fp8 = [w for w in weights if any(t.get("dtype") == "F8_E4M3" for t in read_header(w).values())]
    if not fp8:
        raise UserError(f"plugin {plugin.name} needs FP8 linear weights but {root} has none",
                        field="engine.plugins", fix="add a quantize: section (FP8) or drop the plugin")
    link_tree(root, out, stats, skip=tuple(w.name for w in fp8))
    rewritten = 0
    with progress.task(f"{plugin.name} weights for {arch}", len(fp8)) as bar:
        for file in fp8:
            state = load_file(str(file))
            new = plugin.transform_weights(state, arch)
            rewritten += sum(1 for k, v in new.items() if k in state and v is not state[k])
            meta = {k: str(v) for k, v in plugin.metadata(arch).items()}
            save_file({k: v.contiguous() for k, v in new.items()}, str(out / file.name), metadata=meta)
            stats.written += 1
            stats.bytes_written += (out / file.name).stat().st_size
            bar.advance(1)
    return rewritten


def aot_plugins(plugin_names: list[str], bundle: Path, archs: list[str], progress: Any) -> dict[str, Any]:
    """Compile every plugin's kernels for the recipe's archs into plugins/<name>/ and check the SASS."""
    from trtbuild import plugins

    reports: dict[str, Any] = {}
    for name in plugin_names:
        plugin = plugins.get(name)
        out = bundle / "plugins" / name
        out.mkdir(parents=True, exist_ok=True)
        progress.log(f"engine: AOT-compiling {name} for {', '.join(archs)}")
        report = plugin.aot_build(out, list(archs), progress=progress)
        (out / "sass_report.json").write_text(json.dumps(report.to_dict(), indent=2, default=str))
        reports[name] = report
    failed = {n: r for n, r in reports.items() if not r.ok}
    if failed:
        name, report = next(iter(failed.items()))
        detail = report.problems[0] if report.problems else "no kernel was compiled"
        raise BuildError(f"plugin {name}: SASS check failed: {detail}", field="engine.plugins",
                         fix=f"see plugins/{name}/sass_report.json in the failed build's log")
    return {n: _sass_summary(r) for n, r in reports.items()}


def _sass_summary(report: Any) -> dict[str, Any]:
    kernels = report.kernels
    return {"ok": report.ok, "kernels": len(kernels), "archs": sorted({k.arch for k in kernels}),
            "mma": sorted({m.split(".")[0] for k in kernels for m in k.mma}),
            "spill_bytes": sum((k.spill_stores or 0) + (k.spill_loads or 0) for k in kernels),
            "local_memory_ops": sum(len(k.local_memory_ops) for k in kernels)}


def write_trtllm_plugin_modules(plugin_names: list[str], bundle: Path, stats: LinkStats) -> str | None:
    """The TRT-LLM python plugins as one importable package (trtllm-serve --custom_module_dirs)."""
    from trtbuild import plugins

    if not plugin_names:
        return None
    package = bundle / "plugins" / "trtllm_plugins"
    modules = []
    for name in plugin_names:
        plugin = plugins.get(name)
        module = plugin.name  # one file per plugin (their module paths share a basename)
        _write_text(package / f"{module}.py", plugin.trtllm_python_plugin, stats)
        modules.append(module)
    init = ('"""TensorRT-LLM python plugins of this bundle; importing registers them (engine load)."""\n'
            + "".join(f"from . import {m}  # noqa: F401\n" for m in modules))
    _write_text(package / "__init__.py", init, stats)
    return str(package.relative_to(bundle))


# --- the stage ------------------------------------------------------------------------------------

def _converter_dtype(config: EngineConfig, hf_dir: Path) -> str:
    if config.legacy.dtype != "auto":
        return config.legacy.dtype
    try:
        cfg = json.loads((hf_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return "bfloat16"
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")
    return dtype if dtype in ("float16", "bfloat16", "float32") else "bfloat16"


def build_bundle(config: EngineConfig, ctx: StageContext) -> StageResult:
    from trtbuild.stages.base import StageResult

    recipe, progress = ctx.recipe, ctx.progress
    archs = list(recipe.gpu_archs)
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
    bundle = ctx.out_dir / "bundle"
    bundle.mkdir(parents=True)
    stats = LinkStats()
    model_facts = facts_from_dir(inputs.model_hf.resolve())

    # Target (+ tokenizer for engines, which carry none).
    tokenizer_rel: str | None = None
    hf_rel: str | None = None
    if config.backend == "pytorch":
        target_files = link_tree(inputs.target, bundle / "target", stats)
        link_tokenizer([inputs.model_hf], bundle / "target", stats)  # export without tokenizer: add it
        served = "target"
    else:
        if inputs.target_kind == "trtllm_checkpoint":
            target_files = link_tree(inputs.target, bundle / "target", stats)
        else:  # unquantized: the converter writes target/ from hf/ at build time
            target_files = link_tree(inputs.target, bundle / "hf", stats)
            hf_rel = "hf"
        link_tokenizer([inputs.target, inputs.model_hf], bundle / "tokenizer", stats)
        tokenizer_rel, served = "tokenizer", "engine"
    target_facts = facts_from_dir(inputs.target.resolve()) or model_facts
    if stats.copied:
        progress.log(f"engine: {stats.copied} files ({stats.bytes_copied / 1e9:.2f} GB) copied, not "
                     "hard-linked: the input artifacts are on another filesystem than the cache")

    draft_rel = None
    if inputs.draft is not None:
        link_tree(inputs.draft, bundle / "draft", stats)
        draft_rel = "draft"

    # Plugins: rewritten weights per arch, AOT kernels + SASS report, TRT-LLM python plugins.
    plugin_weights = transform_targets(config.plugins, inputs.target, bundle, archs, stats, progress)
    sass = aot_plugins(config.plugins, bundle, archs, progress) if config.plugins else {}
    module_dir = write_trtllm_plugin_modules(config.plugins, bundle, stats)

    options = build_options(config, recipe, target_facts, inputs.draft, draft_rel or "draft")
    write_options(options, bundle / OPTIONS_FILE)
    stats.written += 1

    # Launchers.
    serve = launchers.ServeSpec(
        model=served, backend=config.backend, tensor_parallel=config.tensor_parallel,
        pipeline_parallel=config.pipeline_parallel, expert_parallel=config.expert_parallel,
        options_file=OPTIONS_FILE, tokenizer=tokenizer_rel,
        trust_remote_code=bool(getattr(getattr(recipe, "model", None), "trust_remote_code", False)),
        custom_module_dirs=(module_dir,) if module_dir and config.backend == "tensorrt" else (),
        env=dict(config.env), host=config.launcher.host, port=config.launcher.port)
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

    # Legacy engine commands.
    legacy_info = None
    commands: list[list[str]] = []
    if config.backend == "tensorrt":
        facts = model_facts or target_facts
        spec = legacy.LegacySpec(
            model_type=(facts.model_type if facts and facts.model_type else "llama"),
            dtype=_converter_dtype(config, inputs.model_hf), fp8=inputs.quantized,
            checkpoint_ready=inputs.target_kind == "trtllm_checkpoint",
            tensor_parallel=config.tensor_parallel, pipeline_parallel=config.pipeline_parallel,
            expert_parallel=config.expert_parallel, moe=bool(facts and facts.num_experts),
            max_batch_size=config.max_batch_size, max_seq_len=options.max_seq_len or 2048,
            max_num_tokens=config.max_num_tokens, tokens_per_block=config.kv_cache.tokens_per_block,
            hf_dir=hf_rel or "hf", extra_flags=tuple(config.legacy.extra_flags))
        convert = legacy.convert_argv(spec)
        commands = [c for c in (convert, legacy.build_argv(spec)) if c is not None]
        _write_text(bundle / "build" / "build_engine.sh", legacy.build_script(spec), stats, executable=True)
        legacy_info = {"script": "build/build_engine.sh", "convert": convert,
                       "build": legacy.build_argv(spec), "engine_dir": spec.engine_dir}
        _write_text(bundle / "build" / "commands.json", json.dumps(legacy_info, indent=2) + "\n", stats)

    # The real TensorRT-LLM build / load check, when it is here and a GPU is too.
    trt: dict[str, Any] = {"importable": version is not None, "version": version}
    if version is not None:
        if boundary.gpu_count() == 0:
            progress.log("engine: tensorrt_llm is importable but no GPU is visible; "
                         "skipping the build / load check")
            trt["load_check"] = "skipped: no GPU"
        else:
            if commands:
                trt.update(boundary.build_engine(bundle, commands))
            tokenizer = bundle / tokenizer_rel if tokenizer_rel else None
            trt.update(boundary.load_check(bundle / served, with_absolute_paths(options, bundle),
                                           config.backend, tokenizer))

    description = {
        "format": BUNDLE_FORMAT,
        "backend": config.backend,
        "model": served,
        "tokenizer": tokenizer_rel or served,
        "draft": draft_rel,
        "llm_api_options": OPTIONS_FILE,
        "launch": {"single_node": "launch/serve.sh", "mpirun": "launch/mpirun.sh",
                   "slurm": "launch/slurm.sbatch"},
        "env": dict(config.env),
        "parallel": {"tensor": config.tensor_parallel, "pipeline": config.pipeline_parallel,
                     "expert": config.expert_parallel, "nodes": config.launcher.nodes,
                     "gpus_per_node": config.launcher.gpus_per_node},
        "gpu_archs": archs,
        "quantized": inputs.quantized,
        "target_format": inputs.target_kind,
        "target_files": target_files,
        "plugins": _plugin_description(config.plugins, plugin_weights, sass, module_dir),
        "legacy": legacy_info,
        "tensorrt_llm": trt,
    }
    _write_text(bundle / "bundle.json", json.dumps(description, indent=2, default=str) + "\n", stats)

    metrics: dict[str, Any] = {
        "backend": config.backend,
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
    if sass:
        metrics["plugins"] = sass
    metrics.update({k: v for k, v in trt.items() if k not in ("importable", "version")})
    info = {"bundle": description, "inputs": {"target": str(inputs.target.resolve()),
                                              "draft": str(inputs.draft.resolve()) if inputs.draft else None}}
    return StageResult(metrics=metrics, info=info)


def _plugin_description(names: list[str], weights: dict[str, Any], sass: dict[str, Any],
                        module_dir: str | None) -> dict[str, Any]:
    from trtbuild import plugins

    out: dict[str, Any] = {}
    for name in names:
        plugin = plugins.get(name)
        out[name] = {**plugin.describe(), "aot_dir": f"plugins/{name}", "sass": sass.get(name),
                     "weights": weights.get("archs") if weights.get("layout") == plugin.layout else None,
                     "trtllm_module_dir": module_dir,
                     "served_by_trtllm": False,
                     "note": "TensorRT-LLM's launchers serve target/ (stock layout); target-<arch>/ is read "
                             "by the plugin's torch op and by trtbuild's runtime"}
    return out
