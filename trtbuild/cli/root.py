"""The `trtbuild` command line. Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import click

from trtbuild.core.errors import TrtbuildError, UserError

_set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                           help="Override a recipe field, e.g. --set quantize.gate.max_perplexity_ratio=1.05")


def _load(recipe_path: str, overrides: tuple[str, ...]) -> Any:
    from trtbuild.app.recipe import load_recipe

    return load_recipe(recipe_path, list(overrides))


def _cache() -> Any:
    from trtbuild.core.cache import ArtifactCache

    return ArtifactCache()


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _stage_table(title: str, rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in ("stage", "status", "key", "seconds", "why / metrics"):
        table.add_column(column)
    for row in rows:
        metrics = ", ".join(f"{k}={_fmt(v)}" for k, v in list(row["metrics"].items())[:6])
        detail = row["reason"] if row["status"] != "ran" and row["status"] != "cached" or not metrics else metrics
        if row["status"] == "cached" and metrics:
            detail = metrics
        table.add_row(row["name"], row["status"], (row["key"] or "")[:12],
                      _fmt(row["seconds"]) if row["seconds"] is not None else "", detail)
    Console().print(table)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trtbuild")
def cli() -> None:
    """Build an FP8 + EAGLE-3 TensorRT-LLM deployment from one YAML recipe."""


@cli.command()
@click.argument("recipe")
@_set_option
def validate(recipe: str, overrides: tuple[str, ...]) -> None:
    """Check a recipe (schema, files, cross-stage consistency) without doing any work."""
    from trtbuild.app.preflight import preflight

    loaded = _load(recipe, overrides)
    preflight(loaded)
    click.echo(f"{recipe}: ok ({loaded.name})")


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--until", default=None, help="Plan up to this stage.")
@click.option("--force", multiple=True, help="Plan a rebuild of this stage (and what reads it).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...], as_json: bool) -> None:
    """Show what a build would run, what is cached, and why. Touches nothing."""
    from trtbuild.app import pipeline
    from trtbuild.app.preflight import preflight

    loaded = _load(recipe, overrides)
    preflight(loaded)
    steps = pipeline.plan(loaded, _cache(), until=until, force=force)
    data = pipeline.report(loaded, steps, executed=False)
    from trtbuild.app.gpu_plan import plan_notes
    from trtbuild.app.target_structure import structure_notes
    from trtbuild.engine import plugin_module
    from trtbuild.model.source import target_hf_config

    found = target_hf_config(loaded)
    from trtbuild.deploy import dynamo as dynamo_deploy
    from trtbuild.draft import plan_notes as draft_notes

    data["notes"] = (plan_notes(loaded) + plugin_module.plan_notes(loaded, found[0] if found else None)
                     + structure_notes(loaded) + draft_notes.plan_notes(loaded, steps) + dynamo_deploy.plan_notes(loaded))
    if as_json:
        _print_json(data)
    else:
        _stage_table(f"plan: {loaded.name} -> {data['output_dir']}", data["stages"])
        for line in data["notes"]:
            click.echo(line)


def _build(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...],
           as_json: bool) -> None:
    from trtbuild.app import pipeline
    from trtbuild.app.preflight import preflight
    from trtbuild.core.progress import Progress

    started = time.perf_counter()
    loaded = _load(recipe, overrides)
    preflight(loaded)
    progress = Progress.for_terminal(enabled=not as_json)
    try:
        steps = pipeline.build(loaded, _cache(), progress, until=until, force=force)
    except Exception as exc:
        failed_steps = getattr(exc, "build_steps", None)
        if as_json and failed_steps is not None:  # CI reads why from the report; the error goes to stderr too
            data = pipeline.report(loaded, failed_steps, executed=True)
            data["wall_seconds"] = round(time.perf_counter() - started, 3)
            _print_json(data)
        raise
    data = pipeline.report(loaded, steps, executed=True)
    data["wall_seconds"] = round(time.perf_counter() - started, 3)
    if as_json:
        _print_json(data)
    else:
        _stage_table(f"build: {loaded.name} -> {data['output_dir']}", data["stages"])


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--until", default=None, help="Stop after this stage.")
@click.option("--force", multiple=True, help="Rebuild this stage and the stages that read it.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (no progress bars).")
def build(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...], as_json: bool) -> None:
    """Run the recipe's stages, reusing cached artifacts."""
    _build(recipe, overrides, until, force, as_json)


