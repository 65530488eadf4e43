"""The `trtbuild` command line. Every user error is one line on stderr and exit code 2."""

from __future__ import annotations

import json
import shutil
import sys
import time
from typing import Any

import click

from trtbuild.errors import TrtbuildError, UserError

_set_option = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                           help="Override a recipe field, e.g. --set quantize.gate.max_perplexity_ratio=1.05")


def _load(recipe_path: str, overrides: tuple[str, ...]) -> Any:
    from trtbuild.recipe import load_recipe

    return load_recipe(recipe_path, list(overrides))


def _cache() -> Any:
    from trtbuild.cache import ArtifactCache

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
    from trtbuild.preflight import preflight

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
    from trtbuild import pipeline
    from trtbuild.preflight import preflight

    loaded = _load(recipe, overrides)
    preflight(loaded)
    steps = pipeline.plan(loaded, _cache(), until=until, force=force)
    data = pipeline.report(loaded, steps, executed=False)
    from trtbuild.gpu_plan import plan_notes

    data["notes"] = plan_notes(loaded)
    if as_json:
        _print_json(data)
    else:
        _stage_table(f"plan: {loaded.name} -> {data['output_dir']}", data["stages"])
        for line in data["notes"]:
            click.echo(line)


def _build(recipe: str, overrides: tuple[str, ...], until: str | None, force: tuple[str, ...],
           as_json: bool) -> None:
    from trtbuild import pipeline
    from trtbuild.preflight import preflight
    from trtbuild.progress import Progress

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
    from trtbuild import pipeline
    from trtbuild.preflight import preflight
    from trtbuild.progress import Progress

    loaded = _load(recipe, overrides)
    preflight(loaded)
    steps = pipeline.build(loaded, _cache(), Progress.for_terminal(enabled=progress_enabled), until=until)
    return loaded, {s.name: s.artifact for s in steps if s.artifact is not None}


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--http-port", type=int, default=None, help="Default: deploy.http_port (0 = a free port).")
@click.option("--grpc-port", type=int, default=None, help="Default: deploy.grpc_port.")
@click.option("--metrics-port", type=int, default=None, help="Default: deploy.metrics_port.")
def serve(recipe: str, overrides: tuple[str, ...], http_port: int | None, grpc_port: int | None,
          metrics_port: int | None) -> None:
    """Build the recipe if needed, then serve its deployment with a real Triton server on 127.0.0.1."""
    from trtbuild.triton.commands import serve_deployment

    loaded, artifacts = _built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    code = serve_deployment(artifacts["deploy"], http_port=http_port, grpc_port=grpc_port,
                            metrics_port=metrics_port, echo=click.echo)
    sys.exit(code)


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--max-tokens", type=int, default=32, show_default=True)
def demo(recipe: str, overrides: tuple[str, ...], max_tokens: int) -> None:
    """Serve the built deployment on free ports, answer one request, print a load-test table, stop."""
    from trtbuild.triton.commands import demo as run_demo

    loaded, artifacts = _built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    run_demo(artifacts["deploy"], max_tokens=max_tokens, echo=click.echo,
             out_dir=loaded.output_path / "bench")


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--server", "server_url", default=None, metavar="URL",
              help="Benchmark a running server (its HTTP endpoint) instead of the in-process runtime.")
