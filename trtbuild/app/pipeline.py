"""Plan and build: stage keys, cache hits, running stages into the cache, linking outputs.

A stage's key is the hash of its config, its inputs' keys, its code version (hash of every project
module its module imports, directly or not: trtbuild/core/code_version.py) and the versions of the
libraries it calls, plus any `key_material` the stage adds (e.g. a local model's file fingerprints).
Change any of these and the stage and every stage after it that reads it get new keys; nothing
before it changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from trtbuild.app.recipe import Recipe
from trtbuild.app.stages import STAGE_ORDER, all_stages
from trtbuild.core.cache import ArtifactCache, Entry, dir_size
from trtbuild.core.code_version import code_version as module_code_version
from trtbuild.core.errors import TrtbuildError, UserError, os_error, wrapped_os_error
from trtbuild.core.progress import Progress
from trtbuild.core.safepaths import OUTPUT_MARKER, ensure_inside, mark_output_dir
from trtbuild.core.stage import Artifact, Stage, StageConfig, StageContext

DAMAGED = "cache entry damaged, rebuilt"


@dataclass
class PlannedStage:
    name: str
    stage: Stage | None
    config: StageConfig | None
    key: str | None = None
    components: dict[str, Any] = field(default_factory=dict)
    action: str = "skip"  # "run" | "cached" | "skip" | "failed"
    reason: str = ""
    artifact: Path | None = None
    seconds: float | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # failed: the one-line error

    @property
    def status(self) -> str:
        return {"run": "ran", "cached": "cached", "skip": "skipped", "failed": "failed"}[self.action]

    def to_json(self, executed: bool) -> dict[str, Any]:
        status = self.status if executed else {"run": "will-run", "cached": "cached", "skip": "skipped"}[self.action]
        data = {"name": self.name, "key": self.key, "status": status, "reason": self.reason,
                "seconds": self.seconds, "artifact": str(self.artifact) if self.artifact else None,
                "metrics": self.metrics}
        if self.error is not None:
            data["error"] = self.error
        return data


def code_version(stage: Stage) -> str:
    """Hash of every project module the stage's module imports, directly or not (its import closure)."""
    return module_code_version(type(stage).__module__)