def _until_command(stage: str) -> None:
    @cli.command(name=stage, help=f"Build up to the {stage} stage (same as `build --until {stage}`).")
    @click.argument("recipe")
    @_set_option
    @click.option("--force", multiple=True, help="Rebuild this stage and the stages that read it.")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
    def command(recipe: str, overrides: tuple[str, ...], force: tuple[str, ...], as_json: bool) -> None:
        _build(recipe, overrides, stage, force, as_json)


for _stage in ("model", "quantize", "draft", "engine", "deploy"):
    _until_command(_stage)


def _built(recipe: str, overrides: tuple[str, ...], until: str, progress_enabled: bool) -> tuple[Any, dict]:
    """Build (usually all cached) up to `until`; return the recipe and {stage: artifact path}."""
    from trtbuild.app import pipeline
    from trtbuild.app.preflight import preflight
    from trtbuild.core.progress import Progress

    loaded = _load(recipe, overrides)
    preflight(loaded)
    store = _cache()
    steps = pipeline.build(loaded, store, Progress.for_terminal(enabled=progress_enabled), until=until)
    artifacts = {s.name: s.artifact for s in steps if s.artifact is not None}
    # What is served or measured from here on stays leased until this process ends: `cache gc` and
    # `clean --cache` skip these entries.
    _LEASES.extend(fd for fd in (store.lease(path) for path in artifacts.values()) if fd is not None)
    return loaded, artifacts


_LEASES: list[int] = []  # lock file descriptors, released by the process's exit


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--http-port", type=int, default=None, help="Default: deploy.http_port (0 = a free port).")
@click.option("--grpc-port", type=int, default=None, help="Default: deploy.grpc_port.")
@click.option("--metrics-port", type=int, default=None, help="Default: deploy.metrics_port.")
@click.option("--openai-port", type=int, default=None, help="Default: deploy.openai_port.")
@click.option("--engine", type=click.Choice(["triton", "dynamo"]), default="triton", show_default=True,
              help="triton: tritonserver and trtbuild's OpenAI front; dynamo: NVIDIA Dynamo's frontend and router "
              "in front of --workers worker processes (the OpenAI API on --openai-port).")
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="--engine dynamo: worker processes, each running the runtime with in-flight batching.")
def serve(recipe: str, overrides: tuple[str, ...], http_port: int | None, grpc_port: int | None,
          metrics_port: int | None, openai_port: int | None, engine: str, workers: int) -> None:
    """Build the recipe if needed, then serve its deployment on 127.0.0.1: a real Triton server and
    an OpenAI-compatible API in front of it (or Dynamo's frontend and workers with --engine dynamo)."""
    from trtbuild.serve.commands import serve_deployment

    loaded, artifacts = _built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    if engine == "dynamo":
        from trtbuild.serve.dynamo.server import serve_dynamo_deployment

        sys.exit(serve_dynamo_deployment(artifacts["deploy"], workers=workers, openai_port=openai_port,
                                         echo=click.echo))
    code = serve_deployment(artifacts["deploy"], http_port=http_port, grpc_port=grpc_port,
                            metrics_port=metrics_port, openai_port=openai_port, echo=click.echo)
    sys.exit(code)


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--max-tokens", type=int, default=32, show_default=True)
def demo(recipe: str, overrides: tuple[str, ...], max_tokens: int) -> None:
    """Serve the built deployment on free ports, answer one request, print a load-test table, stop."""
    from trtbuild.serve.commands import demo as run_demo

    loaded, artifacts = _built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    run_demo(artifacts["deploy"], max_tokens=max_tokens, echo=click.echo, out_dir=_bench_dir(loaded))


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--server", "server_url", default=None, metavar="URL|local",
              help="Load-test a server instead of the in-process runtime: an OpenAI base URL ending in /v1 "
              "(`trtbuild serve`'s, or trtllm-serve's; driven by AIPerf), `local` (serve this deployment on free "
              "ports for the run), or Triton's HTTP endpoint (trtbuild's own streaming loop).")
@click.option("--concurrency", default=None, help="--server: concurrency levels, e.g. 1,8,32 (default: 1,8,32 "
              "with AIPerf, 1,2,4,8 with trtbuild's own loop).")
@click.option("--loadgen", type=click.Choice(["aiperf", "builtin"]), default="aiperf", show_default=True,
              help="--server local: AIPerf against the OpenAI API (`make aiperf` installs it), or trtbuild's own "
              "loop against Triton.")