@click.option("--concurrency", default="1,2,4,8", show_default=True, help="--server: concurrency sweep.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench(recipe: str, overrides: tuple[str, ...], server_url: str | None, concurrency: str,
          as_json: bool) -> None:
    """Plain, EAGLE-3 and n-gram decoding on the same prompts (in process), or a server load test."""
    if server_url:
        from trtbuild.triton.commands import bench_deployment

        loaded, artifacts = _built(recipe, overrides, "deploy", not as_json)
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
        report = bench_deployment(artifacts["deploy"], server_url, concurrency=levels,
                                  out_dir=loaded.output_path / "bench")
    else:
        from trtbuild.progress import Progress
        from trtbuild.runtime.bench import BenchConfig, run_bench

        loaded, artifacts = _built(recipe, overrides, "draft", not as_json)
        eagle3 = artifacts["draft"] / "eagle3" if "draft" in artifacts else None
        draft_dir = eagle3 if eagle3 is not None and eagle3.is_dir() else None  # none: plain vs n-gram
        target = artifacts["quantize"] / "hf" if "quantize" in artifacts else artifacts["model"] / "hf"
        draft = getattr(loaded, "draft", None)
        config = loaded.bench or BenchConfig(max_draft_len=draft.max_draft_len if draft else 3)
        out = loaded.output_path / "bench" / "bench.json"
        report = run_bench(target, draft_dir, None, config, out_path=out,
                           progress=Progress.for_terminal(enabled=not as_json))
    if as_json:
        _print_json(report)
    else:
        _print_bench(report)


def _print_bench(report: dict[str, Any]) -> None:
    if "levels" in report:
        from trtbuild.triton.bench import table

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


@cli.command()
@click.option("--markdown", is_flag=True, help="The recipe reference as Markdown (docs/recipe-reference.md).")
def schema(markdown: bool) -> None:
    """Print the recipe schema (JSON Schema, or the Markdown reference)."""
    from trtbuild.recipe import recipe_model

    model = recipe_model()
    if markdown:
        from trtbuild.reference_doc import render

        click.echo(render(model), nl=False)
    else:
        _print_json(model.model_json_schema())


@cli.group()
def cache() -> None:
    """Inspect or prune the artifact cache (TRTBUILD_CACHE or ~/.cache/trtbuild)."""


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True)
def cache_ls(as_json: bool) -> None:
    """List cached artifacts."""
    from trtbuild.cache import dir_size

    store = _cache()
    rows = []
    for entry in store.entries():
        manifest = entry.manifest()
        rows.append({"stage": entry.stage, "key": entry.key, "recipe": manifest.get("recipe", {}).get("name"),
                     "created": manifest.get("created"), "bytes": dir_size(entry.path), "path": str(entry.path)})
    if as_json:
        _print_json({"root": str(store.root), "entries": rows, "incomplete": [str(p) for p in store.incomplete()]})
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


@cache.command("gc")
@click.option("--older-than", "days", type=float, default=30.0, show_default=True,
              help="Remove entries not used for this many days.")
@click.option("--dry-run", is_flag=True)
def cache_gc(days: float, dry_run: bool) -> None:
    """Remove leftovers of killed builds and entries unused for --older-than days."""
    store = _cache()
    cutoff = time.time() - days * 86400
    doomed = [e for e in store.entries() if store.last_used(e) < cutoff]
    leftovers = store.incomplete()
    for entry in doomed:
        click.echo(f"{'would remove' if dry_run else 'removed'} {entry.stage}/{entry.key}")
        if not dry_run:
            store.remove(entry)
    for path in leftovers:
        click.echo(f"{'would remove' if dry_run else 'removed'} incomplete {path.parent.name}/{path.name}")
        if not dry_run:
            shutil.rmtree(path, ignore_errors=True)
    click.echo(f"{len(doomed)} entries, {len(leftovers)} incomplete")


@cli.command()
@click.argument("recipe")
@_set_option
@click.option("--cache", "with_cache", is_flag=True, help="Also drop this recipe's cache entries.")
def clean(recipe: str, overrides: tuple[str, ...], with_cache: bool) -> None:
    """Remove the recipe's output directory (and with --cache its cached artifacts)."""
    loaded = _load(recipe, overrides)
    out = loaded.output_path
    removed = 0
    if with_cache:
        store = _cache()
        for entry in store.entries():
            if entry.manifest().get("recipe", {}).get("name") == loaded.name:
                store.remove(entry)
                removed += 1
    if out.exists():
        shutil.rmtree(out)
    click.echo(f"removed {out}" + (f" and {removed} cache entries" if with_cache else ""))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="trtbuild", standalone_mode=False)
    except TrtbuildError as exc:
        click.echo(f"error: {exc.one_line()}", err=True)
        sys.exit(exc.exit_code)
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
