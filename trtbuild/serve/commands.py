"""What `trtbuild serve RECIPE` and `trtbuild bench RECIPE --server URL` call, given the deploy artifact.

The CLI resolves the recipe's deploy artifact (the directory with deploy.json) and hands it here;
nothing in this module imports torch unless the benchmark's in-process baseline needs it.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.bundle_info import read_bundle
from trtbuild.core.data.chat import render_chat
from trtbuild.core.data.pydoc_corpus import heldout_text
from trtbuild.core.errors import UserError
from trtbuild.core.layout import BUNDLE
from trtbuild.core.pbtxt import parameters_of, parse_config
from trtbuild.serve import client
from trtbuild.serve.bench import bench_server, in_process, plot, summarize, table
from trtbuild.serve.loadgen import aiperf
from trtbuild.serve.openai_api.text import PromptText
from trtbuild.serve.server import TritonServer, serve
from trtbuild.serve.textgen import generator_for_model, prompt_byte_limit

if TYPE_CHECKING:
    from trtbuild.serve.openai_api.app import FrontConfig


def read_deployment(deploy_dir: Path) -> dict[str, Any]:
    """deploy.json of a deploy artifact (for serve / bench)."""
    path = deploy_dir / "deploy.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        raise UserError(f"{deploy_dir} is not a deploy artifact (no readable deploy.json)",
                        fix="run `trtbuild deploy RECIPE` first") from None
    return data


def local_model_dir(deploy_dir: Path) -> tuple[Path, dict[str, Any]]:
    info = read_deployment(deploy_dir)
    local = info.get("local")
    if not local:
        raise UserError("this deployment has no local repository, so it cannot be served on this machine",
                        field="deploy.target", fix="add `local` to deploy.target (the trtllm repository "
                        "runs in the Triton TRT-LLM container: launch/triton_trtllm.sh)")
    return deploy_dir / local["repository"] / local["model"], info


def front_config(model_dir: Path, triton_http: str, model_id: str | None = None,
                 upstream_headers: dict[str, str] | None = None,
                 problem: Callable[[], str | None] | None = None,
                 upstream_url: Callable[[], str] | None = None) -> FrontConfig:
    """The front for a local repository's model: its tokenizer and defaults from config.pbtxt, its
    prompt limits from the target's context (the same the model applies)."""
    import json

    from transformers import AutoTokenizer

    from trtbuild.serve.openai_api.app import FrontConfig

    params = parameters_of(parse_config(model_dir / "config.pbtxt"))
    tokenizer_dir = (model_dir / params["tokenizer_dir"]).resolve()
    if not tokenizer_dir.is_dir():
        raise UserError(f"tokenizer directory not found: {tokenizer_dir}", file=str(model_dir / "config.pbtxt"),
                        field="tokenizer_dir", fix="rebuild the deployment (trtbuild deploy RECIPE --force deploy)")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    eos = tokenizer.eos_token_id
    base = triton_http if triton_http.startswith("http") else f"http://{triton_http}"
    target_config = (model_dir / params["target_dir"]).resolve() / "config.json"
    try:
        context = int(json.loads(target_config.read_text()).get("max_position_embeddings") or 4096)
    except (OSError, ValueError, TypeError):
        context = 4096  # the runtime's default (trtbuild.runtime.target)
    configured = int(params.get("max_prompt_bytes") or 1 << 20)
    return FrontConfig(model_id=model_id or model_dir.name, triton_url=base, triton_model=model_dir.name,
                       prompts=PromptText(tokenizer, params.get("add_special_tokens") == "true"),
                       default_max_tokens=int(params["default_max_tokens"]),
                       eos_ids=frozenset([eos] if isinstance(eos, int) else eos or []),
                       context_tokens=context, max_prompt_bytes=prompt_byte_limit(tokenizer, context, configured),
                       upstream_headers=tuple((upstream_headers or {}).items()),
                       problem=problem or (lambda: None), upstream_url=upstream_url)