@click.option("--target", "server_target", type=click.Choice(["local", "trtllm"]), default="local",
              show_default=True, help="--server with Triton's HTTP endpoint: which repository the server runs "
              "(trtllm: the GPU deployment; requests use its field names, no in-process baseline).")
@click.option("--max-tokens", type=int, default=64, show_default=True, help="--server: tokens per request.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench(recipe: str, overrides: tuple[str, ...], server_url: str | None, concurrency: str | None,
          loadgen: str, server_target: str, max_tokens: int, as_json: bool) -> None:
    """Plain, EAGLE-3 and n-gram decoding on the same prompts (in process), or a server load test."""
    try:
        _bench(recipe, overrides, server_url, concurrency, loadgen, server_target, max_tokens, as_json)
    except TrtbuildError as exc:
        if as_json:  # like `build --json`: CI reads why from stdout; the one line goes to stderr too
            _print_json({"recipe": recipe, "status": "failed", "error": exc.one_line()})
        raise


def _bench(recipe: str, overrides: tuple[str, ...], server_url: str | None, concurrency: str | None,
           loadgen: str, server_target: str, max_tokens: int, as_json: bool) -> None:
    if server_url:
        from trtbuild.core.progress import Progress
        from trtbuild.serve.commands import bench_server_url

        loaded, artifacts = _built(recipe, overrides, "deploy", not as_json)
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip()) if concurrency else None
        report = bench_server_url(artifacts["deploy"], server_url, loadgen=loadgen, concurrency=levels,
                                  max_tokens=max_tokens, out_dir=_bench_dir(loaded), target=server_target,
                                  echo=click.echo if not as_json else lambda _: None,
                                  progress=Progress.for_terminal(enabled=not as_json))
    else:
        from trtbuild.core.layout import DRAFT_EAGLE3, served_checkpoint
        from trtbuild.core.progress import Progress
        from trtbuild.runtime.bench import BenchConfig, run_bench

        loaded, artifacts = _built(recipe, overrides, "draft", not as_json)
        eagle3 = artifacts["draft"] / DRAFT_EAGLE3 if "draft" in artifacts else None
        draft_dir = eagle3 if eagle3 is not None and eagle3.is_dir() else None  # none: plain vs n-gram
        target = served_checkpoint(artifacts)
        draft = getattr(loaded, "draft", None)
        config = loaded.bench or BenchConfig(max_draft_len=draft.max_draft_len if draft else 3)
        out = _bench_dir(loaded) / "bench.json"
        report = run_bench(target, draft_dir, None, config, out_path=out,
                           progress=Progress.for_terminal(enabled=not as_json), base_dir=loaded.base_dir)
    if as_json:
        _print_json(report)
    else:
        _print_bench(report)


def _print_bench(report: dict[str, Any]) -> None:
    if report.get("loadgen") == "aiperf":
        from trtbuild.serve.loadgen.report import print_report

        print_report(report, click.echo)
        return
    if "levels" in report:
        from trtbuild.serve.bench import table

        for row in table(report):
            click.echo("  ".join(f"{cell:>14}" for cell in row))
        if "ratio_c1" in report:
            click.echo(f"Triton / in-process tokens/s/user at concurrency 1: {report['ratio_c1']:.3f}")
        return
    click.echo(f"plain:    {report['plain']['tokens_per_s_per_user']:8.1f} tokens/s/user")
    for key, label in (("speculative", "EAGLE-3"), ("ngram", "n-gram")):
        if key in report:
            mode = report[key]
            click.echo(f"{label + ':':9s} {mode['tokens_per_s_per_user']:8.1f} tokens/s/user  speedup "
                       f"{mode['speedup']:.2f}x  (acceptance length {mode['acceptance_length']:.2f})")
    if "tau_ratio_eagle3_vs_ngram" in report:
        click.echo(f"acceptance length EAGLE-3 / n-gram: {report['tau_ratio_eagle3_vs_ngram']:.2f}")
    click.echo(f"outputs identical: {report['outputs_identical']}")


def _bench_dir(loaded: Any) -> Any:
    """<output_dir>/bench, proven to stay inside the output dir (a planted symlink is refused)."""
    from trtbuild.core.safepaths import ensure_inside, mark_output_dir

    mark_output_dir(loaded.output_path)
    return ensure_inside(loaded.output_path / "bench", [loaded.output_path], "write into")