def library_versions(names: tuple[str, ...]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _hash(components: dict[str, Any]) -> str:
    canonical = json.dumps(components, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:24]


def plan(recipe: Recipe, cache: ArtifactCache, *, until: str | None = None,
         force: tuple[str, ...] = (), record_checks: bool = False) -> list[PlannedStage]:
    """Decide for every stage: run, cached or skipped, and why. Touches nothing unless `record_checks`
    (build: remember which files of a hit were hash-checked, so the next check skips them)."""
    for name in (*force, *([until] if until else [])):
        if name not in STAGE_ORDER:
            raise UserError(f"unknown stage '{name}'", field="--until/--force",
                            fix=f"use one of {', '.join(STAGE_ORDER)}")
    stages = {s.name: s for s in all_stages()}
    cutoff = STAGE_ORDER.index(until) if until else len(STAGE_ORDER) - 1
    planned: dict[str, PlannedStage] = {}
    forced_downstream = False
    for index, name in enumerate(STAGE_ORDER):
        stage = stages.get(name)
        config = recipe.stage_config(name) if stage else None
        item = PlannedStage(name=name, stage=stage, config=config)
        planned[name] = item
        if stage is None or config is None:
            item.reason = "not in the recipe"
            continue
        if index > cutoff:
            item.reason = f"after --until {until}"
            continue
        inputs = {}
        for dep in stage.depends_on:
            upstream = planned.get(dep)
            if upstream is None or upstream.key is None:
                raise UserError(f"stage '{name}' needs the '{dep}' stage", field=dep,
                                fix=f"add a `{dep}:` section to the recipe")
            inputs[dep] = upstream.key
        for dep in stage.optional_inputs:
            upstream = planned.get(dep)
            if upstream is not None and upstream.key is not None:
                inputs[dep] = upstream.key
        item.components = {
            "stage": name,
            "config": config.model_dump(mode="json"),
            "inputs": inputs,
            "code": code_version(stage),
            "libraries": library_versions(stage.libraries),
            "key_material": stage.key_material(config, recipe),
        }
        item.key = _hash(item.components)
        upstream_runs = [d for d in inputs if planned[d].action == "run"]
        entry = cache.lookup(name, item.key)
        damage = cache.damage(entry, record=record_checks) if entry is not None else None
        if name in force or (forced_downstream and upstream_runs):
            item.action, item.reason = "run", ("--force" if name in force else "an input is rebuilt")
            forced_downstream = True
        elif damage is not None:
            item.action, item.reason = "run", f"{DAMAGED}: {damage}"
        elif entry is not None:
            item.action, item.reason, item.artifact = "cached", "key found in the cache", entry.path
            manifest = entry.manifest()
            item.metrics = manifest.get("metrics", {})
            item.seconds = manifest.get("seconds")
        else:
            item.action = "run"
            item.reason = _why_not_cached(recipe, item)
    return [planned[n] for n in STAGE_ORDER]


def _why_not_cached(recipe: Recipe, item: PlannedStage) -> str:
    """Explain a miss by diffing against what this recipe's output dir built last time."""
    previous_link = recipe.output_path / item.name
    manifest_file = previous_link / "manifest.json"
    if not manifest_file.is_file():
        return "not built before for this recipe"
    try:
        previous = json.loads(manifest_file.read_text()).get("key_components", {})
    except (OSError, json.JSONDecodeError):
        return "previous build unreadable"
    changes = _diff(previous, item.components)
    return "changed: " + "; ".join(changes[:3]) + (" ..." if len(changes) > 3 else "") if changes \
        else "cache entry was removed"


def _diff(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new)):
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                out.append(f"{sub} added")
            elif key not in new:
                out.append(f"{sub} removed")
            else:
                out.extend(_diff(old[key], new[key], sub))
        return out
    if old != new:
        label = {"code": "stage code", "inputs": "inputs"}.get(path, path)
        if isinstance(old, str | int | float | bool | type(None)) and len(str(old)) < 40:
            return [f"{label} {old!r} -> {new!r}"]
        return [f"{label} changed"]
    return []


def build(recipe: Recipe, cache: ArtifactCache, progress: Progress, *, until: str | None = None,
          force: tuple[str, ...] = ()) -> list[PlannedStage]:
    steps = plan(recipe, cache, until=until, force=force, record_checks=True)
    artifacts: dict[str, Artifact] = {}
    for item in steps:
        if item.action == "skip":
            continue
        assert item.stage is not None and item.key is not None and item.config is not None
        if item.action == "cached":
            assert item.artifact is not None
            progress.log(f"[green]cached[/] {item.name} {item.key[:12]}")
            entry = cache.lookup(item.name, item.key)
            if entry is not None:
                cache.touch(entry)
        else:
            progress.log(f"[bold]run[/] {item.name} ({item.reason})")
            try:
                item.artifact = _run_stage(item, recipe, cache, artifacts, progress).path
            except Exception as exc:
                _record_failure(steps, item, exc)
                # Best effort, and only into an output dir an earlier build made: a first build that
                # fails creates nothing (the --json report on stdout carries the same content).
                if (recipe.output_path / OUTPUT_MARKER).is_file():
                    with contextlib.suppress(OSError, TrtbuildError):
                        _write_build_report(recipe, steps)
                exc.build_steps = steps  # type: ignore[attr-defined]  # the CLI's --json report
                raise
        artifacts[item.name] = Artifact(item.name, item.key, item.artifact)
        _link_output(recipe.output_path, item.name, item.artifact, cache.root)
    _write_build_report(recipe, steps)
    return steps


def _record_failure(steps: list[PlannedStage], failed: PlannedStage, exc: Exception) -> None:
    """The failed stage keeps its error and the metrics it measured before failing (a gate's
    `exc.metrics`); the stages after it did not run."""
    failed.action = "failed"
    failed.error = exc.one_line() if isinstance(exc, TrtbuildError) else f"{type(exc).__name__}: {exc}"
    failed.metrics = dict(getattr(exc, "metrics", None) or {})
    after = False
    for item in steps:
        if after and item.action == "run":
            item.action, item.reason = "skip", f"not run: the {failed.name} stage failed"
        after = after or item is failed