def openai_front(model_dir: Path, port: int, drain_timeout_s: float = 30.0
                 ) -> Callable[[Any], contextlib.AbstractContextManager[list[str]]]:
    """For `serve(attach=...)`: the OpenAI-compatible API in front of the started Triton server."""

    @contextlib.contextmanager
    def attach(server: Any) -> Iterator[list[str]]:
        from trtbuild.serve.openai_api.runner import OpenAIFront

        # straight to tritonserver's own port, with the key only the fronts hold
        # (it follows tritonserver to the ports of a restart: server.triton_http is read per request)
        config = front_config(model_dir, server.triton_http, upstream_headers=server.upstream_headers,
                              problem=server.problem, upstream_url=lambda: f"http://{server.triton_http}")
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
    paragraphs = [p.strip() for p in heldout_text().split("\n\n") if len(p.strip()) >= chars]
    if not paragraphs:
        raise UserError("no held-out paragraph is long enough for a prompt", fix="pass prompts explicitly")
    return [paragraphs[i % len(paragraphs)][:chars] for i in range(count)]


def server_request(info: dict[str, Any], target: str) -> tuple[str, dict[str, str] | None]:
    """(model name, request field names) of the deployment's `target` repository (local or trtllm)."""
    if target == "trtllm":
        trtllm = info.get("trtllm")
        if not trtllm:
            raise UserError("this deployment has no trtllm repository", field="deploy.target",
                            fix="add `trtllm` to deploy.target, or bench the local model")
        return str(trtllm["entry_model"]), trtllm.get("request_fields")
    return str(info["model_name"]), None


def bench_deployment(deploy_dir: Path, url: str, *, prompts: Sequence[str] | None = None,
                     concurrency: Sequence[int] = (1, 2, 4, 8), max_tokens: int = 64,
                     speculative: bool | None = None, baseline: bool = True, out_dir: Path | None = None,
                     progress: Any = None, target: str = "local") -> dict[str, Any]:
    """bench_server against `url` for the deployment's model, with the in-process runtime built
    from the same repository parameters as the baseline (the ratio at concurrency 1).

    target "trtllm": the server runs the deployment's TensorRT-LLM repository (GPU host); requests
    use that model's field names (LLM-API: sampling_param_max_tokens / streaming) and there is no
    in-process baseline."""
    baseline = baseline and target == "local"
    model_dir, info = local_model_dir(deploy_dir) if baseline else (None, read_deployment(deploy_dir))
    model_name, fields = server_request(info, target)
    reference = None
    if model_dir is not None:
        reference = in_process(generator_for_model(model_dir), speculative=speculative)
    return bench_server(url, list(prompts or default_prompts()), concurrency, model=model_name,
                        max_tokens=max_tokens, baseline=reference, speculative=speculative, out_dir=out_dir,
                        progress=progress, request_fields=fields)


def bundle_tokenizer(deploy_dir: Path) -> Path:
    """The tokenizer directory the deployment's bundle ships (what the served endpoints encode with)."""
    return deploy_dir / BUNDLE / read_bundle(deploy_dir / BUNDLE).tokenizer


