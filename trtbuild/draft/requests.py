"""Chat requests the target writes itself, for a draft whose chat dataset has few of them.

Magpie (Xu et al. 2024, arXiv:2406.08464): an instruct model given its chat template up to an
open user turn writes a plausible user request. The draft learns from the target's answers, and
a pool of a few dozen distinct requests is memorised: on SmolLM2-135M-Instruct a draft trained
16 epochs on the target's answers to 40 requests predicted the first draft token 69 % of the time
on those requests and 24 % on held-out ones (bench/RESULTS.md). Requests here are sampled
(temperature 1, top-p 0.95, seeded per batch, so a resumed run writes the same ones on the same
machine) and rendered afterwards exactly as the served endpoint renders a request.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from trtbuild.core.data.chat import render_chat
from trtbuild.core.errors import UserError

MARK = "\x00TRTBUILD-REQUEST\x00"
TEMPERATURE = 1.0
TOP_P = 0.95
BATCH = 32


def user_turn_prefix(tokenizer: Any) -> list[int]:
    """Token ids of the chat template rendered up to where a user's request starts, encoded as the
    served endpoint encodes prompts (trtbuild.core.data.chat)."""
    text = render_chat(tokenizer, [{"role": "user", "content": MARK}])
    if MARK not in text:
        raise UserError("the chat template does not write the user's message", field="draft.synthetic_requests",
                        fix="set draft.synthetic_requests: 0 and give chat requests in draft.dataset")
    return list(tokenizer(text[: text.index(MARK)], add_special_tokens=True)["input_ids"])


def end_of_turn_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = list(ids) if isinstance(ids, list | tuple) else ([ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    if not getattr(tokenizer, "chat_template", None) and len(newline) == 1:
        ids.append(int(newline[0]))  # the fallback "role: content" transcript ends a turn there
    return sorted(set(ids))


@torch.no_grad()
def synthesize(model: Any, tokenizer: Any, count: int, seed: int, max_tokens: int,
               advance: Any = lambda n: None, progress_file: Path | None = None) -> list[str]:
    """`count` distinct non-empty requests (fewer only when 4x count samples gave no more).
    With `progress_file`, the requests written so far are saved after every batch and a later call
    continues from there: batches are seeded by their index, so the result is the same as one run's."""
    prefix = torch.tensor([user_turn_prefix(tokenizer)], device=model.device).expand(BATCH, -1)
    stops = end_of_turn_ids(model, tokenizer)
    first, requests = _resume(progress_file)
    seen: set[str] = set(requests)
    advance(len(requests))
    for batch in range(first, -(-4 * count // BATCH)):
        if len(requests) >= count:
            break
        torch.manual_seed(seed * 1_000_003 + batch)
        out = model.generate(prefix, do_sample=True, temperature=TEMPERATURE, top_p=TOP_P, top_k=0,
                             max_new_tokens=max_tokens, eos_token_id=stops, pad_token_id=stops[0],
                             attention_mask=torch.ones_like(prefix))
        for row in out[:, prefix.shape[1]:].tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), len(row))
            text = tokenizer.decode(row[:cut], skip_special_tokens=True).strip()
            if text and text not in seen and len(requests) < count:
                seen.add(text)
                requests.append(text)
                advance(1)
        if progress_file is not None:
            _save(progress_file, batch + 1, requests)
    return requests


def _resume(progress_file: Path | None) -> tuple[int, list[str]]:
    """(next batch index, requests so far) from a killed run's progress file, or (0, [])."""
    if progress_file is None or not progress_file.is_file():
        return 0, []
    saved = json.loads(progress_file.read_text())
    return int(saved["next_batch"]), [str(r) for r in saved["requests"]]


def _save(progress_file: Path, next_batch: int, requests: list[str]) -> None:
    tmp = progress_file.with_name(f".{progress_file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"next_batch": next_batch, "requests": requests}))
    os.replace(tmp, progress_file)  # present means complete: a kill mid-write keeps the last batch's
