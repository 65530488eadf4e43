"""Small real targets for the draft tests: a BPE tokenizer trained here and a random Llama."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch

VOCAB = 384


@functools.cache
def _tokenizer_json(vocab_size: int, corpus_chars: int) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from trtbuild.core.data.pydoc_corpus import train_text

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator([train_text()[:corpus_chars]], trainer)
    return tokenizer.to_str()


def write_tokenizer(directory: Path, vocab_size: int = VOCAB, corpus_chars: int = 200_000) -> None:
    from transformers import PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "raw_tokenizer.json").write_text(_tokenizer_json(vocab_size, corpus_chars))
    fast = PreTrainedTokenizerFast(tokenizer_file=str(directory / "raw_tokenizer.json"), unk_token="<unk>",
                                   bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(directory))
    (directory / "raw_tokenizer.json").unlink()


def llama_config(**overrides: Any) -> Any:
    from transformers import LlamaConfig

    values = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                  bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    values.update(overrides)
    return LlamaConfig(**values)


def write_target(directory: Path, seed: int = 0, **overrides: Any) -> Path:
    """A random Llama with real weights and tokenizer (what the model stage's `hf/` holds)."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(**overrides))
    model.save_pretrained(str(directory), safe_serialization=True)
    write_tokenizer(directory)
    return directory


def write_target_config(directory: Path, **overrides: Any) -> Path:
    """config.json + tokenizer only: enough for the compatibility checks."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(llama_config(**overrides).to_dict()))
    write_tokenizer(directory)
    return directory


def random_eagle3(target_dir: Path, num_layers: int, draft_vocab: int) -> tuple[Any, list[int]]:
    """The target converted by ModelOpt (the draft stage's conversion) with a draft vocabulary of
    `draft_vocab` random tokens and random draft weights, norms far from 1 (so a doubled first-layer
    norm would show in the drafts). Returns (model, the draft vocabulary's target ids)."""
    from trtbuild.draft.format import default_aux_layers
    from trtbuild.draft.model import DraftArch, convert_to_eagle3, load_target
    from trtbuild.draft.vocab import d2t_table

    chosen = sorted(torch.randperm(VOCAB, generator=torch.Generator().manual_seed(1))[:draft_vocab].tolist())
    model = convert_to_eagle3(load_target(target_dir),
                              DraftArch(aux_layers=default_aux_layers(num_layers), draft_vocab_size=draft_vocab),
                              d2t_table(chosen))
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for name, param in model.eagle_module.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.5 * noise if "norm" in name else 0.3 * noise)
    return model, chosen


# Reference drafting with trtbuild's runtime (compared against ModelOpt's own pseudo_speculative_generate).
def base_token(target, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    return target.logits(ids)[:, -1:].argmax(-1)


@torch.inference_mode()
def runtime_chain(target, draft, ids: torch.Tensor, steps: int) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Chain drafting with the runtime's building blocks: aux states of the prompt -> fc -> draft steps."""
    t = ids.shape[1]
    cache = target.new_cache(1, t)
    logits, aux = target.forward(ids, cache, 0, aux_layers=draft.aux_layers)
    base = logits[:, -1:].argmax(-1)
    next_ids = torch.cat([ids[:, 1:], base], 1)
    dcache = draft.new_cache(1, t + steps)
    hidden, out = draft.project(aux), None
    tokens = []
    start = 0
    for _ in range(steps):
        out, draft_logits = draft.forward(hidden, next_ids, dcache, start)
        token = draft.to_target[draft_logits[:, -1].argmax(-1)][:, None]
        tokens.append(token)
        start += hidden.shape[1]
        hidden, next_ids = out[:, -1:], token
    return torch.cat(tokens, 1)