def demo(deploy_dir: Path, *, prompt: str | None = None, max_tokens: int = 32,
         concurrency: Sequence[int] = (1, 2, 4, 8), echo: Callable[[str], None] = print,
         out_dir: Path | None = None, chats: Sequence[list[dict[str, str]]] = ()) -> dict[str, Any]:
    """For `make demo`: serve the deployment on free ports (Triton and the OpenAI API), answer one
    request through each, print the load-test table (with the in-process ratio), and stop cleanly.

    chats: chat requests (a chat model's bench prompts): the first is asked through the OpenAI chat
    endpoint, and Triton and the load test get them rendered with the chat template, as served."""
    from openai import OpenAI

    model_dir, info = local_model_dir(deploy_dir)
    load_prompts: list[str] | None = None
    if chats:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(bundle_tokenizer(deploy_dir)))
        load_prompts = [render_chat(tokenizer, chat) for chat in chats]
        prompt, messages = load_prompts[0], list(chats[0])
    else:
        prompt = prompt or default_prompts(1, chars=60)[0]
        messages = [{"role": "user", "content": prompt}]
    with TritonServer([model_dir.parent], http_port=0, grpc_port=0, metrics_port=0,
                      exit_timeout_s=info.get("exit_timeout_s", 30)) as server, \
            openai_front(model_dir, 0)(server) as front_lines:
        for line in server.endpoints.lines([model_dir.name]) + front_lines:
            echo("  " + line)
        answer = client.generate(server.endpoints.http, model_dir.name, prompt, max_tokens)
        shown = f"{messages[-1]['content']!r} (through the chat template)" if chats else repr(prompt)
        echo(f"prompt:   {shown}")
        echo(f"answer:   {answer.text!r} ({answer.num_tokens} tokens, {1e3 * answer.total_s:.0f} ms)")
        openai_url = front_lines[0].split()[1]
        chat = OpenAI(base_url=openai_url, api_key="unused").chat.completions.create(
            model=info["model_name"], messages=messages, max_tokens=max_tokens,  # type: ignore[arg-type]
            temperature=0)
        echo(f"openai:   chat.completions {messages[-1]['content']!r} -> {chat.choices[0].message.content!r} "
             f"({chat.usage.completion_tokens} tokens, finish_reason {chat.choices[0].finish_reason})")
        report = bench_deployment(deploy_dir, server.endpoints.http, prompts=load_prompts,
                                  concurrency=concurrency, max_tokens=max_tokens, out_dir=out_dir)
    rows = table(report)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        echo("  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)))
    if "ratio_c1" in report:
        echo(f"serving overhead: Triton / in-process tokens/s/user at concurrency 1 = "
             f"{report['ratio_c1']:.3f} (outputs identical: {report['outputs_identical']})")
    report["demo_answer"] = answer.text
    return report


# -- `bench --server` with an established load generator (AIPerf) against the OpenAI API ----------

LOADGEN_LEVELS = (1, 8, 32)


def bench_openai(deploy_dir: Path, base_url: str, *, concurrency: Sequence[int] = LOADGEN_LEVELS,
                 max_tokens: int = 64, prompts: Sequence[str] | None = None, baseline: bool = True,
                 out_dir: Path | None = None, progress: Any = None) -> dict[str, Any]:
    """AIPerf against an OpenAI-compatible endpoint (`trtbuild serve`'s, or trtllm-serve's on a GPU
    host: base_url ends in /v1), with the in-process runtime's single-stream figures on the same
    prompts beside it when the deployment has a local model."""
    import requests

    base_url = base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        raise UserError(f"{base_url} is not an OpenAI base URL", field="--server", fix="end it with /v1")
    try:
        models = requests.get(f"{base_url}/models", timeout=30).json()["data"]
    except (requests.RequestException, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"no OpenAI model list at {base_url}/models ({exc})", field="--server",
                        fix="start the server first (trtbuild serve RECIPE) or use --server local") from None
    model = str(models[0]["id"])
    tokenizer = bundle_tokenizer(deploy_dir)
    prompts = list(prompts or default_prompts(32))
    out_dir = out_dir or Path(tempfile.mkdtemp(prefix="trtbuild-bench-"))
    report = aiperf.profile(base_url[: -len("/v1")], model, tokenizer, prompts, concurrency, max_tokens=max_tokens,
                            out_dir=out_dir, progress=progress)
    info = read_deployment(deploy_dir)
    if baseline and info.get("local"):
        model_dir, _ = local_model_dir(deploy_dir)
        run = in_process(generator_for_model(model_dir))
        run(prompts[0], 4)  # warm-up
        report["in_process"] = summarize([run(prompt, max_tokens) for prompt in prompts[:8]])
        c1 = next((row for row in report["levels"] if row["concurrency"] == 1), None)
        if c1 is not None:
            report["ratio_c1"] = c1["tokens_per_s_per_user"] / max(report["in_process"]["tokens_per_s_per_user"], 1e-9)
    report["criteria"] = serving_criteria(report["levels"])
    _save_report(report, out_dir)
    return report


def serving_criteria(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Issue 15's serving figures: throughput and TTFT p50 at concurrency 8 against 1, errors at 32."""
    by = {row["concurrency"]: row for row in rows}
    out: dict[str, Any] = {}
    if 1 in by and 8 in by:
        out["throughput_c8_over_c1"] = by[8]["throughput_tokens_per_s"] / max(by[1]["throughput_tokens_per_s"], 1e-9)
        out["ttft_p50_c8_over_c1"] = by[8]["ttft_ms_p50"] / max(by[1]["ttft_ms_p50"], 1e-9)
    if 32 in by:
        out["errors_c32"] = by[32]["errors"]
    return out


def _save_report(report: dict[str, Any], out_dir: Path) -> None:
    import json

    out_dir.mkdir(parents=True, exist_ok=True)
    report["plot"] = str(plot(report, out_dir / "bench_server.png"))
    (out_dir / "bench_server.json").write_text(json.dumps(report, indent=2) + "\n")


def bench_local(deploy_dir: Path, *, loadgen: str = "aiperf", concurrency: Sequence[int] | None = None,
                max_tokens: int = 64, out_dir: Path | None = None, echo: Callable[[str], None] = print,
                progress: Any = None) -> dict[str, Any]:
    """`bench --server local`: serve the deployment on free ports (Triton and the OpenAI API), load it
    with AIPerf (or, loadgen builtin, trtbuild's own loop against Triton), stop it cleanly."""
    model_dir, info = local_model_dir(deploy_dir)
    with TritonServer([model_dir.parent], http_port=0, grpc_port=0, metrics_port=0,
                      exit_timeout_s=info.get("exit_timeout_s", 30)) as server, \
            openai_front(model_dir, 0)(server) as front_lines:
        for line in server.endpoints.lines() + front_lines:
            echo("  " + line)
        if loadgen == "builtin":
            return bench_deployment(deploy_dir, server.endpoints.http, concurrency=concurrency or (1, 2, 4, 8),
                                    max_tokens=max_tokens, out_dir=out_dir, progress=progress)
        return bench_openai(deploy_dir, front_lines[0].split()[1], concurrency=concurrency or LOADGEN_LEVELS,
                            max_tokens=max_tokens, out_dir=out_dir, progress=progress)


def bench_server_url(deploy_dir: Path, server: str, *, loadgen: str = "aiperf",
                     concurrency: Sequence[int] | None = None, max_tokens: int = 64, out_dir: Path | None = None,
                     target: str = "local", echo: Callable[[str], None] = print,
                     progress: Any = None) -> dict[str, Any]:
    """`bench --server SERVER`: `local`, an OpenAI base URL (…/v1: AIPerf), or Triton's HTTP endpoint
    (trtbuild's own streaming loop, the fallback; `target` names the repository that server runs)."""
    if server == "local":
        return bench_local(deploy_dir, loadgen=loadgen, concurrency=concurrency, max_tokens=max_tokens,
                           out_dir=out_dir, echo=echo, progress=progress)
    if server.rstrip("/").endswith("/v1"):
        if loadgen == "builtin":
            raise UserError("trtbuild's own loop speaks Triton's generate_stream, not the OpenAI API",
                            field="--loadgen", fix="pass Triton's HTTP endpoint, or drop --loadgen builtin")
        return bench_openai(deploy_dir, server, concurrency=concurrency or LOADGEN_LEVELS, max_tokens=max_tokens,
                            out_dir=out_dir, progress=progress)
    return bench_deployment(deploy_dir, server, concurrency=concurrency or (1, 2, 4, 8), max_tokens=max_tokens,
                            out_dir=out_dir, progress=progress, target=target)
