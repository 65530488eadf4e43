"""What `trtbuild plan` says when the target's weights are not on this machine.

A GPU recipe (model.standin_config) validates and plans anywhere on its stand-in's shapes; these
notes tell the user that the weights are absent, what to fetch, and what each stage would run on
the GPU host: world size, weight memory, the ModelOpt / TensorRT-LLM / Triton steps, and where
the model is too large for the stages' in-process steps, the distributed tooling to use instead.
Plain reads of the recipe and the config; nothing heavy is imported.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trtbuild.app.recipe import Recipe
from trtbuild.core.contract import load_contract
from trtbuild.draft.config import DraftConfig, DraftTraining
from trtbuild.engine.checkpoint_quant import checkpoint_quant, quant_of_dir
from trtbuild.model.source import hf_cache_dir, target_hf_config, text_config, uses_standin
from trtbuild.quantize.distributed import rank_memory

# One H100's memory: the reference for "fits on one GPU" (the recipe does not name the card).
ONE_GPU_GB = 80.0
GPUS_PER_NODE = 8
# ModelOpt's hf_ptq.py caps each GPU at 80% for the weights when a model spills over one GPU
# (examples/llm_ptq/example_utils.py get_model, gpu_mem_percentage=0.8, at 0.37.0 = df0882a6).
CALIBRATION_GPU_SHARE = 0.8


def estimate_parameters(hf_config: dict[str, Any]) -> int:
    """Parameters of the language model from its config: dense Llama, or Llama 4's interleaved MoE
    (routed experts + shared expert + router on MoE layers, `intermediate_size_mlp` on dense ones)."""
    outside, layers = parameter_layout(hf_config)
    return outside + sum(layers)


def parameter_layout(hf_config: dict[str, Any]) -> tuple[int, list[int]]:
    """(parameters outside the decoder layers: embeddings, final norm, lm_head; each decoder layer's)."""
    text = text_config(hf_config)
    h, layers, vocab = text["hidden_size"], text["num_hidden_layers"], text["vocab_size"]
    heads = text["num_attention_heads"]
    kv = text.get("num_key_value_heads") or heads
    head_dim = text.get("head_dim") or h // heads
    attention = 2 * h * heads * head_dim + 2 * h * kv * head_dim
    if text.get("attention_bias"):
        attention += heads * head_dim + 2 * kv * head_dim + h
    experts = text.get("num_local_experts") or 0
    inter = text["intermediate_size"]
    moe_layers: set[int] = set()
    if experts:
        step = text.get("interleave_moe_layer_step") or 1
        moe_layers = set(text.get("moe_layers") or range(step - 1, layers, step))
    tied = text.get("tie_word_embeddings", hf_config.get("tie_word_embeddings"))
    outside = vocab * h * (1 if tied else 2) + h
    per_layer = []
    for layer in range(layers):
        if layer in moe_layers:
            mlp = experts * 3 * h * inter + 3 * h * inter + h * experts
        else:
            mlp = 3 * h * ((text.get("intermediate_size_mlp") or inter) if experts else inter)
        per_layer.append(attention + mlp + 2 * h)
    return outside, per_layer


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


def _hf_datasets(recipe: Recipe) -> list[str]:
    """Hugging Face datasets the recipe reads (they come from the local cache only)."""
    sources = []
    quantize, draft = recipe.quantize, recipe.draft
    if quantize is not None:
        sources += [quantize.calibration.dataset, quantize.gate.eval_dataset]
    if draft is not None and draft.source != "none":
        if draft.eval.dataset is not None:
            sources.append(draft.eval.dataset)
        if draft.source == "train":
            sources.append(draft.dataset)
    names = [s.hf for s in sources if getattr(s, "kind", None) == "hf" and s.hf]
    return list(dict.fromkeys(names))


def _fetch(recipe: Recipe) -> str:
    model, draft = recipe.model, recipe.draft
    assert model is not None  # a stand-in speaks only for a model section's target
    revision = f" --revision {model.revision}" if model.revision != "main" else ""
    steps = [f"hf download {model.repo_id}{revision}" if model.source == "hub"
             else f"copy the model to {recipe.resolve_path(str(model.path))}"]
    if draft is not None and draft.source == "hub":
        steps.append(f"hf download {draft.repo_id}")
    elif draft is not None and draft.source == "path":
        steps.append(f"copy the draft to {recipe.resolve_path(str(draft.path))}")
    steps += [f"hf download --repo-type dataset {name}" for name in _hf_datasets(recipe)]
    return "  1. fetch (into the HF cache, on a connected machine): " + "; ".join(steps)


def _quantize_step(recipe: Recipe, params: int, layout: tuple[int, list[int]]) -> list[str]:
    quantize = recipe.quantize
    bf16 = 2.0 * params
    if quantize is None:
        quant = _checkpoint_quant(recipe)
        have = (f"the checkpoint is already {quant}" if quant
                else "the engine serves the checkpoint as it is, with its own quantization_config if any")
        return [f"     quantize: not in the recipe ({have})"]
    cal, gate = quantize.calibration, quantize.gate
    kv = ", FP8 KV cache" if quantize.kv_cache == "fp8" else ""
    gpus = calibration_gpus(params)
    world = cal.world_size()
    where = ("in one process on cuda:0" if gpus == 1 else
             f"in one process, the model spread over {gpus} GPUs (device_map=\"auto\", as ModelOpt's hf_ptq.py)")
    # NVFP4: half a byte a weight plus one e4m3 scale per 16 (0.5625 byte); FP8: one byte.
    fmt, cfg, quantized = (("NVFP4", "NVFP4_DEFAULT_CFG", 0.5625 * params) if quantize.format == "nvfp4"
                           else ("FP8", "FP8_DEFAULT_CFG", float(params)))
    if world > 1:
        where = (f"calibrated in {cal.nodes} node(s) x {cal.processes} processes (torchrun"
                 + (", srun under Slurm" if cal.nodes > 1 else "") + ", FSDP2-sharded decoder layers, ModelOpt "
                 f"all-reduces the amaxes), gate and export {where}")
    lines = [f"     quantize: ModelOpt {fmt} PTQ ({cfg}{kv}) {where}: "
             f"{cal.num_samples} windows x {cal.seq_len} tokens of {cal.dataset.describe()}; "
             f"gate: perplexity ratio <= {gate.max_perplexity_ratio} on {gate.eval_dataset.describe()}; "
             f"export: {quantize.export} ({_gb(bf16)} BF16 -> ~{_gb(quantized)} {fmt})",
             f"     quantize memory{' (gate and export)' if world > 1 else ''}: {_gb(bf16)} of BF16 weights -> "
             f"{gpus} x {ONE_GPU_GB:.0f} GB GPU(s) at "
             f"{CALIBRATION_GPU_SHARE:.0%} of each for weights (the rest: calibration activations)"]
    lines += _calibration_ranks(cal, layout)
    if quantize.check_export and params > ONE_GPU_GB * 1e9:
        lines.append(f"     !! the export check loads the ~{_gb(params)} FP8 export with trtbuild's runtime on one "
                     "GPU: set quantize.check_export: false for this model")
    if gpus > GPUS_PER_NODE:
        lines.append(f"     !! {_gb(bf16)} of BF16 weights exceed one node of {GPUS_PER_NODE} x {ONE_GPU_GB:.0f} GB "
                     f"GPUs: {_calibration_fit(layout)}; the gate and the export still load the whole model in "
                     "the stage's process over one node's GPUs (device_map=\"auto\" puts what does not fit in "
                     "host memory), or point model.path at an FP8 export and drop the quantize section "
                     "(docs/gpu-path.md)")
    return lines


def _calibration_ranks(cal: Any, layout: tuple[int, list[int]]) -> list[str]:
    """The calibration's launch and weight memory per rank (trtbuild/quantize/distributed.py)."""
    world = cal.world_size()
    held = rank_memory(*layout, world)
    budget = CALIBRATION_GPU_SHARE * ONE_GPU_GB * 1e9
    verdict = (f"within {CALIBRATION_GPU_SHARE:.0%} of an {ONE_GPU_GB:.0f} GB GPU" if held["total"] <= budget else
               f"!! over {CALIBRATION_GPU_SHARE:.0%} of an {ONE_GPU_GB:.0f} GB GPU")
    parts = (f"{_gb(held['shards'])} shards + {_gb(held['gathered'])} for two whole decoder layers all-gathered + "
             f"{_gb(held['replicated'])} embeddings/head" if world > 1 else "the whole model")
    return [f"     quantize launch: {cal.nodes} node(s) x {cal.processes} process(es); calibration memory per rank: "
            f"~{_gb(held['total'] if world > 1 else 2.0 * (layout[0] + sum(layout[1])))} of BF16 weights "
            f"({parts}), plus one batch's activations ({cal.batch_size} x {cal.seq_len} tokens)"
            + (f": {verdict}" if world > 1 else "")]


def _calibration_fit(layout: tuple[int, list[int]]) -> str:
    """The smallest node count (GPUS_PER_NODE processes each) whose calibration ranks fit, or why none does."""
    budget = CALIBRATION_GPU_SHARE * ONE_GPU_GB * 1e9
    for nodes in range(1, 65):
        held = rank_memory(*layout, nodes * GPUS_PER_NODE)
        if held["total"] <= budget:
            return (f"set quantize.calibration.processes: {GPUS_PER_NODE} and nodes: {nodes} (~{_gb(held['total'])} "
                    "of weights per rank; the stage launches the FSDP2 ranks itself)")
    floor = rank_memory(*layout, 64 * GPUS_PER_NODE)
    return (f"no node count of {ONE_GPU_GB:.0f} GB GPUs holds a calibration rank: the two whole decoder layers "
            f"FSDP2 all-gathers at once ({_gb(floor['gathered'])}) and the embeddings/head "
            f"({_gb(floor['replicated'])}) alone are {_gb(floor['gathered'] + floor['replicated'])}, over "
            f"{_gb(budget)}; calibrate on larger GPUs (quantize.calibration.processes / nodes)")


def calibration_gpus(params: int) -> int:
    """GPUs the quantize stage's BF16 model spreads over (weights within CALIBRATION_GPU_SHARE of each)."""
    return max(1, math.ceil(2.0 * params / (CALIBRATION_GPU_SHARE * ONE_GPU_GB * 1e9)))


def _checkpoint_quant(recipe: Recipe) -> str | None:
    """The checkpoint's quant_algo when the stand-in / config carries ModelOpt's quantization_config."""
    found = target_hf_config(recipe)
    if found and not found[1].startswith("stand-in "):  # the weights are here: what TensorRT-LLM reads
        algo, _, said = quant_of_dir(Path(found[1]).parent)
        if said:
            return algo
    quant = found[0].get("quantization_config") if found else None
    if isinstance(quant, dict):
        return quant.get("quant_algo")

    return checkpoint_quant(recipe)[0]  # e.g. a stand-in directory's hf_quant_config.json


def _target_fit(draft: DraftConfig, settings: DraftTraining, world: int, target_bytes: float) -> list[str]:
    """How the BF16 target is held by online training when it exceeds one GPU (draft/sharding.py)."""
    from trtbuild.draft.sharding import AUTO_SHARE_OF_GPU, resolve

    gpu = ONE_GPU_GB * 1e9
    if draft.hidden_states == "offline" or target_bytes <= AUTO_SHARE_OF_GPU * gpu:
        return []
    # what the stage decides on a GPU host (draft/build.py), with this plan's GPU size
    sharding = resolve(settings.target_sharding, "cuda", world, int(target_bytes), int(gpu))
    if sharding == "fsdp":
        per_rank = target_bytes / world
        verdict = "fits" if per_rank <= AUTO_SHARE_OF_GPU * gpu else "!! still exceeds half of"
        return [f"     target layers sharded with FSDP2 over {world} ranks: ~{per_rank / 1e9:.0f} GB of "
                f"{target_bytes / 1e9:.0f} GB per rank ({verdict} an {ONE_GPU_GB:.0f} GB GPU); each rank "
                "reads only its shards from disk"]
    if target_bytes <= gpu:
        return []
    return ["     !! the target does not fit one GPU for online training: set draft.train.processes (with "
            "target_sharding auto or fsdp, FSDP2 shards it over the ranks) or hidden_states: offline "
            "(docs/gpu-path.md)"]


def _draft_step(recipe: Recipe, params: int) -> list[str]:
    draft = recipe.draft
    if draft is None or draft.source == "none":
        return ["     draft: none (no speculative decoding)"]
    evaluation = (f"acceptance measured on {draft.eval.prompts} prompts with the project's runtime"
                  if draft.eval.prompts else "no acceptance run in the build (measure it with trtllm-bench)")
    if draft.source == "ngram":
        return [f"     draft: none to build: n-gram prompt lookup (TRT-LLM NGram, max_draft_len "
                f"{draft.max_draft_len}, max_matching_ngram_size {draft.max_matching_ngram_size}); {evaluation}"]
    if draft.source == "train":
        settings = draft.train
        world = settings.world_size()
        where = ("in one process" if world == 1 else
                 f"in {settings.nodes} node(s) x {settings.processes} processes (torchrun, DDP"
                 + (", srun under Slurm)" if settings.nodes > 1 else ")"))
        line = (f"     draft: EAGLE-3 training with ModelOpt (modelopt.torch.speculative) {where}, "
                f"{draft.total_steps()} steps of {draft.batch_size} x {draft.seq_len} tokens; {evaluation}")
        return [line, *_target_fit(draft, settings, world, 2.0 * params)]
    waived = f", waiving {', '.join(draft.compat_ignore)}" if draft.compat_ignore else ""
    name = draft.repo_id if draft.source == "hub" else draft.path
    return [f"     draft: loads {name} and checks it against the target (config, tensor shapes, d2t, "
            f"tokenizer{waived}); max_draft_len {draft.max_draft_len}; {evaluation}"]


def _engine_step(recipe: Recipe, params: int) -> list[str]:
    engine = recipe.engine
    if engine is None:
        return []
    world = engine.tensor_parallel * engine.pipeline_parallel
    draft = recipe.draft
    spec = ""
    if draft is not None and draft.source == "ngram":
        spec = f", speculative_config NGram max_draft_len {engine.draft_len or draft.max_draft_len}"
    elif draft is not None and draft.source != "none":
        kind = load_contract(engine.trtllm_version).eagle3_decoding_type
        spec = (f", speculative_config {kind} max_draft_len {engine.draft_len or draft.max_draft_len} "
                f"(one model: {engine.eagle3_one_model})")

    # FP8: one byte per parameter; NVFP4: 0.5625 (half a byte + an e4m3 scale per 16)
    fmt = "NVFP4" if checkpoint_quant(recipe)[0] == "NVFP4" else "FP8"
    per_gpu = params * (0.5625 if fmt == "NVFP4" else 1.0) / world
    module = ", trtllm_module/ (the GEMM plugins, on the server's PYTHONPATH)" if engine.gemm_plugin else ""
    return [f"     engine: TensorRT-LLM {engine.trtllm_version} {engine.backend} bundle: llm_api_options.yaml "
            f"(tp {engine.tensor_parallel}, pp {engine.pipeline_parallel}, ep {engine.expert_parallel}, "
            f"max_batch_size {engine.max_batch_size}{spec}), launch/serve.sh, mpirun.sh, slurm.sbatch{module}; "
            f"~{_gb(per_gpu)} of {fmt} weights per GPU; with tensorrt_llm importable and a GPU visible, "
            "a load check through LLM()"]


def _deploy_step(recipe: Recipe) -> list[str]:
    deploy = recipe.deploy
    if deploy is None:
        return []
    image = f" ({deploy.trtllm.image})" if "trtllm" in deploy.target else ""
    return [f"     deploy: Triton model repository ({', '.join(deploy.target)}){image}, "
            "schema-checked; launch/triton_trtllm.sh starts the container"]


def plan_notes(recipe: Recipe) -> list[str]:
    """Lines for `trtbuild plan`: empty unless the target's weights are absent and a stand-in is used."""
    if not uses_standin(recipe):
        return []
    model = recipe.model
    found = target_hf_config(recipe)
    if model is None or found is None:
        return []  # the preflight reports an unreadable stand-in
    hf_config, where = found
    text = text_config(hf_config)
    layout = parameter_layout(hf_config)
    params = layout[0] + sum(layout[1])
    absent = (f"'{model.repo_id}' ({model.revision}) is not in the local HF cache {hf_cache_dir()}"
              if model.source == "hub" else f"{recipe.resolve_path(str(model.path))} does not exist")
    arch = (hf_config.get("architectures") or ["?"])[0]
    experts = f", {text['num_local_experts']} experts" if text.get("num_local_experts") else ""
    engine = recipe.engine
    world = engine.tensor_parallel * engine.pipeline_parallel if engine is not None else 1
    gpus = (f"{engine.launcher.nodes} node(s) x {engine.launcher.gpus_per_node} GPUs" if engine is not None
            else "1 GPU")
    notes = [
        f"weights absent: {absent}; validate, plan and preflight used the {where}: {arch}, "
        f"{text['num_hidden_layers']} layers, hidden {text['hidden_size']}, "
        f"{text['num_attention_heads']} heads / {text.get('num_key_value_heads')} KV heads{experts}, "
        f"vocab {text['vocab_size']}, "
        f"~{params / 1e9:.1f} B parameters. `trtbuild build` refuses here.",
        f"on a GPU host (world size {world}: tp {engine.tensor_parallel if engine else 1} x pp "
        f"{engine.pipeline_parallel if engine else 1}; launcher {gpus}; "
        f"gpu_archs {', '.join(recipe.gpu_archs)}):",
        _fetch(recipe),
        f"  2. trtbuild build {recipe.recipe_file.name}: model links the cached snapshot;",
        *_quantize_step(recipe, params, layout),
        *_draft_step(recipe, params),
        *_engine_step(recipe, params),
        *_deploy_step(recipe),
        f"  3. serve: {recipe.output_path}/engine/bundle/launch/serve.sh (trtllm-serve), or "
        f"{recipe.output_path}/deploy/launch/triton_trtllm.sh (Triton); docs/gpu-path.md maps each step",
    ]
    return notes
