"""The deploy stage's work: read the bundle, write the repositories and launchers, check them all."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.bundle_info import BundleInfo, read_bundle
from trtbuild.core.errors import UserError
from trtbuild.core.layout import BUNDLE
from trtbuild.core.pbtxt import check_repository
from trtbuild.core.stage_api import StageResult
from trtbuild.deploy import launch
from trtbuild.deploy.repo_local import write_local_repository
from trtbuild.deploy.repo_trtllm import write_trtllm_repository

if TYPE_CHECKING:
    from trtbuild.core.stage_api import StageContext, StageResult
    from trtbuild.deploy.config import DeployConfig

DEPLOY_FORMAT = "trtbuild-deploy/1"


def resolve_batch_size(config: DeployConfig, bundle: BundleInfo) -> int:
    engine_max = bundle.max_batch_size
    if config.max_batch_size is None:
        return engine_max or 1
    if engine_max is not None and config.max_batch_size > engine_max:
        raise UserError(f"{config.max_batch_size} exceeds the engine's max_batch_size "
                        f"{engine_max}", field="deploy.max_batch_size",
                        fix="lower it or raise engine.max_batch_size")
    return config.max_batch_size


def link_bundle(out_dir: Path, bundle_root: Path) -> Path:
    """`<out>/bundle` -> the engine artifact's bundle, relative (the cache can move as a whole)."""
    link = out_dir / BUNDLE
    link.symlink_to(os.path.relpath(bundle_root.resolve(), out_dir.resolve()), target_is_directory=True)
    return link


def build_deployment(config: DeployConfig, ctx: StageContext) -> StageResult:
    bundle_root = ctx.input("engine").path / BUNDLE
    bundle = read_bundle(bundle_root)
    max_batch_size = resolve_batch_size(config, bundle)
    out = ctx.out_dir
    bundle_link = link_bundle(out, bundle_root)
    tokenizer_dir = ctx.recipe.resolve_path(config.tokenizer.path) if config.tokenizer.path else None
    if tokenizer_dir is not None and not (tokenizer_dir / "tokenizer_config.json").is_file() \
            and not (tokenizer_dir / "tokenizer.json").is_file():
        raise UserError(f"no tokenizer in {tokenizer_dir}", field="deploy.tokenizer.path",
                        fix="point at a directory with tokenizer.json / tokenizer_config.json")

    description: dict[str, Any] = {
        "format": DEPLOY_FORMAT, "model_name": config.model_name, "targets": list(config.target),
        "bundle": BUNDLE, "backend": bundle.backend, "max_batch_size": max_batch_size,
        "max_draft_len": bundle.max_draft_len, "decoupled": config.decoupled,
        "ports": {"http": config.http_port, "grpc": config.grpc_port, "metrics": config.metrics_port,
                  "openai": config.openai_port},
        "exit_timeout_s": config.exit_timeout_s,
    }
    metrics: dict[str, Any] = {"max_batch_size": max_batch_size, "max_draft_len": bundle.max_draft_len}
    trtllm_info = None
    if "trtllm" in config.target:
        repo = out / "repo_trtllm"
        trtllm_info = write_trtllm_repository(repo, config, bundle, max_batch_size)
        from_image = frozenset(trtllm_info["python_models_from_image"])
        models = check_repository(repo, model_py_supplied_at_launch=from_image)
        trtllm_info.update({"repository": "repo_trtllm", "image": config.trtllm.image})
        description["trtllm"] = trtllm_info
        metrics["trtllm_models"] = len(models)
    if "local" in config.target:
        repo = out / "repo_local"
        repo.mkdir()
        local_info = write_local_repository(repo, config, bundle, bundle_link, max_batch_size, tokenizer_dir)
        models = check_repository(repo)
        local_info.update({"repository": "repo_local"})
        description["local"] = local_info
        metrics["local_speculative"] = local_info["speculative"]
    description["launch"] = launch.write_launchers(out, config, bundle, trtllm_info, "local" in config.target)
    if "dynamo" in config.target:
        from trtbuild.deploy.dynamo import write_dynamo_deployment

        description["dynamo"] = write_dynamo_deployment(out, config, bundle, max_batch_size)
        description["launch"]["dynamo"] = description["dynamo"]["launch"]
    (out / "deploy.json").write_text(json.dumps(description, indent=2) + "\n")
    metrics["targets"] = ",".join(config.target)
    written = ["dynamo/" if t == "dynamo" else f"repo_{t}" for t in config.target]
    ctx.progress.log(f"deploy: wrote {', '.join(written)} "
                     f"(model '{config.model_name}', batch {max_batch_size})")
    return StageResult(metrics=metrics, info={"deploy": description})