@cli.command()
@click.option("--markdown", is_flag=True, help="The recipe reference as Markdown (docs/recipe-reference.md).")
def schema(markdown: bool) -> None:
    """Print the recipe schema (JSON Schema, or the Markdown reference)."""
    from trtbuild.app.recipe import Recipe

    model = Recipe
    if markdown:
        from trtbuild.app.reference_doc import render

        click.echo(render(model), nl=False)
    else:
        _print_json(model.model_json_schema())


@cli.group()
def cache() -> None:
    """Inspect or prune the artifact cache (TRTBUILD_CACHE or ~/.cache/trtbuild)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True)
def cache_ls(as_json: bool) -> None:
    """List cached artifacts, interrupted draft trainings (resume) and entries with a broken manifest."""
    from trtbuild.core.cache import dir_size

    store = _cache()
    rows, broken = [], []
    for entry in store.entries():
        manifest = entry.manifest_or_none()
        if manifest is None:
            broken.append(str(entry.path))
            continue
        recipe = manifest.get("recipe")
        rows.append({"stage": entry.stage, "key": entry.key,
                     "recipe": recipe.get("name") if isinstance(recipe, dict) else None,
                     "created": manifest.get("created"), "bytes": dir_size(entry.path), "path": str(entry.path)})
    for path in store.resume_dirs():
        rows.append({"stage": "resume", "key": path.name, "recipe": None,
                     "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store.resume_last_used(path))),
                     "bytes": dir_size(path), "path": str(path)})
    if as_json:
        _print_json({"root": str(store.root), "entries": rows, "broken": broken,
                     "incomplete": [str(p) for p in store.incomplete()]})
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"cache: {store.root}")
    for column in ("stage", "key", "recipe", "created", "MB"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["stage"], row["key"][:12], str(row["recipe"]), str(row["created"]),
                      f"{row['bytes'] / 1e6:.1f}")
    Console().print(table)
    for path in broken:
        click.echo(f"broken manifest (skipped; `cache gc` removes it): {path}")


@cache.command("verify")
@click.argument("entries", nargs=-1, metavar="[STAGE/KEY]...")
def cache_verify(entries: tuple[str, ...]) -> None:
    """Hash every file of the named entries (default: the whole cache) against its manifest, whatever
    its size and times say; a damaged entry is reported and its check record dropped, so the next
    build that uses it rebuilds it. Exit 1 when any entry is damaged."""
    from trtbuild.core.cache import VERIFIED

    store = _cache()
    found = {f"{e.stage}/{e.key}": e for e in store.entries()}
    for name in entries:
        if name not in found:
            raise UserError(f"no cache entry {name!r} in {store.root}",
                            fix="name one as `cache ls` shows it (STAGE/KEY), or give none to verify all")
    damaged = 0
    for name in entries or tuple(found):
        entry = found[name]
        problem = store.damage(entry, full=True, record=True)  # intact: later uses start from this check
        if problem is None:
            click.echo(f"ok {name}")
            continue
        damaged += 1
        with contextlib.suppress(OSError):
            (entry.path / VERIFIED).unlink()
        click.echo(f"damaged {name}: {problem} (the next build that uses it rebuilds it)")
    click.echo(f"{len(entries or found) - damaged} intact, {damaged} damaged")
    if damaged:
        sys.exit(1)


def _days(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not (value >= 0 and value != float("inf")):
        raise click.BadParameter(f"{value} is not a number of days >= 0", ctx=ctx, param=param)
    return value


@cache.command("gc")
@click.option("--older-than", "days", type=float, default=30.0, show_default=True, callback=_days,
              help="Remove entries and interrupted draft trainings not used for this many days (>= 0).")
@click.option("--dry-run", is_flag=True)
def cache_gc(days: float, dry_run: bool) -> None:
    """Remove leftovers of killed builds, entries with a broken manifest, and what was unused for
    --older-than days (cache entries and the resume dirs of interrupted draft trainings)."""
    store = _cache()
    if not store.root.exists():
        click.echo(f"no cache at {store.root}: nothing to remove")
        return
    store.require_marked("collect")  # a directory that is not a trtbuild cache: one line, exit 2
    cutoff = time.time() - days * 86400
    verb = "would remove" if dry_run else "removed"
    doomed, broken, leased = [], [], []
    for entry in store.entries():
        if entry.manifest_or_none() is not None and store.last_used(entry) >= cutoff:
            continue
        if store.in_use(entry):
            leased.append(entry)
            continue
        (broken if entry.manifest_or_none() is None else doomed).append(entry)
    resumes = [p for p in store.resume_dirs() if store.resume_last_used(p) < cutoff and not store.resume_busy(p)]
    leftovers = store.incomplete()
    failed: list[str] = []  # what could not be removed (a read-only cache): said, never counted as removed

    def attempt(what: str, action: Callable[[], object]) -> bool:
        if dry_run:
            return True
        try:
            action()
        except OSError as exc:
            failed.append(what)
            click.echo(f"could not remove {what}: {exc.strerror or exc}")
            return False
        return True

    removed: list[Any] = []
    for entry in doomed + broken:
        name = f"{entry.stage}/{entry.key}"
        try:
            if not dry_run and not store.remove(entry):  # leased since the check above
                leased.append(entry)
                continue
        except OSError as exc:
            failed.append(name)
            click.echo(f"could not remove {name}: {exc.strerror or exc}")
            continue
        removed.append(entry)
        click.echo(f"{verb} {name}" + (" (broken manifest)" if entry in broken else ""))
    for entry in leased:
        click.echo(f"kept {entry.stage}/{entry.key}: a running server uses it")
    resumes = [p for p in resumes if attempt(f"resume/{p.name}", lambda p=p: store.remove_resume(p))]
    for path in resumes:
        click.echo(f"{verb} resume/{path.name}")
    leftovers = [p for p in leftovers if attempt(f"incomplete {p.parent.name}/{p.name}",
                                                 lambda p=p: store.remove_incomplete(p))]
    for path in leftovers:
        click.echo(f"{verb} incomplete {path.parent.name}/{path.name}")
    click.echo(f"{sum(e in doomed for e in removed)} entries, {sum(e in broken for e in removed)} broken, "
               f"{len(resumes)} resume dirs, {len(leftovers)} incomplete" + (f", {len(leased)} in use kept"
                                                                            if leased else "")
               + (f", {len(failed)} could not be removed" if failed else ""))
    if failed:
        raise UserError(f"{len(failed)} of what `cache gc` would remove in {store.root} could not be removed "
                        f"(first: {failed[0]})", fix="make the cache writable for this user, then run it again")


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--cache", "with_cache", is_flag=True, help="Also drop this recipe's cache entries.")
def clean(recipe: str, overrides: tuple[str, ...], with_cache: bool) -> None:
    """Remove what builds of the recipe wrote to its output directory (and with --cache its cached artifacts).

    Only a directory marked by a trtbuild build is touched, and in it only the stage links, build.json
    and bench/ that builds write; files of your own there stay."""
    from trtbuild.core.safepaths import clean_output_dir

    loaded = _load(recipe, overrides)
    out = loaded.output_path
    removed, kept = 0, []
    if with_cache:
        store = _cache()
        if store.root.exists():
            store.require_marked("clean")
        for entry in store.entries():
            recipe_info = (entry.manifest_or_none() or {}).get("recipe")
            # This recipe's entries: its name AND its file (another recipe of the same name elsewhere
            # keeps its entries; an entry another recipe reused stays recorded under that one).
            if not isinstance(recipe_info, dict) or recipe_info.get("name") != loaded.name:
                continue
            if recipe_info.get("file") != str(loaded.recipe_file):
                continue
            if store.remove(entry):
                removed += 1
            else:
                kept.append(f"{entry.stage}/{entry.key}")
    cleaned = clean_output_dir(out)
    what = f"removed {', '.join(cleaned)} from {out}" if cleaned else f"nothing built in {out}"
    in_use = f" (kept {len(kept)} a running server uses: {', '.join(kept)})" if kept else ""
    click.echo(what + (f"; {removed} cache entries{in_use}" if with_cache else ""))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="trtbuild", standalone_mode=False)
    except TrtbuildError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
    except OSError as exc:  # outside a stage (output dir, cache upkeep): still one line
        from trtbuild.core.errors import os_error

        click.echo(f"error: {os_error(exc).one_line()}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        click.echo(f"error: {exc.format_message()} (see `trtbuild --help`)", err=True)
        sys.exit(2)
    except KeyboardInterrupt:
        click.echo("error: interrupted; nothing half-written was kept", err=True)
        sys.exit(130)


if __name__ == "__main__":
    main()


__all__ = ["main", "UserError"]
