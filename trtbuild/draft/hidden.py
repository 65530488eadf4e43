"""Offline EAGLE-3 training: the target's hidden states computed once into a shard set, read back per batch.

What ModelOpt's offline path consumes (nvidia-modelopt 0.47.0 as installed; upstream
modelopt/torch/speculative/plugins/hf_eagle.py@1857500a8e2ba2b889aec22427dce0a3eac1651b): with
`eagle_offline: true`, `HFEagleModel.modify` drops the base model's decoder layers and `forward`
reads `base_model_outputs` (plugins/modeling_eagle.py `EagleBaseModelOutput.from_offline_dict`):
`aux_hidden_states` [B, T, k*H] (the outputs of the k captured layers, concatenated in layer order,
as its online forward hooks collect them), `base_model_hidden_states` [B, T, H] (the last entry of
`hidden_states`, after the final norm: 0.47's `_maybe_apply_base_final_norm` leaves a post-norm
capture as it is), optional `base_model_logits` (absent: `lm_head(base_model_hidden_states)`) and
optional `base_model_input_embeds` (absent: the embeddings of `input_ids`). So a shard stores the
first two and the token ids, and training loads the target's embeddings, final norm and lm_head only.

Shard i of the dump is shard i of the data set (the same rows), so shards are independent by index
(any process may compute any of them). Key: the data set's key, the captured layers, the storage
dtype and this code; never a training setting. Reading the shards back for training lives in
trtbuild/draft/hidden_store.py, so editing the training side leaves the dump's key alone.

The dump runs the decoder only: the final hidden state is the decoder's output (post-norm, what
`hidden_states[-1]` is), so the lm_head and its [rows, T, vocab] logits are never computed (1.24x on
SmolLM2, 49k vocabulary, the same bits). A bfloat16 store is computed in bfloat16 too: on a GPU the
target is loaded in bf16; on CPU the float32 target runs under bf16 autocast (2.21x over the whole
LM in float32 on this CPU's AVX512-BF16). Against float32 compute on SmolLM2 the target's top-1 from the stored final
state agrees on 99.4 % of tokens (storing float32's result as bf16: 99.8 %; bench/draft_hidden_dump.py).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.core.code_version import code_version
from trtbuild.core.layout import DRAFT_HIDDEN
from trtbuild.draft import shards
from trtbuild.draft.shards import ShardSet

if TYPE_CHECKING:
    import torch
    from torch import nn

    from trtbuild.core.progress import Progress

AUX = "aux_hidden_states"
FINAL = "base_model_hidden_states"
IDS = "input_ids"
_BYTES = {"float32": 4, "bfloat16": 2}
_HEADER_BYTES = 512  # a shard's safetensors header (three tensors' names, shapes, offsets), about
FORWARD_ROWS = 16  # sequences per target forward in the dump


def hidden_key(data_key: str, aux_layers: list[int], dtype: str) -> str:
    material = [data_key, sorted(aux_layers), dtype, code_version(__name__)]
    return hashlib.sha256(json.dumps(material).encode()).hexdigest()[:24]


def estimate_bytes(rows: int, seq_len: int, n_aux: int, hidden: int, dtype: str, shard_rows: int) -> int:
    """Disk of the dump: rows x tokens x (k captured + 1 final) layers x hidden x bytes, plus the token
    ids (int64) and each shard's header."""
    tokens = rows * seq_len
    return tokens * (n_aux + 1) * hidden * _BYTES[dtype] + tokens * 8 + shards.shard_count(rows, shard_rows) * \
        _HEADER_BYTES


def ensure_hidden(data: ShardSet, target_dir: Path, aux_layers: list[int], dtype: str,
                  progress: Progress) -> ShardSet:
    """The hidden-state shard set of `data`'s pool: from the cache, or computed now (resuming)."""
    key = hidden_key(data.key, aux_layers, dtype)
    data_meta = shards.read_meta(data.path)
    count = int(data_meta["shards"])

    def write(work: Path, todo: list[int]) -> dict[str, Any]:
        target: nn.Module | None = None
        with progress.task("draft: dumping hidden states", len(todo)) as bar:
            for index in todo:
                if target is None:
                    target = _dump_target(target_dir)
                ids = _data_shard(data.path, index)
                tensors = capture(target, ids, aux_layers, compute=dtype)
                write_dump_shard(work, index, {IDS: ids, AUX: tensors[AUX].to(_dtype(dtype)),
                                               FINAL: tensors[FINAL].to(_dtype(dtype))})
                bar.advance(1)
        return {"kind": DRAFT_HIDDEN, "data": data.key, "rows": data_meta["rows"], "seq_len": data_meta["seq_len"],
                "shards": count, "shard_samples": data_meta["shard_samples"], "aux_layers": sorted(aux_layers),
                "dtype": dtype}

    return shards.make_set(DRAFT_HIDDEN, key, count, "draft hidden states", progress, write)


def write_dump_shard(directory: Path, index: int, tensors: dict[str, torch.Tensor]) -> Path:
    return shards.write_shard(directory, index, tensors)


def _dump_target(target_dir: Path) -> nn.Module:
    """The whole target, once: float32 on CPU; on a GPU host bfloat16 on CUDA (not run here: no GPU)."""
    import torch

    from trtbuild.draft.data import load_target

    if torch.cuda.is_available():
        return load_target(target_dir, dtype=torch.bfloat16).to("cuda")
    return load_target(target_dir)


def _data_shard(data_entry: Path, index: int) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(str(data_entry / shards.shard_name(index)))["input_ids"]


def _dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def capture(target: nn.Module, input_ids: torch.Tensor, aux_layers: list[int],
            compute: str = "float32") -> dict[str, torch.Tensor]:
    """The captured layers' outputs (concatenated in layer order) and the final hidden state, as
    ModelOpt's online forward takes them (forward hooks on the decoder layers; hidden_states[-1]).
    `compute: bfloat16` runs a float32 target under bf16 autocast (a bf16 target runs as it is)."""
    import contextlib

    import torch

    decoder = target.get_decoder()
    layers = decoder.layers
    device = next(target.parameters()).device
    autocast = (torch.autocast(device.type, dtype=torch.bfloat16) if compute == "bfloat16"
                else contextlib.nullcontext())
    captured: list[torch.Tensor] = []

    def hook(module: nn.Module, args: Any, output: Any) -> None:
        captured.append((output if isinstance(output, torch.Tensor) else output[0]).detach())

    handles = [layers[i].register_forward_hook(hook) for i in sorted(aux_layers)]
    aux, final = [], []
    try:
        with torch.no_grad(), autocast:
            for start in range(0, len(input_ids), FORWARD_ROWS):
                captured.clear()
                rows = input_ids[start:start + FORWARD_ROWS].to(device)
                out = decoder(input_ids=rows)  # the decoder alone: no lm_head, no logits
                aux.append(torch.cat(captured, dim=-1).float().cpu())
                final.append(out.last_hidden_state.float().cpu())
    finally:
        for handle in handles:
            handle.remove()
    return {AUX: torch.cat(aux), FINAL: torch.cat(final)}
