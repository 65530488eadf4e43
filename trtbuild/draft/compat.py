"""Refuse an EAGLE-3 draft that does not fit its target, before any expensive work.

Only config.json files, safetensors headers, tokenizer files and the small d2t table are read.
Each mismatch is one `UserError` naming the field and both values. Checks run in a fixed order
and the first failure is raised; `ignore` waives named checks (e.g. `rope` for a draft trained
with its own RoPE base, which TRT-LLM accepts because the draft's attention is its own).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtbuild.core.errors import UserError
from trtbuild.draft.format import (
    ARCHITECTURE,
    ARCHITECTURE_ALIASES,
    FLOAT_DTYPES,
    INT_DTYPES,
    LAYER_TENSORS,
    TOP_TENSORS,
    DraftCheckpoint,
    default_aux_layers,
    read_draft,
)

CHECKS = ("architecture", "tensors", "hidden_size", "aux_layers", "fc", "vocab", "draft_vocab", "lm_head",
          "d2t", "heads", "head_dim", "mlp", "rope", "tokenizer", "dtype")


@dataclass
class TargetInfo:
    """What the checks need from the target: its (text) config and tokenizer fingerprint."""

    directory: Path
    config: dict[str, Any]
    tokenizer_hash: str | None

    @classmethod
    def read(cls, directory: Path) -> TargetInfo:
        config = json.loads((Path(directory) / "config.json").read_text())
        text = config.get("text_config") or config
        return cls(Path(directory), text, tokenizer_fingerprint(Path(directory)))

    @property
    def hidden_size(self) -> int:
        return int(self.config["hidden_size"])

    @property
    def num_layers(self) -> int:
        return int(self.config["num_hidden_layers"])

    @property
    def vocab_size(self) -> int:
        return int(self.config["vocab_size"])

    @property
    def head_dim(self) -> int:
        return int(self.config.get("head_dim") or self.hidden_size // int(self.config["num_attention_heads"]))

    @property
    def num_kv_heads(self) -> int:
        return int(self.config.get("num_key_value_heads") or self.config["num_attention_heads"])


def tokenizer_fingerprint(directory: Path) -> str | None:
    """sha256 of the token -> id map (vocab plus added tokens), or None when no tokenizer files exist.

    Hashing the map rather than the file ignores formatting and unrelated settings (templates,
    padding side), so a copied or re-saved tokenizer matches its original.
    """
    tokenizer_json = directory / "tokenizer.json"
    if tokenizer_json.is_file():
        data = json.loads(tokenizer_json.read_text())
        model = data.get("model") or {}
        vocab = model.get("vocab")
        if isinstance(vocab, dict):
            entries: Any = sorted(vocab.items(), key=lambda kv: kv[1])
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            entries = [piece[0] if isinstance(piece, list) else piece for piece in vocab]
        else:
            entries = None
        added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [])
        payload = json.dumps({"vocab": entries, "added": added}, ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()
    for name in ("tokenizer.model", "vocab.json", "tokenizer.tiktoken"):
        file = directory / name
        if file.is_file():
            return hashlib.sha256(file.read_bytes()).hexdigest()
    return None


def rope_settings(config: dict[str, Any]) -> tuple[float | None, str, float | None]:
    """(theta, rope type, scaling factor) from legacy (`rope_theta`, `rope_scaling`) or
    transformers-5 (`rope_parameters`) keys."""
    params = config.get("rope_parameters") if isinstance(config.get("rope_parameters"), dict) else None
    scaling = config.get("rope_scaling") if isinstance(config.get("rope_scaling"), dict) else None
    theta = config.get("rope_theta")
    for block in (params, scaling):
        if theta is None and block and block.get("rope_theta") is not None:
            theta = block["rope_theta"]
    kind, factor = "default", None
    for block in (scaling, params):
        if block and (block.get("rope_type") or block.get("type")):
            kind = str(block.get("rope_type") or block.get("type"))
            factor = block.get("factor")
            break
    theta_value = float(theta) if theta is not None else None
    return theta_value, kind, (float(factor) if factor is not None else None)


class _Checker:
    def __init__(self, draft: DraftCheckpoint, target: TargetInfo, where: str) -> None:
        self.draft = draft
        self.target = target
        self.cfg = draft.config
        self.where = where
        self.file = str(draft.directory / "config.json")

    def fail(self, field: str, message: str, fix: str | None = None) -> None:
        raise UserError(message, file=self.file, field=f"draft.{field}", fix=fix)

    # Each check raises on the first problem it finds.

    def architecture(self) -> None:
        archs = self.cfg.get("architectures") or []
        if not any(a in ARCHITECTURE_ALIASES for a in archs):
            self.fail("architectures", f"architectures {archs} (draft) is not an EAGLE-3 Llama draft "
                      f"(expected {ARCHITECTURE})", fix="use a LlamaForCausalLMEagle3 checkpoint")
        layers = self.cfg.get("num_hidden_layers", 1)
        if layers != 1:
            self.fail("num_hidden_layers", f"num_hidden_layers {layers} (draft) != 1 (EAGLE-3 drafts have "
                      "one decoder layer)")

    def tensors(self) -> None:
        if self.draft.layer_prefix is None:
            self.fail("tensors", "no decoder layer tensors (layers.0.* or midlayer.*) in the draft")
        for name in TOP_TENSORS:
            if self.draft.tensor(name) is None:
                self.fail("tensors", f"tensor {name} missing from the draft")
        for name in LAYER_TENSORS:
            if self.draft.layer_tensor(name) is None:
                self.fail("tensors", f"tensor {self.draft.layer_prefix}{name} missing from the draft")

    def hidden_size(self) -> None:
        draft_hidden = self.cfg.get("hidden_size")
        if draft_hidden != self.target.hidden_size:
            self.fail("hidden_size", f"hidden_size {draft_hidden} (draft) != {self.target.hidden_size} "
                      "(target)", fix="use a draft trained for this target")
        declared = self.cfg.get("target_hidden_size")
        if declared is not None and declared != self.target.hidden_size:
            self.fail("target_hidden_size", f"target_hidden_size {declared} (draft) != hidden_size "
                      f"{self.target.hidden_size} (target)")

    def _aux(self) -> list[int]:
        ids = self.draft.aux_layer_ids()
        return ids if ids is not None else default_aux_layers(self.target.num_layers)

    def aux_layers(self) -> None:
        ids = self._aux()
        if not ids:
            self.fail("eagle_aux_hidden_state_layer_ids", "eagle_aux_hidden_state_layer_ids is empty (draft)")
        bad = [i for i in ids if not 0 <= int(i) < self.target.num_layers]
        if bad:
            self.fail("eagle_aux_hidden_state_layer_ids",
                      f"aux layer id {bad[0]} (draft, ids {ids}) is outside the target's "
                      f"{self.target.num_layers} layers (0..{self.target.num_layers - 1})",
                      fix="use a draft trained for this target's depth")
        if len(set(ids)) != len(ids):
            self.fail("eagle_aux_hidden_state_layer_ids", f"aux layer ids {ids} (draft) repeat a layer")

    def fc(self) -> None:
        shape = self.draft.tensor("fc.weight").shape  # type: ignore[union-attr]
        ids = self._aux()
        expected = [self.target.hidden_size, len(ids) * self.target.hidden_size]
        if shape[1] != expected[1]:
            self.fail("fc.weight", f"fc.weight input width {shape[1]} (draft) != len(aux layers) "
                      f"{len(ids)} x hidden_size {self.target.hidden_size} = {expected[1]} (target)",
                      fix="the draft was trained with other aux layers or another target")
        if shape[0] != expected[0]:
            self.fail("fc.weight", f"fc.weight output width {shape[0]} (draft) != hidden_size "
                      f"{self.target.hidden_size} (target)")

    def vocab(self) -> None:
        vocab = self.cfg.get("vocab_size")
        if vocab != self.target.vocab_size:
            self.fail("vocab_size", f"vocab_size {vocab} (draft) != {self.target.vocab_size} (target)",
                      fix="use a draft trained with this target's tokenizer")

    def draft_vocab(self) -> None:
        size = self.draft.draft_vocab_size()
        if not 0 < size <= self.target.vocab_size:
            self.fail("draft_vocab_size", f"draft_vocab_size {size} (draft) must be in 1..vocab_size "
                      f"{self.target.vocab_size} (target)")

    def lm_head(self) -> None:
        size = self.draft.draft_vocab_size()
        head = self.draft.tensor("lm_head.weight")
        if head is None:
            if size != self.target.vocab_size:
                self.fail("lm_head.weight", f"no lm_head.weight but draft_vocab_size {size} (draft) != "
                          f"vocab_size {self.target.vocab_size} (target)")
            return
        if head.shape != [size, self.target.hidden_size]:
            self.fail("lm_head.weight", f"lm_head.weight shape {head.shape} (draft) != [draft_vocab_size "
                      f"{size}, hidden_size {self.target.hidden_size}] (target)")

    def d2t(self) -> None:
        size = self.draft.draft_vocab_size()
        info = self.draft.tensor("d2t")
        if size == self.target.vocab_size:
            return  # full vocabulary: d2t is optional (all zeros when present)
        if info is None:
            self.fail("d2t", f"d2t missing but draft_vocab_size {size} (draft) < vocab_size "
                      f"{self.target.vocab_size} (target)", fix="export the draft with its d2t table")
        if info.shape != [size] or info.dtype not in INT_DTYPES:
            self.fail("d2t", f"d2t is {info.dtype}{info.shape} (draft), expected int64[{size}] "  # type: ignore[union-attr]
                      "(draft_vocab_size)")
        import torch

        d2t = self.draft.load_tensor("d2t").to(torch.int64)
        target_ids = torch.arange(size, dtype=torch.int64) + d2t
        low, high = int(target_ids.min()), int(target_ids.max())
        if low < 0 or high >= self.target.vocab_size:
            bad = low if low < 0 else high
            self.fail("d2t", f"d2t maps a draft token to target id {bad} (draft), outside vocab_size "
                      f"{self.target.vocab_size} (target)", fix="recalibrate the draft vocabulary")
        if int(torch.unique(target_ids).numel()) != size:
            self.fail("d2t", f"d2t maps {size} draft tokens onto {int(torch.unique(target_ids).numel())} "
                      "target ids (draft); the mapping must be one-to-one")

    def heads(self) -> None:
        heads = int(self.cfg.get("num_attention_heads") or 0)
        kv = int(self.cfg.get("num_key_value_heads") or heads)
        if heads <= 0 or kv <= 0 or heads % kv:
            self.fail("num_attention_heads", f"num_attention_heads {heads} is not a multiple of "
                      f"num_key_value_heads {kv} (draft)")
        if kv != self.target.num_kv_heads:
            # TRT-LLM's one-model EAGLE-3 keeps the draft layer's KV in the target's KV cache.
            self.fail("num_key_value_heads", f"num_key_value_heads {kv} (draft) != "
                      f"{self.target.num_kv_heads} (target); TRT-LLM keeps the draft's KV in the "
                      "target's cache")
        head_dim = self._head_dim()
        q = self.draft.layer_tensor("self_attn.q_proj.weight").shape  # type: ignore[union-attr]
        k = self.draft.layer_tensor("self_attn.k_proj.weight").shape  # type: ignore[union-attr]
        width = 2 * self.target.hidden_size  # first layer attends over [embeds, hidden]
        if q != [heads * head_dim, width]:
            self.fail("num_attention_heads", f"q_proj.weight shape {q} (draft) != [num_attention_heads "
                      f"{heads} x head_dim {head_dim}, 2 x hidden_size {self.target.hidden_size}] "
                      "(config/target)")
        if k != [kv * head_dim, width]:
            self.fail("num_key_value_heads", f"k_proj.weight shape {k} (draft) != [num_key_value_heads "
                      f"{kv} x head_dim {head_dim}, 2 x hidden_size {self.target.hidden_size}] "
                      "(config/target)")

    def _head_dim(self) -> int:
        heads = int(self.cfg.get("num_attention_heads") or 1)
        return int(self.cfg.get("head_dim") or int(self.cfg.get("hidden_size") or 0) // heads)

    def head_dim(self) -> None:
        if self._head_dim() != self.target.head_dim:
            self.fail("head_dim", f"head_dim {self._head_dim()} (draft) != {self.target.head_dim} (target); "
                      "TRT-LLM keeps the draft's KV in the target's cache")

    def mlp(self) -> None:
        inter = self.cfg.get("intermediate_size")
        gate = self.draft.layer_tensor("mlp.gate_proj.weight").shape  # type: ignore[union-attr]
        if gate != [inter, self.target.hidden_size]:
            self.fail("intermediate_size", f"mlp.gate_proj.weight shape {gate} (draft) != [intermediate_size "
                      f"{inter}, hidden_size {self.target.hidden_size}]")

    def rope(self) -> None:
        d_theta, d_kind, d_factor = rope_settings(self.cfg)
        t_theta, t_kind, t_factor = rope_settings(self.target.config)
        if d_theta is not None and t_theta is not None and abs(d_theta - t_theta) > 1e-6 * t_theta:
            self.fail("rope_theta", f"rope_theta {d_theta:g} (draft) != {t_theta:g} (target)",
                      fix="use a draft trained with the target's RoPE, or add `rope` to draft.compat_ignore")
        if d_kind != t_kind or d_factor != t_factor:
            self.fail("rope_scaling", f"rope scaling {d_kind}/{d_factor} (draft) != {t_kind}/{t_factor} "
                      "(target)", fix="use a draft trained with the target's RoPE, or add `rope` to "
                      "draft.compat_ignore")

    def tokenizer(self) -> None:
        draft_hash = tokenizer_fingerprint(self.draft.directory)
        if draft_hash is None or self.target.tokenizer_hash is None:
            return  # published drafts often ship no tokenizer; vocab_size and d2t were checked
        if draft_hash != self.target.tokenizer_hash:
            self.fail("tokenizer", f"tokenizer vocab hash {draft_hash[:12]} (draft) != "
                      f"{self.target.tokenizer_hash[:12]} (target)",
                      fix="the draft was trained with another tokenizer")

    def dtype(self) -> None:
        declared = self.cfg.get("torch_dtype") or self.cfg.get("dtype")
        if declared not in FLOAT_DTYPES.values():
            self.fail("torch_dtype", f"torch_dtype {declared!r} (draft) is not one of "
                      f"{sorted(FLOAT_DTYPES.values())}")
        if self.cfg.get("quantization_config"):
            return  # quantized drafts carry fp8 weights and fp32 scales
        for name, info in sorted(self.draft.tensors.items()):
            if name in ("d2t", "t2d"):  # index tables (int64 d2t; the EAGLE authors' bool t2d mask)
                continue
            actual = FLOAT_DTYPES.get(info.dtype)
            if actual != declared:
                self.fail("torch_dtype", f"tensor {name} is {info.dtype} but torch_dtype is {declared} "
                          "(draft)")


def check_compatible(draft_dir: Path, target_dir: Path, *, ignore: Iterable[str] = (),
                     where: str = "draft.path") -> DraftCheckpoint:
    """Raise a one-line UserError on the first mismatch; return the read draft when it fits."""
    unknown = sorted(set(ignore) - set(CHECKS))
    if unknown:
        raise UserError(f"unknown compatibility check {unknown[0]!r}; known: {', '.join(CHECKS)}",
                        field="draft.compat_ignore")
    draft = read_draft(Path(draft_dir), where)
    target = TargetInfo.read(Path(target_dir))
    checker = _Checker(draft, target, where)
    skipped = set(ignore)
    for name in CHECKS:
        if name not in skipped:
            check: Callable[[], None] = getattr(checker, name)
            check()
    return draft
