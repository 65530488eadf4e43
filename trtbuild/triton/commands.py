"""What `trtbuild serve RECIPE` and `trtbuild bench RECIPE --server URL` call, given the deploy artifact.

The CLI resolves the recipe's deploy artifact (the directory with deploy.json) and hands it here;
nothing in this module imports torch unless the benchmark's in-process baseline needs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from trtbuild.errors import UserError
from trtbuild.triton.deploy import read_deployment


def local_model_dir(deploy_dir: Path) -> tuple[Path, dict[str, Any]]:
    info = read_deployment(deploy_dir)
    local = info.get("local")
    if not local:
        raise UserError("this deployment has no local repository, so it cannot be served on this machine",
                        field="deploy.target", fix="add `local` to deploy.target (the trtllm repository "
                        "runs in the Triton TRT-LLM container: launch/triton_trtllm.sh)")
    return deploy_dir / local["repository"] / local["model"], info


def openai_front(model_dir: Path, port: int, drain_timeout_s: float = 30.0
                 ) -> Callable[[Any], contextlib.AbstractContextManager[list[str]]]:
    """For `serve(attach=...)`: the OpenAI-compatible API in front of the started Triton server."""

    @contextlib.contextmanager
    def attach(endpoints: Any) -> Iterator[list[str]]:
        from trtbuild.openai_api.runner import OpenAIFront, front_config

        config = front_config(model_dir, endpoints.http)
        with OpenAIFront(config, port=port, drain_timeout_s=drain_timeout_s) as front:
            yield [f"OpenAI   {front.url}  (/models, /completions, /chat/completions; "
                   f"model \"{config.model_id}\")"]

    return attach


def serve_deployment(deploy_dir: Path, *, http_port: int | None = None, grpc_port: int | None = None,
                     metrics_port: int | None = None, openai_port: int | None = None,
                     echo: Callable[[str], None] = print, log_file: Path | None = None) -> int:
    """Serve the deployment's local repository on 127.0.0.1 until SIGINT/SIGTERM, with the
    OpenAI-compatible API in front of it; returns the exit code.

    Ports default to the recipe's deploy.http_port / grpc_port / metrics_port / openai_port;
    0 picks a free one."""
    from trtbuild.triton.server import serve

    model_dir, info = local_model_dir(deploy_dir)
    ports = info["ports"]
    exit_timeout_s = info.get("exit_timeout_s", 30)
    openai = ports.get("openai", 8003) if openai_port is None else openai_port
    return serve([model_dir.parent], models=[model_dir.name],
                 http_port=ports["http"] if http_port is None else http_port,
                 grpc_port=ports["grpc"] if grpc_port is None else grpc_port,
                 metrics_port=ports["metrics"] if metrics_port is None else metrics_port,
                 exit_timeout_s=exit_timeout_s, echo=echo, log_file=log_file,
                 attach=openai_front(model_dir, openai, drain_timeout_s=exit_timeout_s))


def default_prompts(count: int = 8, chars: int = 80) -> list[str]:
    """Prompts from the held-out pydoc text (paragraph starts), the corpus the tiny target knows."""
    from trtbuild.data.pydoc_corpus import heldout_text

    paragraphs = [p.strip() for p in heldout_text().split("\n\n") if len(p.strip()) >= chars]
    if not paragraphs:
        raise UserError("no held-out paragraph is long enough for a prompt", fix="pass prompts explicitly")
    return [paragraphs[i % len(paragraphs)][:chars] for i in range(count)]


def bench_deployment(deploy_dir: Path, url: str, *, prompts: Sequence[str] | None = None,
                     concurrency: Sequence[int] = (1, 2, 4, 8), max_tokens: int = 64,
                     speculative: bool | None = None, baseline: bool = True, out_dir: Path | None = None,
                     progress: Any = None) -> dict[str, Any]:
    """bench_server against `url` for the deployment's model, with the in-process runtime built
    from the same repository parameters as the baseline (the ratio at concurrency 1)."""
    from trtbuild.triton.bench import bench_server, in_process

    model_dir, info = local_model_dir(deploy_dir) if baseline else (None, read_deployment(deploy_dir))
    reference = None
    if model_dir is not None:
        from trtbuild.triton.textgen import generator_for_model

        reference = in_process(generator_for_model(model_dir), speculative=speculative)
    return bench_server(url, list(prompts or default_prompts()), concurrency, model=info["model_name"],
                        max_tokens=max_tokens, baseline=reference, speculative=speculative, out_dir=out_dir,
                        progress=progress)


def demo(deploy_dir: Path, *, prompt: str | None = None, max_tokens: int = 32,
         concurrency: Sequence[int] = (1, 2, 4, 8), echo: Callable[[str], None] = print,
         out_dir: Path | None = None) -> dict[str, Any]:
    """For `make demo`: serve the deployment on free ports (Triton and the OpenAI API), answer one
    request through each, print the load-test table (with the in-process ratio), and stop cleanly."""
    from openai import OpenAI

    from trtbuild.triton import client
    from trtbuild.triton.bench import table
    from trtbuild.triton.server import TritonServer

    model_dir, info = local_model_dir(deploy_dir)
    prompt = prompt or default_prompts(1, chars=60)[0]
    with TritonServer([model_dir.parent], http_port=0, grpc_port=0, metrics_port=0,
                      exit_timeout_s=info.get("exit_timeout_s", 30)) as server, \
            openai_front(model_dir, 0)(server.endpoints) as front_lines:
        for line in server.endpoints.lines([model_dir.name]) + front_lines:
            echo("  " + line)
        answer = client.generate(server.endpoints.http, model_dir.name, prompt, max_tokens)
        echo(f"prompt:   {prompt!r}")
        echo(f"answer:   {answer.text!r} ({answer.num_tokens} tokens, {1e3 * answer.total_s:.0f} ms)")
        openai_url = front_lines[0].split()[1]
        chat = OpenAI(base_url=openai_url, api_key="unused").chat.completions.create(
            model=info["model_name"], messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
            temperature=0)
        echo(f"openai:   chat.completions -> {chat.choices[0].message.content!r} "
             f"({chat.usage.completion_tokens} tokens, finish_reason {chat.choices[0].finish_reason})")
        report = bench_deployment(deploy_dir, server.endpoints.http, concurrency=concurrency,
                                  max_tokens=max_tokens, out_dir=out_dir)
    rows = table(report)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        echo("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    if "ratio_c1" in report:
        echo(f"serving overhead: Triton / in-process tokens/s/user at concurrency 1 = "
             f"{report['ratio_c1']:.3f} (outputs identical: {report['outputs_identical']})")
    report["demo_answer"] = answer.text
    return report
