"""Acceptance length (tau) of a draft, measured with the project's runtime on held-out prompts.

tau = tokens emitted per decode-step target forward (accepted draft tokens + the target's own
token), pooled over all prompts, greedy target, at the recipe's max_draft_len. The prompts are
made like `trtbuild bench`'s (trtbuild.core.data.chat.record_prompt_ids): the first `prompt_len`
tokens of held-out records, BOS included, as a request starts; windows cut from the middle of
a BOS-less stream measured a different draft (0.6-0.9 higher tau than the bench, see
bench/RESULTS.md). Generation does not stop at EOS so every prompt contributes the same number
of tokens.
The runtime computes the first draft layer as TRT-LLM does (`first_norm="standard"`), which is
also what our training computes (trtbuild.draft.model).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.data.chat import chat_prompt_ids, record_prompt_ids
from trtbuild.core.data.sources import TextSource, load_records
from trtbuild.core.errors import UserError
from trtbuild.draft.config import DraftConfig
from trtbuild.draft.draft_data import generation_model
from trtbuild.runtime.stats import acceptance_rates

if TYPE_CHECKING:
    from trtbuild.core.stage_api import StageContext
    from trtbuild.draft.config import DraftEval

FIRST_NORM = "standard"
# The requests a chat target writes for its draft's evaluation are drawn under a seed of their own
# (training's are drawn under `draft.seed`).
EVAL_REQUEST_SEED = 1_000_000_007
TARGET_WRITTEN = "chat requests the target wrote (draft.eval.dataset unset)"  # eval_prompts' origin for them


def heldout_prompts(target_dir: Path, settings: DraftEval, base_dir: Path | None,
                    request_seed: int = EVAL_REQUEST_SEED) -> list[list[int]]:
    """The prompts of `eval_prompts`, without saying where they came from."""
    return eval_prompts(target_dir, settings, base_dir, request_seed)[0]


def eval_prompts(target_dir: Path, settings: DraftEval, base_dir: Path | None,
                 request_seed: int = EVAL_REQUEST_SEED) -> tuple[list[list[int]], str]:
    """`settings.prompts` token-id prompts, made as the bench makes them, and where they came from
    (reported with tau): record starts of the eval split, or, for chat records, the request rendered
    with the chat template exactly as the served OpenAI endpoint renders it (trtbuild.core.data.chat;
    short prompts allowed). Without a dataset: the target's own requests when it has a chat template
    (`target_written_prompts`, drawn under `request_seed`: another seed, another held-out set), else pydoc."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    if settings.dataset is not None:
        source, origin = settings.dataset, settings.dataset.describe()
    elif getattr(tokenizer, "chat_template", None):
        return target_written_prompts(target_dir, tokenizer, settings.prompts, request_seed), TARGET_WRITTEN
    else:
        source, origin = TextSource(kind="pydoc"), "pydoc (draft.eval.dataset unset, the target has no chat template)"
    records = load_records(source, "eval", base_dir=base_dir)
    prompts = record_prompt_ids(tokenizer, records, settings.prompts, settings.prompt_len)
    if not prompts:
        raise UserError(f"no record of the evaluation text has {settings.prompt_len} tokens",
                        field="draft.eval.prompt_len", fix="lower draft.eval.prompt_len")
    return prompts, origin


def target_written_prompts(target_dir: Path, tokenizer: Any, count: int,
                           seed: int = EVAL_REQUEST_SEED) -> list[list[int]]:
    """`count` chat requests the target writes itself (trtbuild.draft.requests, the training's
    Magpie sampling under a seed of its own, as long as training's by default), rendered as the
    served endpoint renders them. A chat model's draft is measured on requests like the ones it
    will serve, without a dataset; pydoc's raw paragraphs are text such a model is never sent."""
    from trtbuild.draft.requests import synthesize

    max_tokens = DraftConfig.model_fields["synthetic_request_tokens"].default
    requests = synthesize(generation_model(target_dir), tokenizer, count, seed, max_tokens)
    if not requests:
        raise UserError("the target wrote no evaluation request", field="draft.eval.dataset",
                        fix="give held-out prompts in draft.eval.dataset")
    return [chat_prompt_ids(tokenizer, [{"role": "user", "content": r}]) for r in requests]


def measure_tau(target_dir: Path, draft_dir: Path | None, prompts: Any, new_tokens: int, max_draft_len: int,
                mode: str = "chain", progress: Any = None, max_matching_ngram_size: int = 2) -> dict[str, Any]:
    """Speculative greedy decoding of every prompt with the EAGLE-3 draft in `draft_dir`, or with
    n-gram prompt lookup when it is None; pooled acceptance statistics."""
    from trtbuild.runtime import Generator, SpecParams, load_draft, load_target

    target = load_target(Path(target_dir))
    if draft_dir is None:
        generator = Generator(target)
        spec = SpecParams(max_draft_len=max_draft_len, method="ngram", max_matching_ngram_size=max_matching_ngram_size)
        mode = "ngram"
    else:
        generator = Generator(target, load_draft(Path(draft_dir), target, first_norm=FIRST_NORM))
        spec = SpecParams(max_draft_len=max_draft_len, mode=mode)  # type: ignore[arg-type]
    accepted: list[int] = []
    tokens, seconds = 0, 0.0
    rows = [row for row in prompts]
    iterator = progress.track(rows, "draft: acceptance on held-out text") if progress is not None else rows
    for prompt in iterator:
        run = generator.generate(prompt, new_tokens, spec=spec, eos_token_ids=[])
        accepted.extend(run.stats.accepted)
        tokens += run.stats.new_tokens
        seconds += run.stats.total_s
    steps = len(accepted)
    return {
        "acceptance_length": round(1.0 + sum(accepted) / steps, 4) if steps else 1.0,
        "acceptance_rates": [round(r, 4) for r in acceptance_rates(accepted, max_draft_len)],
        "eval_mode": mode,
        "eval_prompts": len(rows),
        "eval_new_tokens": tokens,
        "eval_decode_steps": steps,
        "eval_seconds": round(seconds, 2),
    }


def evaluate_draft(target_dir: Path, draft_dir: Path | None, settings: DraftEval, max_draft_len: int,
                   ctx: StageContext, max_matching_ngram_size: int = 2) -> dict[str, Any]:
    prompts, origin = eval_prompts(target_dir, settings, ctx.recipe.base_dir)
    return {"eval_prompts_from": origin} | measure_tau(target_dir, draft_dir, prompts, settings.new_tokens, max_draft_len,
                                 settings.mode, ctx.progress, max_matching_ngram_size)