def _run_stage(item: PlannedStage, recipe: Recipe, cache: ArtifactCache, artifacts: dict[str, Artifact],
               progress: Progress) -> Entry:
    assert item.stage is not None and item.key is not None and item.config is not None
    with cache.lock(item.name, item.key):
        existing = cache.lookup(item.name, item.key)
        rebuild = item.reason in ("--force", "an input is rebuilt") or item.reason.startswith(DAMAGED)
        if existing is not None and not rebuild:
            item.action, item.metrics = "cached", existing.manifest().get("metrics", {})
            return existing  # another process built it while we waited
        workdir = cache.new_workdir(item.name, item.key)
        inputs = {d: artifacts[d] for d in item.components["inputs"]}
        ctx = StageContext(recipe=recipe, inputs=inputs, out_dir=workdir, progress=progress)
        started = time.perf_counter()
        try:
            # Libraries (ModelOpt, transformers) print to stdout; keep stdout for --json alone.
            with contextlib.redirect_stdout(sys.stderr):
                result = item.stage.run(item.config, ctx)
        except OSError as exc:  # disk full, permissions: one line, and nothing half-written kept
            error = os_error(exc, written=dir_size(workdir), where=str(workdir))  # free space before the discard
            cache.discard(workdir)
            raise error from exc
        except BaseException as exc:
            item.seconds = round(time.perf_counter() - started, 3)
            wrapped = wrapped_os_error(exc)  # a library's own exception for a full disk (safetensors)
            full = os_error(wrapped, written=dir_size(workdir), where=str(workdir)) if wrapped else None
            cache.discard(workdir)  # a failed stage leaves nothing behind
            if full is not None:
                raise full from exc
            raise
        item.seconds = round(time.perf_counter() - started, 3)
        item.metrics = result.metrics
        manifest = {
            "stage": item.name,
            "key": item.key,
            "recipe": {"name": recipe.name, "file": str(recipe.recipe_file)},
            "key_components": item.components,
            "inputs": {d: {"key": a.key, "path": str(a.path)} for d, a in inputs.items()},
            "seconds": item.seconds,
            "metrics": result.metrics,
            "info": result.info,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": {"python": sys.version.split()[0], "platform": platform.platform()},
        }
        try:
            entry = cache.commit(workdir, item.name, item.key, manifest)
        except OSError as exc:
            error = os_error(exc, written=dir_size(workdir), where=str(workdir))
            cache.discard(workdir)
            raise error from exc
        except BaseException:
            cache.discard(workdir)
            raise
        cache.touch(entry)
        return entry


def _link_output(output_dir: Path, name: str, target: Path, cache_root: Path) -> None:
    """output_dir/<stage> -> the cache entry; replaced atomically so readers never see it missing."""
    ensure_inside(target, [cache_root], "link to")
    mark_output_dir(output_dir)
    link = output_dir / name
    if link.exists() and not link.is_symlink():
        raise UserError(f"{link} exists and is not a link made by trtbuild", field="output_dir",
                        fix="move it away or choose another output_dir")
    tmp = output_dir / f".{name}.link-{os.getpid()}"
    if tmp.is_symlink():
        tmp.unlink()
    try:
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as exc:
        if tmp.is_symlink():
            tmp.unlink()
        raise os_error(exc) from exc


def report(recipe: Recipe, steps: list[PlannedStage], executed: bool) -> dict[str, Any]:
    data: dict[str, Any] = {"recipe": str(recipe.recipe_file), "name": recipe.name,
                            "output_dir": str(recipe.output_path), "stages": [s.to_json(executed) for s in steps]}
    failed = [s for s in steps if s.action == "failed"]
    if executed:
        data["status"] = "failed" if failed else "ok"
    if failed:
        data["error"] = failed[0].error
    return data


def _write_build_report(recipe: Recipe, steps: list[PlannedStage]) -> None:
    out = recipe.output_path / "build.json"
    tmp = out.with_name(f".build.json.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(report(recipe, steps, executed=True), indent=2, default=str))
        os.replace(tmp, out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise os_error(exc) from exc


__all__ = ["PlannedStage", "TrtbuildError", "build", "code_version", "plan", "report"]
