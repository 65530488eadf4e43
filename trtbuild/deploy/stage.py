"""deploy stage: Triton Inference Server model repositories for the engine bundle.

Targets:
- `trtllm`: a repository for TensorRT-LLM's Triton backend: the LLM-API python model
  (`<model_name>/1/model.yaml` = the bundle's LLM() arguments + `triton_config`), checked against
  the contract of the bundle's release. Paths are written as the server sees them, with the bundle
  mounted at `deploy.trtllm.bundle_mount`; the launchers (`launch/`) start the Triton TRT-LLM
  container, with the bundle's GEMM-plugin module on PYTHONPATH when it has one.
- `local`: a python-backend model serving the project's own runtime (speculative decoding on when
  the bundle has a draft), so a deployment can be rehearsed, tested and measured on CPU with the
  tritonserver bundled in nvidia-pytriton (`trtbuild serve`).
- `dynamo`: NVIDIA Dynamo (trtbuild.deploy.dynamo): engine args for `dynamo.trtllm`, aggregated and
  disaggregated DynamoGraphDeployments for Kubernetes and a one-node launcher, checked against the
  Dynamo contract (trtbuild/core/contract/dynamo-*.yaml) and the bundle's TensorRT-LLM contract.

Artifact: `repo_trtllm/`, `repo_local/`, `launch/`, `bundle` (a relative link to the engine
artifact's bundle) and `deploy.json` (what is where). Every config.pbtxt is parsed back into
Triton's ModelConfig; no `${...}` placeholder can be left.
"""

from __future__ import annotations

from trtbuild.core.recipe_info import RecipeInfo
from trtbuild.core.stage import Stage, StageConfig, StageContext, StageResult
from trtbuild.deploy.config import DeployConfig, LocalTargetOptions, Target, TokenizerOptions, TrtllmTargetOptions
from trtbuild.deploy.deploy import build_deployment
from trtbuild.engine.config import EngineConfig

__all__ = ["DeployConfig", "DeployStage", "LocalTargetOptions", "Target", "TokenizerOptions", "TrtllmTargetOptions"]


class DeployStage(Stage):
    """Triton model repositories (TRT-LLM backend and/or the local runtime) and their launchers."""

    name = "deploy"
    config_cls = DeployConfig
    depends_on = ("engine",)
    libraries = ("tritonclient", "protobuf")

    def preflight(self, config: StageConfig, recipe: RecipeInfo) -> list[str]:
        assert isinstance(config, DeployConfig)
        problems = []
        engine = recipe.section(EngineConfig)
        if engine is not None and config.max_batch_size and config.max_batch_size > engine.max_batch_size:
            problems.append(f"deploy.max_batch_size: {config.max_batch_size} exceeds engine.max_batch_size "
                            f"{engine.max_batch_size} (fix: lower it or raise the engine's)")
        ports = [config.http_port, config.grpc_port, config.metrics_port, config.openai_port]
        if len(set(ports)) != 4:
            problems.append(f"deploy: http/grpc/metrics/openai ports must differ, got {ports}")
        return problems

    def run(self, config: StageConfig, ctx: StageContext) -> StageResult:
        assert isinstance(config, DeployConfig)

        return build_deployment(config, ctx)
