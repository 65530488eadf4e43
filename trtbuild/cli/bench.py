"""`trtbuild bench`: in process (plain, EAGLE-3, n-gram), or a server load test."""

from __future__ import annotations

from typing import Any

import click

from trtbuild.cli.common import bench_dir, built, cli, print_json, set_option
from trtbuild.core.errors import TrtbuildError
from trtbuild.core.layout import DRAFT_EAGLE3, served_checkpoint
from trtbuild.core.progress import Progress
from trtbuild.runtime.bench import BenchConfig, run_bench
from trtbuild.serve.bench import table
from trtbuild.serve.commands import bench_server_url
from trtbuild.serve.loadgen.report import print_report


@cli.command()
@click.argument("recipe")
@set_option
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
            print_json({"recipe": recipe, "status": "failed", "error": exc.one_line()})
        raise


def _bench(recipe: str, overrides: tuple[str, ...], server_url: str | None, concurrency: str | None,
           loadgen: str, server_target: str, max_tokens: int, as_json: bool) -> None:
    if server_url:
        loaded, artifacts = built(recipe, overrides, "deploy", not as_json)
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip()) if concurrency else None
        report = bench_server_url(artifacts["deploy"], server_url, loadgen=loadgen, concurrency=levels,
                                  max_tokens=max_tokens, out_dir=bench_dir(loaded), target=server_target,
                                  echo=click.echo if not as_json else lambda _: None,
                                  progress=Progress.for_terminal(enabled=not as_json))
    else:
        loaded, artifacts = built(recipe, overrides, "draft", not as_json)
        eagle3 = artifacts["draft"] / DRAFT_EAGLE3 if "draft" in artifacts else None
        draft_dir = eagle3 if eagle3 is not None and eagle3.is_dir() else None  # none: plain vs n-gram
        target = served_checkpoint(artifacts)
        draft = loaded.draft
        config = loaded.bench or BenchConfig(max_draft_len=draft.max_draft_len if draft else 3)
        out = bench_dir(loaded) / "bench.json"
        report = run_bench(target, draft_dir, None, config, out_path=out,
                           progress=Progress.for_terminal(enabled=not as_json), base_dir=loaded.base_dir)
    if as_json:
        print_json(report)
    else:
        _print_bench(report)


def _print_bench(report: dict[str, Any]) -> None:
    if report.get("loadgen") == "aiperf":
        print_report(report, click.echo)
        return
    if "levels" in report:
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
