"""The engine bundle against the selected release's contract (trtbuild/core/contract/).

`serve_spec` is the one place the launchers' trtllm-serve command is assembled, so the bundle and
the checks before a build see the same argv. `bundle_violations` checks what a bundle holds;
`recipe_violations` (app/recipe_conformance.py) renders the options and launch command from the
recipe alone (the target's stand-in config for shapes), for `trtbuild validate` / `plan` / `build`
before any work. Both cover
how the GEMM-plugin module is loaded: PYTHONPATH on every release, the custom-module flag where the
release's trtllm-serve has one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.contract import Contract, Violation
from trtbuild.core.contract import validate as cv
from trtbuild.core.llm_args import LlmApiOptions
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.engine import launchers, plugin_module
from trtbuild.model.config import ModelConfig

if TYPE_CHECKING:
    from trtbuild.engine.config import EngineConfig

OPTIONS_FILE = "llm_api_options.yaml"
LAUNCHERS = ("launch/serve.sh", "launch/mpirun.sh", "launch/slurm.sbatch")


def module_launch(config: EngineConfig, contract: Contract) -> dict[str, Any]:
    """How the launchers load the GEMM-plugin module (nothing without engine.gemm_plugin)."""
    if config.gemm_plugin is None:
        return {"python_path": None, "serve_flag": None, "custom_module_dirs": []}
    return plugin_module.launch(contract)


def module_path(config: EngineConfig) -> str | None:
    return f"{plugin_module.MODULE_DIR}/{plugin_module.PACKAGE}" if config.gemm_plugin is not None else None


def serve_spec(config: EngineConfig, recipe: RecipeInfo, contract: Contract, *, served: str) -> launchers.ServeSpec:
    launch = module_launch(config, contract)
    model = recipe.section(ModelConfig)
    root = contract.section("launch_as_root")
    return launchers.ServeSpec(
        model=served, backend=config.backend, tensor_parallel=config.tensor_parallel,
        pipeline_parallel=config.pipeline_parallel, expert_parallel=config.expert_parallel,
        options_file=OPTIONS_FILE, options_flag=contract.serve_options_flag, tokenizer=None,
        trust_remote_code=model is not None and model.trust_remote_code,
        custom_module_dirs=tuple(launch["custom_module_dirs"]), python_path=launch["python_path"],
        env=dict(config.env), root_env=dict(root.get("env") or {}),
        mpirun_flags=(root["mpirun_flag"],) if root.get("mpirun_flag") else (),
        host=config.launcher.host, port=config.launcher.port)


def emitted_violations(options: LlmApiOptions, spec: launchers.ServeSpec, config: EngineConfig,
                       contract: Contract) -> list[Violation]:
    argv = launchers.serve_argv(spec)
    out = cv.check_llm_args(options.to_dict(), contract, OPTIONS_FILE)
    out += cv.check_serve_argv(argv, contract, "launch/serve.sh")
    out += cv.check_module_launch(argv, spec.python_path, module_path(config), contract, "launch/serve.sh")
    return out


def bundle_violations(bundle: Path, options: LlmApiOptions, spec: launchers.ServeSpec, config: EngineConfig,
                      contract: Contract, *, draft: str | None, served: str) -> list[Violation]:
    out = emitted_violations(options, spec, config, contract)
    if draft is not None:
        out += cv.check_draft_dir(bundle / draft, contract, draft)
    cfg_file = bundle / served / "config.json"
    if cfg_file.is_file():
        served_config = json.loads(cfg_file.read_text())
        out += cv.check_hf_config(served_config, contract, f"{served}/config.json")
        out += cv.check_llama4_target(served_config, contract, f"{served}/config.json")
    out += cv.check_nvfp4_checkpoint(bundle / served, contract, served)
    if spec.python_path:
        out += module_violations(bundle, spec.python_path, contract)
    return out


def module_violations(bundle: Path, python_path: str, contract: Contract) -> list[Violation]:
    """The written launchers export the module's directory; the shipped module can patch this release."""
    out: list[Violation] = []
    for rel in LAUNCHERS:
        script = bundle / rel
        if script.is_file():
            out += cv.check_module_environment(script.read_text(), python_path, contract, rel)
    config_file = bundle / plugin_module.MODULE_DIR / plugin_module.PACKAGE / "config.json"
    try:
        releases = json.loads(config_file.read_text()).get("releases") or {}
    except (OSError, json.JSONDecodeError):
        releases = {}
    if contract.version not in releases:
        out.append(Violation(str(config_file.relative_to(bundle)), f"carries no FP8-linear convention for "
                             f"TensorRT-LLM {contract.version}", contract.fact(contract.fp8_linear.get("source"))))
    sources = {str(p.relative_to(bundle)): p.read_text() for p in (bundle / plugin_module.MODULE_DIR).rglob("*.py")}
    return out + cv.check_plugin_sources(sources, contract)


