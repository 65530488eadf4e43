"""The engine bundle against the selected release's contract (trtbuild/contract/).

`serve_spec` is the one place the launchers' trtllm-serve command is assembled, so the bundle and
the checks before a build see the same argv. `bundle_violations` checks what a bundle holds;
`recipe_violations` renders the options and launch command from the recipe alone (the target's
stand-in config for shapes), for `trtbuild validate` / `plan` / `build` before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.contract import Contract, Violation, load_contract
from trtbuild.contract import validate as cv
from trtbuild.trtllm import launchers
from trtbuild.trtllm.llm_args import LlmApiOptions

if TYPE_CHECKING:
    from trtbuild.stages.engine import EngineConfig

OPTIONS_FILE = "llm_api_options.yaml"


def serve_spec(config: EngineConfig, recipe: Any, contract: Contract, *, served: str,
               tokenizer: str | None, module_dir: str | None) -> launchers.ServeSpec:
    return launchers.ServeSpec(
        model=served, backend=config.backend, tensor_parallel=config.tensor_parallel,
        pipeline_parallel=config.pipeline_parallel, expert_parallel=config.expert_parallel,
        options_file=OPTIONS_FILE, options_flag=contract.serve_options_flag, tokenizer=tokenizer,
        trust_remote_code=bool(getattr(getattr(recipe, "model", None), "trust_remote_code", False)),
        custom_module_dirs=(module_dir,) if module_dir and config.backend == "tensorrt" else (),
        env=dict(config.env), host=config.launcher.host, port=config.launcher.port)


def emitted_violations(options: LlmApiOptions, spec: launchers.ServeSpec, config: EngineConfig,
                       contract: Contract) -> list[Violation]:
    out = cv.check_llm_args(options.to_dict(), contract, OPTIONS_FILE)
    out += cv.check_serve_argv(launchers.serve_argv(spec), contract, "launch/serve.sh")
    if config.backend == "tensorrt":
        out += cv.check_engine_builder(contract)
    return out


def bundle_violations(bundle: Path, options: LlmApiOptions, spec: launchers.ServeSpec, config: EngineConfig,
                      contract: Contract, *, draft: str | None, served: str,
                      plugin_texts: dict[str, str] | None = None) -> list[Violation]:
    out = emitted_violations(options, spec, config, contract)
    if draft is not None:
        out += cv.check_draft_dir(bundle / draft, contract, draft)
    cfg_file = bundle / served / "config.json"
    if config.backend == "pytorch" and cfg_file.is_file():
        out += cv.check_hf_config(json.loads(cfg_file.read_text()), contract, f"{served}/config.json")
    out += cv.check_plugin_sources(plugin_texts or {}, contract)
    return out


def recipe_violations(config: EngineConfig, recipe: Any) -> list[Violation]:
    """What the bundle of this recipe would break, from the recipe alone (no files read but configs)."""
    from trtbuild.trtllm.bundle import build_options
    from trtbuild.trtllm.checks import has_draft
    from trtbuild.trtllm.facts import target_facts

    contract = load_contract(config.trtllm_version)
    options = build_options(config, recipe, target_facts(recipe), None, with_draft=has_draft(recipe),
                            contract=contract)
    served = "target" if config.backend == "pytorch" else "engine"
    spec = serve_spec(config, recipe, contract, served=served,
                      tokenizer=None if config.backend == "pytorch" else "tokenizer",
                      module_dir="plugins/trtllm_plugins" if config.plugins else None)
    found = emitted_violations(options, spec, config, contract)
    deploy = getattr(recipe, "deploy", None)
    if deploy is not None and "trtllm" in deploy.target and config.backend == "pytorch":
        found += _llmapi_violations(config, deploy, options, contract)
    return found


def _llmapi_violations(config: EngineConfig, deploy: Any, options: LlmApiOptions,
                       contract: Contract) -> list[Violation]:
    """The Triton LLM-API model.yaml and config.pbtxt parameters the deploy stage would write."""
    from trtbuild.triton.bundle_info import BundleInfo
    from trtbuild.triton.repo_trtllm import llmapi_model_yaml

    bundle = BundleInfo(root=Path("."), backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=options, tensor_parallel=config.tensor_parallel,
                        pipeline_parallel=config.pipeline_parallel, trtllm_version=contract.version)
    name = deploy.model_name
    model_yaml = llmapi_model_yaml(deploy, bundle, deploy.max_batch_size or config.max_batch_size)
    params = {"gpu_device_ids": ""} if deploy.instance_count > 1 else {}
    return (cv.check_model_yaml(model_yaml, contract, f"repo_trtllm/{name}/1/model.yaml")
            + cv.check_triton_parameters(params, contract, f"repo_trtllm/{name}/config.pbtxt"))
