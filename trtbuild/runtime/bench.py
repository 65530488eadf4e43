"""`trtbuild bench`: plain vs speculative decoding on the same prompts, side by side, one process.

The CPU is shared and noisy, so each prompt runs plain then speculative back to back and the
figures that matter are the ratios (speedup, tau). Writes JSON and a PNG next to each other.
This module is imported by the recipe schema for `BenchConfig`: torch is imported lazily.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from trtbuild.errors import UserError
from trtbuild.progress import Progress
from trtbuild.stages.base import StageConfig


class BenchConfig(StageConfig):
    """The recipe's `bench:` section."""

    prompts: str = Field("pydoc-heldout", description="'pydoc-heldout', or a .txt (paragraphs "
                         "separated by blank lines) / .jsonl ({\"prompt\": ...}) file")
    num_prompts: int = Field(8, ge=1, le=10**5, description="prompts decoded by each mode")
    prompt_len: int = Field(64, ge=1, le=1 << 20, description="prompt tokens (longer prompts are truncated)")
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


def load_prompts(source: str, tokenizer_dir: Path, count: int, length: int) -> list[list[int]]:
    """Token-id prompts of exactly `length` tokens (texts too short are skipped)."""
    texts = _prompt_texts(source)
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot load a tokenizer from the target directory ({exc.__class__.__name__})",
                        file=str(tokenizer_dir), fix="bench needs the tokenizer files next to the model"
                        ) from None
    usable = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
        if len(ids) >= length:
            usable.append(ids[:length])
    if not usable:
        raise UserError(f"no prompt in {source!r} has {length} tokens", field="bench.prompt_len",
                        fix="lower bench.prompt_len")
    step = max(len(usable) // count, 1)
    return [usable[i * step] for i in range(min(count, len(usable)))]


def _prompt_texts(source: str) -> list[str]:
    if source == "pydoc-heldout":
        from trtbuild.data import pydoc_corpus

        return list(pydoc_corpus.split()[1])
    path = Path(source)
    if not path.is_file():
        raise UserError("prompt file not found", file=source, field="bench.prompts",
                        fix="use 'pydoc-heldout' or a .txt/.jsonl file")
    if path.suffix == ".jsonl":
        texts = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                texts.append(str(json.loads(line)["prompt"]))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise UserError("each line must be a JSON object with a 'prompt'", file=source,
                                line=number, field="bench.prompts") from None
        return texts
    return [p for p in path.read_text().split("\n\n") if p.strip()]


def run_bench(target_dir: Path, draft_dir: Path, prompts: list[list[int]] | None, cfg: BenchConfig, *,
              out_path: Path | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Runs plain and speculative decoding on each prompt; returns (and writes) the figures.

    prompts: token-id lists, or None to read `cfg.prompts` with the target's tokenizer.
    out_path: where the JSON goes; the plot is written next to it (same stem, .png).
    """
    import torch

    from trtbuild.runtime.draft import load_draft
    from trtbuild.runtime.generate import Generator, SpecParams
    from trtbuild.runtime.sampling import SamplingParams
    from trtbuild.runtime.stats import DecodeStats, acceptance_rates
    from trtbuild.runtime.target import load_target

    progress = progress or Progress()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    if prompts is None:
        prompts = load_prompts(cfg.prompts, target_dir, cfg.num_prompts, cfg.prompt_len)
    target = load_target(target_dir)
    draft = load_draft(draft_dir, target, first_norm=cfg.draft_norm)
    generator = Generator(target, draft)
    spec = SpecParams(max_draft_len=cfg.max_draft_len, mode="chain" if cfg.tree == "chain" else "tree",
                      topk=cfg.topk, max_total_draft_tokens=cfg.max_total_draft_tokens,
                      min_draft_prob=cfg.min_draft_prob)
    sampling = SamplingParams(temperature=cfg.temperature, seed=cfg.seed)
    eos: list[int] = []  # fixed-length outputs: both modes decode exactly max_new_tokens

    def run(prompt: list[int], speculative: bool) -> tuple[list[int], DecodeStats]:
        result = generator.generate(prompt, cfg.max_new_tokens, sampling=sampling,
                                    spec=spec if speculative else None, eos_token_ids=eos)
        return result.tokens, result.stats

    for i in range(cfg.warmup):
        run(prompts[i % len(prompts)], False)
        run(prompts[i % len(prompts)], True)
    plain_stats: list[DecodeStats] = []
    spec_stats: list[DecodeStats] = []
    identical = True
    with progress.task("bench: plain vs speculative", len(prompts)) as bar:
        for prompt in prompts:
            plain_tokens, ps = run(prompt, False)
            spec_tokens, ss = run(prompt, True)
            identical &= plain_tokens == spec_tokens
            plain_stats.append(ps)
            spec_stats.append(ss)
            bar.advance(1, tau=ss.acceptance_length)

    def rate(stats: list[DecodeStats]) -> float:
        tokens = sum(s.new_tokens - 1 for s in stats)
        seconds = sum(s.decode_s for s in stats)
        return tokens / seconds if seconds > 0 else 0.0

    accepted = [a for s in spec_stats for a in s.accepted]
    plain_tps, spec_tps = rate(plain_stats), rate(spec_stats)
    spec_total = sum(s.decode_s for s in spec_stats)
    draft_s = sum(s.draft_s for s in spec_stats)
    verify_s = sum(s.target_s for s in spec_stats)
    ttft = [s.ttft_s for s in spec_stats]
    report: dict[str, Any] = {
        "target": str(target_dir),
        "draft": str(draft_dir),
        "target_fp8": target.is_fp8,
        "threads": torch.get_num_threads(),
        "prompts": len(prompts),
        "config": cfg.model_dump(),
        "plain": {
            "tokens_per_s_per_user": plain_tps,
            "ttft_s": _mean([s.ttft_s for s in plain_stats]),
            "new_tokens": sum(s.new_tokens for s in plain_stats),
            "ms_per_target_forward": 1e3 * _mean([s.target_s / max(s.target_forwards, 1)
                                                  for s in plain_stats]),
        },
        "speculative": {
            "tokens_per_s_per_user": spec_tps,
            "acceptance_length": 1.0 + sum(accepted) / len(accepted) if accepted else 1.0,
            "acceptance_rate_per_position": acceptance_rates(accepted, cfg.max_draft_len),
            "tokens_per_step_histogram": {str(k + 1): v for k, v in sorted(Counter(accepted).items())},
            "ttft_s": _mean(ttft),
            "new_tokens": sum(s.new_tokens for s in spec_stats),
            "steps": len(accepted),
            "profile": {
                "draft_s": draft_s,
                "target_s": verify_s,
                "other_s": max(sum(s.total_s for s in spec_stats) - draft_s - verify_s, 0.0),
                "decode_s": spec_total,
                "ms_per_step_draft": 1e3 * draft_s / max(len(accepted), 1),
                "ms_per_step_target": 1e3 * verify_s / max(len(accepted), 1),
            },
        },
        "speedup": spec_tps / plain_tps if plain_tps > 0 else 0.0,
        "outputs_identical": identical,
    }
    if out_path is not None:
        out_path = Path(out_path)
        plot_path = out_path.with_suffix(".png")
        write_plot(report, accepted, plot_path)
        report["plot"] = str(plot_path)
        _write_atomic(out_path, json.dumps(report, indent=2) + "\n")
    return report


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


def write_plot(report: dict[str, Any], accepted: list[int], path: Path) -> None:
    """Left: histogram of tokens emitted per target forward (tau); right: tokens/s/user bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    depth = report["config"]["max_draft_len"]
    counts = Counter(a + 1 for a in accepted)
    xs = list(range(1, depth + 2))
    left.bar(xs, [counts.get(x, 0) for x in xs], color="tab:blue")
    tau = report["speculative"]["acceptance_length"]
    left.axvline(tau, color="tab:red", linestyle="--", label=f"tau = {tau:.2f}")
    left.set_xlabel("tokens emitted per target forward")
    left.set_ylabel("decode steps")
    left.set_title("EAGLE-3 acceptance")
    left.legend()
    values = [report["plain"]["tokens_per_s_per_user"], report["speculative"]["tokens_per_s_per_user"]]
    right.bar(["plain", "speculative"], values, color=["tab:gray", "tab:green"])
    right.set_ylabel("tokens/s/user")
    right.set_title(f"speedup {report['speedup']:.2f}x, identical: {report['outputs_identical']}")
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
