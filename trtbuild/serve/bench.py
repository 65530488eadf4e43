"""Load test of a served model through its streaming endpoint, against the in-process runtime.

For each concurrency level, that many clients send the prompts (round-robin, each client one
request at a time) to /v2/models/<model>/generate_stream and time every server-sent event. Per
request: time to first token (TTFT), inter-token latency (ITL) and tokens/s/user =
(tokens - 1) / (last token - first token), the runtime's own definition (DecodeStats). The
in-process baseline decodes the same prompts with the same generator settings in this process;
at concurrency 1 server and baseline requests alternate prompt by prompt, so both see the same
machine load. Writes JSON and a PNG plot when given an output directory.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from trtbuild.serve.client import RequestFailed, Streamed, generate_stream
from trtbuild.serve.textgen import GenRequest

Baseline = Callable[[str, int], Streamed]


def in_process(generator: Any, speculative: bool | None = None) -> Baseline:
    """A baseline measuring a TextGenerator the way the client measures the server."""
    def run(prompt: str, max_tokens: int) -> Streamed:
        out = Streamed()
        start = time.perf_counter()
        request = GenRequest(prompt=prompt, max_tokens=max_tokens, speculative=speculative)
        for chunk in generator.stream(request):
            out.add(chunk.text, chunk.ids, time.perf_counter() - start)
        out.total_s = time.perf_counter() - start
        return out

    return run


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def summarize(results: list[Streamed], wall_s: float | None = None) -> dict[str, Any]:
    decoding = [r for r in results if r.num_tokens > 1]
    tps = [r.tokens_per_s_per_user for r in decoding]
    span = sum(r.last_token_s - r.ttft_s for r in decoding)
    ttft = [r.ttft_s for r in results]
    itl = [r.inter_token_s for r in results if r.num_tokens > 1]
    tokens = sum(r.num_tokens for r in results)
    out = {
        "requests": len(results),
        "tokens": tokens,
        # All requests' decode tokens over all their decode time: robust to a request whose events
        # arrived in one burst (a per-request mean would count it as near-infinite speed).
        "tokens_per_s_per_user": sum(r.num_tokens - 1 for r in decoding) / span if span > 0 else 0.0,
        "tokens_per_s_per_user_p50": _percentile(tps, 0.5),
        "ttft_ms_mean": 1e3 * statistics.fmean(ttft) if ttft else 0.0,
        "ttft_ms_p50": 1e3 * _percentile(ttft, 0.5),
        "ttft_ms_p90": 1e3 * _percentile(ttft, 0.9),
        "itl_ms_mean": 1e3 * statistics.fmean(itl) if itl else 0.0,
        "itl_ms_p50": 1e3 * _percentile(itl, 0.5),
        "itl_ms_p90": 1e3 * _percentile(itl, 0.9),
    }
    if wall_s:
        out["wall_s"] = wall_s
        out["throughput_tokens_per_s"] = tokens / wall_s
    return out


def _run_level(url: str, model: str, prompts: Sequence[str], concurrency: int, max_tokens: int,
               params: dict[str, Any], timeout_s: float,
               fields: dict[str, str] | None = None) -> tuple[list[Streamed], list[str], float]:
    import requests

    total = max(len(prompts), concurrency)
    jobs = [prompts[i % len(prompts)] for i in range(total)]
    results: list[Streamed | None] = [None] * total
    errors: list[str] = []
    lock = threading.Lock()

    def client(index: int) -> None:
        with requests.Session() as session:
            for j in range(index, total, concurrency):
                try:
                    results[j] = generate_stream(url, model, jobs[j], max_tokens, timeout_s=timeout_s,
                                                 session=session, fields=fields, **params)
                except (RequestFailed, requests.RequestException) as exc:
                    with lock:
                        errors.append(str(exc))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None], errors, time.perf_counter() - start


def bench_server(url: str, prompts: Sequence[str], concurrency: Sequence[int] = (1, 2, 4, 8), *,
                 model: str = "llm", max_tokens: int = 64, baseline: Baseline | None = None,
                 speculative: bool | None = None, out_dir: Path | None = None, timeout_s: float = 600.0,
                 progress: Any = None, request_fields: dict[str, str] | None = None) -> dict[str, Any]:
    """tokens/s/user, TTFT and ITL per concurrency level through `url` (the HTTP endpoint), and the
    ratio of concurrency-1 tokens/s/user to the in-process `baseline` on the same prompts.

    `request_fields`: the served model's names for max_tokens / stream (TRT-LLM's LLM-API model:
    sampling_param_max_tokens / streaming); default trtbuild's own."""
    if not prompts:
        raise ValueError("bench_server needs at least one prompt")
    params = {} if speculative is None else {"speculative": speculative}
    fields = request_fields
    generate_stream(url, model, prompts[0], min(max_tokens, 4), timeout_s=timeout_s, fields=fields,
                    **params)  # warm-up
    report: dict[str, Any] = {"url": url, "model": model, "max_tokens": max_tokens, "prompts": len(prompts),
                              "speculative": speculative, "levels": []}

    if baseline is not None:
        # Alternate server and in-process prompt by prompt (and which goes first), so drifts in
        # machine load hit both the same way.
        baseline(prompts[0], min(max_tokens, 4))
        served, local, same = [], [], []
        for i, prompt in enumerate(prompts):
            order = ("server", "local") if i % 2 == 0 else ("local", "server")
            for who in order:
                if who == "server":
                    served.append(generate_stream(url, model, prompt, max_tokens, timeout_s=timeout_s,
                                                  fields=fields, **params))
                else:
                    local.append(baseline(prompt, max_tokens))
            same.append(served[-1].text == local[-1].text and served[-1].token_ids == local[-1].token_ids)
        report["in_process"] = summarize(local)
        report["paired_c1"] = summarize(served)
        report["ratio_c1"] = (report["paired_c1"]["tokens_per_s_per_user"]
                              / max(report["in_process"]["tokens_per_s_per_user"], 1e-9))
        report["outputs_identical"] = all(same)

    for level in concurrency:
        results, errors, wall = _run_level(url, model, prompts, level, max_tokens, params, timeout_s, fields)
        row = {"concurrency": level, "errors": len(errors), **summarize(results, wall)}
        if errors:
            row["first_error"] = errors[0]
        report["levels"].append(row)
        if progress is not None:
            progress.log(f"bench: concurrency {level}: {row['tokens_per_s_per_user']:.1f} tokens/s/user, "
                         f"TTFT p50 {row['ttft_ms_p50']:.0f} ms, {len(errors)} errors")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "bench_server.json").write_text(json.dumps(report, indent=2) + "\n")
        report["plot"] = str(plot(report, out_dir / "bench_server.png"))
        (out_dir / "bench_server.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def plot(report: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [row["concurrency"] for row in report["levels"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(levels, [row["tokens_per_s_per_user"] for row in report["levels"]], "o-",
              label="Triton (streaming)")
    if "in_process" in report:
        left.axhline(report["in_process"]["tokens_per_s_per_user"], color="gray", ls="--",
                     label=f"in-process (c=1 ratio {report['ratio_c1']:.2f})")
    left.set_xscale("log", base=2)
    left.set_xticks(levels, [str(c) for c in levels])
    left.set_xlabel("concurrent clients")
    left.set_ylabel("tokens/s/user")
    left.legend()
    right.plot(levels, [row["ttft_ms_p50"] for row in report["levels"]], "o-", label="TTFT p50")
    right.plot(levels, [row["itl_ms_p50"] for row in report["levels"]], "s-", label="inter-token p50")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.set_xticks(levels, [str(c) for c in levels])
    right.set_xlabel("concurrent clients")
    right.set_ylabel("ms")
    right.legend()
    fig.suptitle(f"{report['model']} at {report['url']}, {report['max_tokens']} new tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def table(report: dict[str, Any]) -> list[list[str]]:
    """Rows for a printed table (the CLI renders them)."""
    rows = [["concurrency", "tokens/s/user", "TTFT p50 ms", "ITL p50 ms", "throughput tok/s", "errors"]]
    for row in report["levels"]:
        rows.append([str(row["concurrency"]), f"{row['tokens_per_s_per_user']:.1f}",
                     f"{row['ttft_ms_p50']:.1f}", f"{row['itl_ms_p50']:.2f}",
                     f"{row.get('throughput_tokens_per_s', 0):.1f}", str(row["errors"])])
    if "in_process" in report:
        base = report["in_process"]
        rows.append(["in-process", f"{base['tokens_per_s_per_user']:.1f}", f"{base['ttft_ms_p50']:.1f}",
                     f"{base['itl_ms_p50']:.2f}", "", ""])
    return rows
