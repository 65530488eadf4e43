"""The draft's data step: the training pool (text windows and the target's own responses) as a shard set.

Its own cache entry (`<cache>/draft-data/<key>/`, trtbuild/draft/shards.py), keyed by the target
artifact, the dataset and the fields that shape the pool (samples, seq_len, distill_fraction,
prompt_len, seed, shard_samples), never by a training setting: a build with another lr or step count
reuses it. Shard i holds pool rows [i*S, (i+1)*S); a killed run keeps its finished shards.

Who generates: on CPU the target in float32 through transformers (greedy with a KV cache, as the
pool was made before); on a GPU host TensorRT-LLM's LLM API when it is importable (greedy: top_k 1,
ignore_eos, tensorrt_llm/sampling_params.py@000a01de66f0eab4ab05640711f0253f50f5209c), else the
target in bfloat16 on CUDA through transformers. The GPU paths are written but not run here (no GPU).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.code_version import code_version
from trtbuild.core.data.chat import chat_prompt_ids, request_messages
from trtbuild.core.data.sources import fingerprint, joiner, load_records, load_texts
from trtbuild.core.layout import DRAFT_DATA
from trtbuild.draft import shards
from trtbuild.draft.shards import ShardSet

if TYPE_CHECKING:
    import torch

    from trtbuild.core.progress import Progress
    from trtbuild.draft.data import Generate

# The DraftConfig fields that shape the pool (everything else, lr and steps included, does not). The
# config is typed Any here: importing DraftConfig would put all of config.py in the data's key.
DATA_FIELDS = ("dataset", "samples", "seq_len", "distill_fraction", "prompt_len", "seed", "shard_samples",
               "synthetic_requests", "synthetic_request_tokens")
REQUESTS_FILE = "synthetic_requests.json"  # in the resume dir: a resumed run answers the same requests
REQUESTS_PROGRESS = "synthetic_requests.partial.json"  # the requests of a killed run, batch by batch


def data_key(config: Any, target_key: str, dataset_fingerprint: Any) -> str:
    fields = config.model_dump(mode="json", include=set(DATA_FIELDS))
    material = [fields, target_key, dataset_fingerprint, code_version(__name__)]
    return hashlib.sha256(json.dumps(material, sort_keys=True, default=str).encode()).hexdigest()[:24]


def ensure_data(config: Any, target_dir: Path, target_key: str, base_dir: Path | None,
                progress: Progress) -> ShardSet:
    """The pool's shard set: from the cache, or made now (resuming a killed run's shards)."""
    key = data_key(config, target_key, fingerprint(config.dataset, base_dir=base_dir))
    if (found := shards.reuse(DRAFT_DATA, key)) is not None:
        return ShardSet(found, key, reused=True, computed=0, kept=0, seconds=0.0)
    count = shards.shard_count(config.samples, config.shard_samples)  # the pool has `samples` rows

    def write(work: Path, todo: list[int]) -> dict[str, Any]:
        requests = synthetic_requests(config, target_dir, work, progress)
        spec = _pool_spec(config, target_dir, base_dir, requests)
        generate: Generate | None = None
        ranges = [_shard_range(i, len(spec), config.shard_samples) for i in todo]
        with progress.task("draft data: target responses", sum(stop - start for start, stop in ranges)) as bar:
            for index, (start, stop) in zip(todo, ranges, strict=True):
                if generate is None and stop > len(spec.windows):
                    generate = target_generator(target_dir)
                shards.write_shard(work, index, {"input_ids": _make(spec, start, stop, generate, bar)})
        return {"kind": DRAFT_DATA, "rows": len(spec), "seq_len": spec.seq_len, "shards": count,
                "shard_samples": config.shard_samples, "generated_rows": len(spec.prompts),
                "synthetic_requests": len(requests)}

    return shards.make_set(DRAFT_DATA, key, count, "draft data", progress, write)


def _make(spec: Any, start: int, stop: int, generate: Generate | None, bar: Any) -> torch.Tensor:
    from trtbuild.draft.data import DataPlan, make_rows

    return make_rows(spec, start, stop, generate, DataPlan.gen_batch, lambda n: bar.advance(n))


def _shard_range(index: int, rows: int, shard_rows: int) -> tuple[int, int]:
    return index * shard_rows, min(rows, (index + 1) * shard_rows)


def synthetic_requests(config: Any, target_dir: Path, work: Path, progress: Progress) -> list[str]:
    """The requests the target writes itself (trtbuild.draft.requests), kept in the resume dir."""
    import os

    if not config.synthetic_requests:
        return []
    saved = work / REQUESTS_FILE
    if saved.is_file():
        return list(json.loads(saved.read_text()))
    from transformers import AutoTokenizer

    from trtbuild.draft.requests import synthesize

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    model = generation_model(target_dir)
    with progress.task("draft data: requests written by the target", config.synthetic_requests) as bar:
        requests = synthesize(model, tokenizer, config.synthetic_requests, config.seed,
                              config.synthetic_request_tokens, lambda n: bar.advance(n),
                              progress_file=work / REQUESTS_PROGRESS)
    tmp = saved.with_name(f".{saved.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(requests))
    os.replace(tmp, saved)
    (work / REQUESTS_PROGRESS).unlink(missing_ok=True)
    return requests


def generation_model(target_dir: Path) -> Any:
    """The target through transformers: bfloat16 on CUDA when there is a GPU, float32 on the CPU."""
    import torch

    from trtbuild.draft.data import load_target

    if torch.cuda.is_available():
        return load_target(target_dir, dtype=torch.bfloat16).to("cuda")
    return load_target(target_dir)


def _pool_spec(config: Any, target_dir: Path, base_dir: Path | None, synthetic: list[str] | None = None) -> Any:
    from transformers import AutoTokenizer

    from trtbuild.draft.data import DataPlan, pool_spec

    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    texts = load_texts(config.dataset, "train", tokenizer=tokenizer, base_dir=base_dir)
    plan = DataPlan(samples=config.samples, seq_len=config.seq_len, distill_fraction=config.distill_fraction,
                    prompt_len=config.prompt_len, seed=config.seed,
                    separator=joiner(config.dataset, base_dir),
                    chat_prompts=chat_requests(config, tokenizer, base_dir, synthetic or []))
    return pool_spec(tokenizer, texts, plan)


def chat_requests(config: Any, tokenizer: Any, base_dir: Path | None, synthetic: list[str]) -> list[list[int]] | None:
    """The chat records of the training source and the synthetic requests, as served requests (None
    when there are neither: a text source)."""
    chats = [r for r in load_records(config.dataset, "train", base_dir=base_dir) if isinstance(r, list)]
    chats += [[{"role": "user", "content": text}] for text in synthetic]
    return [chat_prompt_ids(tokenizer, request_messages(c)) for c in chats] or None


def load_pool(entry: Path) -> torch.Tensor:
    """The whole pool [rows, seq_len] (token ids: small next to the hidden states)."""
    import torch
    from safetensors.torch import load_file

    count = shards.read_meta(entry)["shards"]
    return torch.cat([load_file(str(entry / shards.shard_name(i)))["input_ids"] for i in range(count)])


def target_generator(target_dir: Path) -> Generate:
    """Greedy continuation by the target: TensorRT-LLM or transformers on CUDA, transformers on CPU."""
    import torch

    from trtbuild.draft.data import greedy_fill

    if torch.cuda.is_available():
        llm = _trtllm_generator(target_dir)
        if llm is not None:
            return llm
    model = generation_model(target_dir)
    return lambda prompts, seq_len: greedy_fill(model, prompts, seq_len)


def _trtllm_generator(target_dir: Path) -> Generate | None:
    """TensorRT-LLM's LLM API (PyTorch backend) when importable; token ids in, token ids out, one
    SamplingParams per prompt. `LLM.generate` takes a list of prompts and a *list* of SamplingParams,
    the i-th for the i-th prompt (`_item_at` checks isinstance(..., list)): tensorrt_llm/llmapi/llm.py
    @4c05a74891e4 (the main snapshot the 1.1.0 contract reads `serve` from) and @00966934 (older)."""
    try:
        from tensorrt_llm import LLM, SamplingParams
    except ImportError:
        return None
    import torch

    llm = LLM(model=str(target_dir))

    def generate(prompts: list[list[int]], seq_len: int) -> torch.Tensor:
        params = [SamplingParams(max_tokens=seq_len - len(p), top_k=1, ignore_eos=True) for p in prompts]
        outputs = llm.generate(prompts, params)
        rows = []
        for prompt, output in zip(prompts, outputs, strict=True):
            new = seq_len - len(prompt)
            tokens = list(output.outputs[0].token_ids)
            if len(tokens) < new:
                raise RuntimeError(f"TensorRT-LLM returned {len(tokens)} of {new} tokens (max_seq_len too small?)")
            rows.append(prompt + tokens[:new])
        return torch.tensor(rows, dtype=torch.long)

    return generate
