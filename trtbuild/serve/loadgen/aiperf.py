"""NVIDIA AIPerf (PyPI `aiperf`, the successor of genai-perf) against an OpenAI-compatible endpoint.

AIPerf pins its own stack (pyzmq, rich, transformers, ...), so it lives in its own environment
(`make aiperf` creates .venv-aiperf/) and runs as a subprocess: one `aiperf profile` per
concurrency level, closed loop (a new request as soon as one finishes), streaming chat
completions of our prompts with a fixed output length, greedy. Its JSON export
(profile_export_aiperf.json) gives TTFT / inter-token latency / throughput with percentiles.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.errors import BuildError, UserError

PROJECT_ROOT = Path(__file__).resolve().parents[3]
VENV_AIPERF = PROJECT_ROOT / ".venv-aiperf" / "bin" / "aiperf"
EXPORT = "profile_export_aiperf.json"


def find_aiperf() -> Path | None:
    """$TRTBUILD_AIPERF, else the project's .venv-aiperf, else `aiperf` on PATH."""
    named = os.environ.get("TRTBUILD_AIPERF")
    if named:
        return Path(named) if Path(named).is_file() else None
    if VENV_AIPERF.is_file():
        return VENV_AIPERF
    found = shutil.which("aiperf")
    return Path(found) if found else None


def require_aiperf() -> Path:
    found = find_aiperf()
    if found is None:
        raise UserError("AIPerf is not installed (it is the load generator of `bench --server`)",
                        fix="`make aiperf` creates .venv-aiperf/ with it (or set TRTBUILD_AIPERF to an aiperf "
                        "executable); `--loadgen builtin` uses trtbuild's own loop instead")
    return found


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int
    warmup: int


def levels(concurrency: Sequence[int], min_requests: int = 48, per_client: int = 8) -> list[Level]:
    """Enough requests that every client sends several after the warm-up (one per client), and a
    measured window of several seconds: AIPerf's own processes share this machine's 2 cores, and
    with 16 / 32 requests (4-5 s at concurrency 1, under 3 s at 8) their start-up and shutdown
    moved the concurrency 8 / 1 throughput ratio by +-15% between consecutive runs."""
    return [Level(c, max(min_requests, per_client * c), c) for c in concurrency]


def command(aiperf: Path, *, base_url: str, model: str, tokenizer: Path, prompts_file: Path, level: Level,
            max_tokens: int, out_dir: Path, seed: int = 0) -> list[str]:
    """`aiperf profile` for one level. base_url: the server root (AIPerf appends /v1/chat/completions)."""
    return [str(aiperf), "profile", "--model", model, "--url", base_url, "--endpoint-type", "chat", "--streaming",
            "--tokenizer", str(tokenizer), "--input-file", str(prompts_file), "--custom-dataset-type", "single_turn",
            "--output-tokens-mean", str(max_tokens), "--extra-inputs", "temperature:0",
            # exact completion tokens from the server's usage (re-tokenizing decoded text can differ)
            "--use-server-token-count",
            "--concurrency", str(level.concurrency), "--request-count", str(level.requests),
            "--warmup-request-count", str(level.warmup), "--random-seed", str(seed),
            "--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry", "--artifact-dir", str(out_dir)]


def write_prompts(prompts: Sequence[str], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    return path


def _metric(export: dict[str, Any], name: str, stat: str) -> float:
    value = export.get(name, {}).get(stat)
    return float(value) if value is not None else 0.0


def summarize(export: dict[str, Any], level: Level) -> dict[str, Any]:
    """One report row (the keys `trtbuild.serve.bench.table` prints) from AIPerf's JSON export."""
    row: dict[str, Any] = {"concurrency": level.concurrency, "requests": int(_metric(export, "request_count", "avg"))}
    for ours, theirs in (("ttft_ms", "time_to_first_token"), ("itl_ms", "inter_token_latency"),
                         ("request_latency_ms", "request_latency")):
        for stat in ("avg", "p50", "p90", "p99"):
            row[f"{ours}_{'mean' if stat == 'avg' else stat}"] = _metric(export, theirs, stat)
    row["throughput_tokens_per_s"] = _metric(export, "output_token_throughput", "avg")
    row["tokens_per_s_per_user"] = _metric(export, "output_token_throughput_per_user", "avg")
    row["tokens_per_s_per_user_p50"] = _metric(export, "output_token_throughput_per_user", "p50")
    row["output_tokens_mean"] = _metric(export, "output_sequence_length", "avg")
    summary = export.get("error_summary") or []  # [{"error_details": {code, type, message, cause}, "count"}]
    row["errors"] = sum(int(e.get("count", 0)) for e in summary)
    if summary:
        details = summary[0].get("error_details") or {}
        row["first_error"] = f"{details.get('code')} {details.get('message', '')}"[:300]
    return row


def run_level(cmd: list[str], out_dir: Path, level: Level, timeout_s: float) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "aiperf.out"
    with open(log, "wb") as out:
        try:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  timeout=timeout_s, cwd=out_dir).returncode
        except subprocess.TimeoutExpired:
            raise BuildError(f"aiperf did not finish concurrency {level.concurrency} in {timeout_s:.0f} s",
                             fix=f"see {log}") from None
    export = out_dir / EXPORT
    if code != 0 or not export.is_file():
        lines = log.read_text(errors="replace").strip().splitlines()
        told = [line for line in lines if " ERROR " in line] or lines[-1:] or ["no output"]
        raise BuildError(f"aiperf failed at concurrency {level.concurrency} (exit {code}): {told[-1].strip()[:300]}",
                         fix=f"see {log}")
    row = summarize(json.loads(export.read_text()), level)
    row["command"] = " ".join(cmd)
    return row


def profile(base_url: str, model: str, tokenizer: Path, prompts: Sequence[str], concurrency: Sequence[int], *,
            max_tokens: int, out_dir: Path, progress: Any = None, timeout_s: float = 1800.0) -> dict[str, Any]:
    """AIPerf at each concurrency; the report has the levels in `bench_server`'s row format."""
    aiperf = require_aiperf()
    prompts_file = write_prompts(prompts, out_dir / "aiperf" / "prompts.jsonl")
    report: dict[str, Any] = {"loadgen": "aiperf", "aiperf": str(aiperf), "url": base_url, "model": model,
                              "max_tokens": max_tokens, "prompts": len(prompts), "levels": []}
    for level in levels(concurrency):
        level_dir = out_dir / "aiperf" / f"c{level.concurrency}"
        shutil.rmtree(level_dir, ignore_errors=True)
        cmd = command(aiperf, base_url=base_url, model=model, tokenizer=tokenizer, prompts_file=prompts_file,
                      level=level, max_tokens=max_tokens, out_dir=level_dir)
        row = run_level(cmd, level_dir, level, timeout_s)
        report["levels"].append(row)
        if progress is not None:
            progress.log(f"aiperf: concurrency {level.concurrency}: {row['throughput_tokens_per_s']:.1f} tokens/s, "
                         f"TTFT p50 {row['ttft_ms_p50']:.0f} ms, ITL p50 {row['itl_ms_p50']:.1f} ms, "
                         f"{row['errors']} errors")
    return report

