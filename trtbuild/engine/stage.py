"""engine stage: the TensorRT-LLM deployable bundle.

Reads the target (the quantize stage's export when the recipe quantizes, else the model stage's
HF directory) and the EAGLE-3 draft when there is one, and writes `bundle/`:

    target/                the checkpoint TensorRT-LLM loads (files hard-linked, not copied)
    draft/                 the EAGLE-3 draft
    llm_api_options.yaml   LLM() arguments (trtllm-serve --extra_llm_api_options), checked against the
                           contract of engine.trtllm_version (trtbuild/core/contract/)
    launch/                serve.sh (one node), mpirun.sh and slurm.sbatch (several nodes)
    trtllm_module/         engine.gemm_plugin: the module TensorRT-LLM's server imports
                           (trtbuild_gemm + sitecustomize.py; launchers put it on PYTHONPATH)
    plugins/               the named kernels' AOT cubins per arch + SASS report (a build check)
    bundle.json            what is where, for the deploy stage and for people

When `tensorrt_llm` is importable (and a GPU visible) the stage also runs a load check; when it
is not, it says so in one line and still writes the bundle.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trtbuild.core.contract import contract_files
from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.engine.bundle import build_bundle, plugin_key_material
from trtbuild.engine.checks import engine_problems, toolchain_problems
from trtbuild.engine.config import (
    EngineConfig,
    GemmPluginSettings,
    KvCacheSettings,
    LauncherSettings,
    SlurmSettings,
)

__all__ = ["EngineConfig", "EngineStage", "GemmPluginSettings", "KvCacheSettings", "LauncherSettings",
           "SlurmSettings"]


class EngineStage(Stage):
    """TensorRT-LLM bundle: LLM-API options, launchers, the GEMM-plugin module."""

    name = "engine"
    config_cls = EngineConfig
    depends_on = ("model",)
    optional_inputs = ("quantize", "draft")
    libraries = ("tensorrt-llm", "safetensors", "torch", "triton")

    def key_material(self, config: StageConfig, recipe: RecipeInfo) -> dict[str, Any]:
        assert isinstance(config, EngineConfig)
        # The archs decide the AOT cubins; the plugin sources decide them and the shipped module; the
        # contracts (data files, not code) decide the names written and the module's recorded conventions.

        kernels = sorted(set(config.gemm_plugin.kernels.values())) if config.gemm_plugin else []
        digest = hashlib.sha256()
        for path in contract_files():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        return {"gpu_archs": list(recipe.gpu_archs), "plugins": plugin_key_material(kernels),
                "contracts": digest.hexdigest()[:16]}

    def preflight(self, config: StageConfig, recipe: RecipeInfo) -> list[str]:
        assert isinstance(config, EngineConfig)

        return engine_problems(config, recipe) + toolchain_problems(config)

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, EngineConfig)

        return build_bundle(config, ctx)
