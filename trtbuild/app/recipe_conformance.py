"""The bundle a recipe would write, against its release's contract, before any build.

`trtbuild validate` / `plan` / `build` render the options and the launch command from the recipe
alone (the target's stand-in config for shapes) with the bundle's own code (engine/bundle.py), and
check them with engine/conformance.py. Kept apart from both so that the bundle can use the
conformance checks without the conformance checks importing the bundle back.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.app.recipe import Recipe
from trtbuild.core.bundle_info import BundleInfo
from trtbuild.core.contract import Contract, Violation, available_versions, load_contract
from trtbuild.core.contract import validate as cv
from trtbuild.core.llm_args import LlmApiOptions
from trtbuild.deploy.repo_trtllm import llmapi_model_yaml
from trtbuild.engine.bundle import build_options
from trtbuild.engine.config import has_draft
from trtbuild.engine.conformance import emitted_violations, serve_spec
from trtbuild.engine.facts import target_facts

if TYPE_CHECKING:
    from trtbuild.engine.config import EngineConfig


def contract_problems(config: EngineConfig, recipe: Recipe) -> list[str]:
    """Preflight lines: the options YAML and launch command this recipe renders, against engine.trtllm_version."""
    return [f"engine.trtllm_version {config.trtllm_version}: {v.line()}" for v in recipe_violations(config, recipe)]


def recipe_violations(config: EngineConfig, recipe: Recipe) -> list[Violation]:
    """What the bundle of this recipe would break, from the recipe alone (no files read but configs)."""
    contract = load_contract(config.trtllm_version)
    options = build_options(config, recipe, target_facts(recipe), None, with_draft=has_draft(recipe),
                            contract=contract)
    spec = serve_spec(config, recipe, contract, served="target")
    found = emitted_violations(options, spec, config, contract)
    deploy = recipe.deploy
    if deploy is not None and "trtllm" in deploy.target:
        found += _llmapi_violations(config, deploy, options, contract)
        found += image_violations(deploy.trtllm.image, contract)
    return found


def image_violations(image: str, contract: Contract) -> list[Violation]:
    """A Triton TRT-LLM image (tritonserver:<yy.mm>-trtllm-python-py3) known to ship another release
    than the bundle is written for; images no contract names are not judged."""
    repo, _, tag = image.rpartition(":")
    if not repo.endswith("nvidia/tritonserver") or not tag.endswith("-trtllm-python-py3"):
        return []
    month = tag.removesuffix("-trtllm-python-py3")
    for version in available_versions():
        release = load_contract(version).section("release")
        if month in [str(m) for m in release.get("triton_images", [])] and version != contract.version:
            other = load_contract(version)
            return [Violation("deploy.trtllm.image", f"{image} ships TensorRT-LLM {version}, but the bundle is "
                              f"written for {contract.version} (set engine.trtllm_version: {version}, or an "
                              f"image of {contract.version}: {release_images(contract)})",
                              other.fact(release.get("images_source") or release.get("source")))]
    return []


def release_images(contract: Contract) -> str:
    months = contract.section("release").get("triton_images", [])
    return ", ".join(f"tritonserver:{m}-trtllm-python-py3" for m in months) or "none recorded"


def _llmapi_violations(config: EngineConfig, deploy: Any, options: LlmApiOptions,
                       contract: Contract) -> list[Violation]:
    """The Triton LLM-API model.yaml and config.pbtxt parameters the deploy stage would write."""
    bundle = BundleInfo(root=Path("."), backend="pytorch", served="target", tokenizer="target", draft="draft",
                        options=options, tensor_parallel=config.tensor_parallel,
                        pipeline_parallel=config.pipeline_parallel, trtllm_version=contract.version)
    name = deploy.model_name
    model_yaml = llmapi_model_yaml(deploy, bundle, deploy.max_batch_size or config.max_batch_size)
    params = {"gpu_device_ids": ""} if deploy.instance_count > 1 else {}
    return (cv.check_model_yaml(model_yaml, contract, f"repo_trtllm/{name}/1/model.yaml")
            + cv.check_triton_parameters(params, contract, f"repo_trtllm/{name}/config.pbtxt"))
