"""`trtbuild bench`: plain, EAGLE-3 and n-gram decoding on the same prompts, side by side, one process.

The CPU is shared and noisy, so each prompt runs every mode back to back and the figures that
matter are the ratios (speedup, tau). Writes JSON and a PNG next to each other. The report keeps
`speculative` / `speedup` for the EAGLE-3 draft and adds `ngram` (prompt lookup at the same
max_draft_len) and `tau_ratio_eagle3_vs_ngram`. This module is imported by the recipe schema for
`BenchConfig`: torch is imported lazily.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trtbuild.core.data import pydoc_corpus
from trtbuild.core.data.chat import record_prompt_ids, request_messages
from trtbuild.core.data.sources import _record
from trtbuild.core.errors import UserError
from trtbuild.core.progress import Progress
from trtbuild.core.stage_api import StageConfig
from trtbuild.runtime.stats import DecodeStats, acceptance_rates


class BenchConfig(StageConfig):
    """The recipe's `bench:` section."""

    prompts: str = Field("pydoc-heldout", description="'pydoc-heldout', or a .txt (paragraphs "
                         "separated by blank lines) / .jsonl ({\"prompt\": ...} or chat {\"messages\": "
                         "[...]}, rendered with the chat template as the served endpoint does) file; "
                         "relative to the recipe's directory")
    num_prompts: int = Field(8, ge=1, le=10**5, description="prompts decoded by each mode")
    prompt_len: int = Field(64, ge=1, le=1 << 20, description="prompt tokens of text prompts (longer ones "
                            "are truncated, shorter skipped); chat prompts are used whole")
    max_new_tokens: int = Field(128, ge=2, le=1 << 20, description="tokens generated per prompt (no early stop)")
    max_draft_len: int = Field(5, ge=1, le=16, description="draft depth (tokens drafted per step in a chain)")
    tree: Literal["chain", "dynamic"] = Field("dynamic", description="chain drafting or a dynamic top-k tree")
    topk: int = Field(4, ge=1, le=64, description="dynamic tree: children per expanded node")
    max_total_draft_tokens: int = Field(16, ge=1, le=1024, description="dynamic tree: tokens verified per step")
    min_draft_prob: float = Field(0.0, ge=0.0, le=1.0, description="chain: stop drafting when the "
                                  "draft's probability of its next token is below this (0: never)")
    warmup: int = Field(1, ge=0, le=100, description="untimed runs of each mode first")
    threads: int | None = Field(None, ge=1, le=1024, description="torch threads (default: torch's own)")
    temperature: float = Field(0.0, ge=0.0, le=100, description="0 = greedy (outputs must then be identical)")
    draft_norm: Literal["standard", "modelopt"] = Field(
        "standard", description="EAGLE-3 first-layer hidden norm: TRT-LLM's (what the draft stage "
        "trains), or stock ModelOpt's doubled norm")
    seed: int = Field(0, ge=0, le=2**63 - 1, description="sampling seed (temperature > 0)")
    ngram: bool = Field(True, description="also decode with prompt lookup (n-gram speculation, no draft "
                        "model) at the same max_draft_len, side by side")
    max_matching_ngram_size: int = Field(2, ge=1, le=64, description="n-gram: longest context suffix "
                                         "looked up (TRT-LLM's max_matching_ngram_size)")


def load_prompts(source: str, tokenizer_dir: Path, count: int, length: int,
                 base_dir: Path | None = None) -> list[list[int]]:
    """Token-id prompts: text records cut to exactly `length` tokens (shorter ones skipped); chat
    records ({"messages": [...]}) rendered with the target's chat template as the served OpenAI
    endpoint renders them (trtbuild.core.data.chat), whatever their length. Relative paths start at
    `base_dir` (the recipe's directory)."""
    records = _prompt_records(source, base_dir)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a tokenizer from the target directory ({exc.__class__.__name__})",
                        file=str(tokenizer_dir), fix="bench needs the tokenizer files next to the model"
                        ) from None
    usable = record_prompt_ids(tokenizer, records, count, length)
    if not usable:
        raise UserError(f"no prompt in {source!r} has {length} tokens", field="bench.prompt_len",
                        fix="lower bench.prompt_len")
    return usable


def record_prompts(tokenizer: Any, texts: list[str], count: int, length: int) -> list[list[int]]:
    """The first `length` tokens of `count` texts, evenly spaced over those long enough, encoded as
    the tokenizer encodes a prompt (BOS included): how requests start."""
    return record_prompt_ids(tokenizer, list(texts), count, length)


