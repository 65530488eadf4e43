"""`trtbuild serve`."""

from __future__ import annotations

import sys

import click

from trtbuild.cli.common import built, cli, set_option
from trtbuild.core.errors import UserError
from trtbuild.serve.commands import serve_deployment
from trtbuild.serve.dynamo.server import serve_dynamo_deployment


@cli.command()
@click.argument("recipe")
@set_option
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
    loaded, artifacts = built(recipe, overrides, "deploy", True)
    if "deploy" not in artifacts:
        raise UserError("the recipe has no deploy stage", file=recipe, field="deploy",
                        fix="add a `deploy:` section")
    if engine == "dynamo":
        sys.exit(serve_dynamo_deployment(artifacts["deploy"], workers=workers, openai_port=openai_port,
                                         echo=click.echo))
    code = serve_deployment(artifacts["deploy"], http_port=http_port, grpc_port=grpc_port,
                            metrics_port=metrics_port, openai_port=openai_port, echo=click.echo)
    sys.exit(code)