def chat_requests(source: str, base_dir: Path | None = None) -> list[list[dict[str, str]]]:
    """The chat records of a bench prompt source as requests (the turns before a recorded answer):
    what `demo` sends a chat model. Empty for text sources."""
    return [request_messages(r) for r in _prompt_records(source, base_dir) if isinstance(r, list)]


def _prompt_records(source: str, base_dir: Path | None = None) -> list[Any]:
    """Texts (str) and chats (lists of messages) of a bench prompt source."""
    if source == "pydoc-heldout":
        return list(pydoc_corpus.split()[1])
    path = Path(source).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise UserError("prompt file not found", file=str(path), field="bench.prompts",
                        fix="use 'pydoc-heldout' or a .txt/.jsonl file (relative to the recipe's directory)")
    if path.suffix == ".jsonl":
        records: list[Any] = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise UserError("each line must be a JSON object with a 'prompt' or 'messages'", file=str(path),
                                line=number, field="bench.prompts") from None
            if isinstance(obj, dict) and "prompt" in obj:
                records.append(str(obj["prompt"]))
            else:
                records.append(_record(obj, None, where=(str(path), number)))
        return records
    return [p for p in path.read_text().split("\n\n") if p.strip()]


def run_bench(target_dir: Path, draft_dir: Path | None, prompts: list[list[int]] | None, cfg: BenchConfig, *,
              out_path: Path | None = None, progress: Progress | None = None,
              base_dir: Path | None = None) -> dict[str, Any]:
    """Decodes each prompt plain, with the EAGLE-3 draft and with n-gram lookup, back to back.

    Every mode runs the same target (same dtype, same kernels); only the drafting differs.
    draft_dir: the EAGLE-3 draft, or None to compare plain and n-gram decoding only.
    prompts: token-id lists, or None to read `cfg.prompts` with the target's tokenizer.
    out_path: where the JSON goes; the plot is written next to it (same stem, .png).
    """
    import torch

    from trtbuild.runtime.draft import load_draft
    from trtbuild.runtime.generate import Generator, SpecParams
    from trtbuild.runtime.sampling import SamplingParams
    from trtbuild.runtime.target import load_target

    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target_dir = Path(target_dir)
    if prompts is None:
        prompts = load_prompts(cfg.prompts, target_dir, cfg.num_prompts, cfg.prompt_len, base_dir)
    target = load_target(target_dir)
    draft = load_draft(Path(draft_dir), target, first_norm=cfg.draft_norm) if draft_dir is not None else None
    generator = Generator(target, draft)
    modes: dict[str, SpecParams | None] = {"plain": None}
    if draft is not None:
        modes["speculative"] = SpecParams(max_draft_len=cfg.max_draft_len,
                                          mode="chain" if cfg.tree == "chain" else "tree", topk=cfg.topk,
                                          max_total_draft_tokens=cfg.max_total_draft_tokens,
                                          min_draft_prob=cfg.min_draft_prob)
    if cfg.ngram:
        modes["ngram"] = SpecParams(max_draft_len=cfg.max_draft_len, method="ngram",
                                    max_matching_ngram_size=cfg.max_matching_ngram_size)
    if len(modes) == 1:
        raise UserError("bench has nothing to compare plain decoding with: no draft and bench.ngram is false",
                        field="bench.ngram", fix="set bench.ngram: true or give the recipe a draft")
    sampling = SamplingParams(temperature=cfg.temperature, seed=cfg.seed)
    eos: list[int] = []  # fixed-length outputs: every mode decodes exactly max_new_tokens

    def run(prompt: list[int], spec: SpecParams | None) -> tuple[list[int], DecodeStats]:
        result = generator.generate(prompt, cfg.max_new_tokens, sampling=sampling, spec=spec, eos_token_ids=eos)
        return result.tokens, result.stats

    for i in range(cfg.warmup):
        for spec in modes.values():
            run(prompts[i % len(prompts)], spec)
    stats: dict[str, list[DecodeStats]] = {name: [] for name in modes}
    identical = True
    with progress.task("bench: " + " vs ".join(modes), len(prompts)) as bar:
        for prompt in prompts:
            reference = None
            for name, spec in modes.items():  # back to back: the same load drift hits every mode
                tokens, stat = run(prompt, spec)
                reference = tokens if reference is None else reference
                identical &= tokens == reference
                stats[name].append(stat)
            bar.advance(1, tau=stats[next(reversed(modes))][-1].acceptance_length)

    plain = stats["plain"]
    report: dict[str, Any] = {
        "target": str(target_dir),
        "draft": str(draft_dir) if draft_dir is not None else None,
        "target_fp8": target.is_fp8,
        "target_quant_algo": target.quant.quant_algo,
        "target_dtype": str(target.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "config": cfg.model_dump(),
        "plain": {
            "tokens_per_s_per_user": _rate(plain),
            "ttft_s": _mean([s.ttft_s for s in plain]),
            "new_tokens": sum(s.new_tokens for s in plain),
            "ms_per_target_forward": 1e3 * _mean([s.target_s / max(s.target_forwards, 1) for s in plain]),
        },
    }
    for name in modes:
        if name != "plain":
            report[name] = _speculative_figures(stats[name], cfg.max_draft_len)
            report[name]["speedup"] = _ratio(report[name]["tokens_per_s_per_user"], _rate(plain))
    if "speculative" in report:
        report["speedup"] = report["speculative"]["speedup"]
    if "speculative" in report and "ngram" in report:
        report["tau_ratio_eagle3_vs_ngram"] = _ratio(report["speculative"]["acceptance_length"],
                                                     report["ngram"]["acceptance_length"])
    report["outputs_identical"] = identical
    if out_path is not None:
        out_path = Path(out_path)
        plot_path = out_path.with_suffix(".png")
        write_plot(report, stats, plot_path)
        report["plot"] = str(plot_path)
        _write_atomic(out_path, json.dumps(report, indent=2) + "\n")
    return report


def _rate(stats: list[Any]) -> float:
    """tokens/s/user after the first token, pooled over prompts."""
    tokens = sum(s.new_tokens - 1 for s in stats)
    seconds = sum(s.decode_s for s in stats)
    return tokens / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def _speculative_figures(stats: list[Any], max_draft_len: int) -> dict[str, Any]:
    accepted = [a for s in stats for a in s.accepted]
    draft_s = sum(s.draft_s for s in stats)
    verify_s = sum(s.target_s for s in stats)
    steps = max(len(accepted), 1)
    return {
        "tokens_per_s_per_user": _rate(stats),
        "acceptance_length": 1.0 + sum(accepted) / len(accepted) if accepted else 1.0,
        "acceptance_rate_per_position": acceptance_rates(accepted, max_draft_len),
        "tokens_per_step_histogram": {str(k + 1): v for k, v in sorted(Counter(accepted).items())},
        "ttft_s": _mean([s.ttft_s for s in stats]),
        "new_tokens": sum(s.new_tokens for s in stats),
        "steps": len(accepted),
        "profile": {
            "draft_s": draft_s,
            "target_s": verify_s,
            "other_s": max(sum(s.total_s for s in stats) - draft_s - verify_s, 0.0),
            "decode_s": sum(s.decode_s for s in stats),
            "ms_per_step_draft": 1e3 * draft_s / steps,
            "ms_per_step_target": 1e3 * verify_s / steps,
        },
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_plot(report: dict[str, Any], stats: dict[str, list[Any]], path: Path) -> None:
    """Left: tokens emitted per target forward, per speculative mode; right: tokens/s/user bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    depth = report["config"]["max_draft_len"]
    xs = list(range(1, depth + 2))
    spec_modes = [m for m in stats if m != "plain"]
    width = 0.8 / max(len(spec_modes), 1)
    for i, mode in enumerate(spec_modes):
        counts = Counter(a + 1 for s in stats[mode] for a in s.accepted)
        tau = report[mode]["acceptance_length"]
        left.bar([x + (i - (len(spec_modes) - 1) / 2) * width for x in xs], [counts.get(x, 0) for x in xs],
                 width=width, color=_COLORS[mode], label=f"{_LABELS[mode]}: tau = {tau:.2f}")
    left.set_xlabel("tokens emitted per target forward")
    left.set_ylabel("decode steps")
    left.set_title("acceptance")
    left.legend()
    names = ["plain", *spec_modes]
    right.bar([_LABELS[m] for m in names], [report[m]["tokens_per_s_per_user"] for m in names],
              color=[_COLORS[m] for m in names])
    right.set_ylabel("tokens/s/user")
    speedups = ", ".join(f"{_LABELS[m]} {report[m]['speedup']:.2f}x" for m in spec_modes)
    right.set_title(f"{speedups}; identical: {report['outputs_identical']}", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=100)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    finally:
        plt.close(fig)


_LABELS = {"plain": "plain", "speculative": "EAGLE-3", "ngram": "n-gram"}
_COLORS = {"plain": "tab:gray", "speculative": "tab:green", "ngram": "tab:orange"}
