"""Offline EAGLE-3 training's side of the hidden-state shards (trtbuild/draft/hidden.py makes them):
the head-only target and the rows of a shard set as ModelOpt's offline forward takes them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trtbuild.draft import shards
from trtbuild.draft.hidden import AUX, FINAL, IDS

if TYPE_CHECKING:
    import torch
    from torch import nn


def load_head_only(target_dir: Path, dtype: Any = None) -> nn.Module:
    """The target without its decoder layers: embeddings, final norm and lm_head, read from its
    safetensors (the layers' tensors are never loaded; ModelOpt 0.37 needs one: modelopt_compat).
    What offline training needs of it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging

    from trtbuild.draft import modelopt_compat

    config = AutoConfig.from_pretrained(str(target_dir))
    text = config.get_text_config()
    keep = modelopt_compat.offline_base_layers()
    text.num_orig_hidden_layers = text.num_hidden_layers  # ModelOpt reads it when layers are gone
    text.num_hidden_layers = keep
    if isinstance(getattr(text, "layer_types", None), list):
        text.layer_types = text.layer_types[:keep]
    verbosity = logging.get_verbosity()
    logging.set_verbosity_error()  # "weights not used": the decoder layers, on purpose
    try:
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), config=config,
                                                     dtype=dtype or torch.float32, use_safetensors=True)
    finally:
        logging.set_verbosity(verbosity)
    model.eval()
    return model


class HiddenStore:
    """Rows of a hidden-state shard set, read per batch (safetensors slices: only those rows)."""

    def __init__(self, entry: Path) -> None:
        self.entry = entry
        self.meta = shards.read_meta(entry)
        self.shard_rows = int(self.meta["shard_samples"])
        self._open: dict[int, Any] = {}

    def _shard(self, index: int) -> Any:
        from safetensors import safe_open

        if index not in self._open:
            self._open[index] = safe_open(str(self.entry / shards.shard_name(index)), framework="pt")
        return self._open[index]

    def input_ids(self) -> torch.Tensor:
        import torch

        return torch.cat([self._shard(i).get_tensor(IDS) for i in range(int(self.meta["shards"]))])

    def batch(self, rows: torch.Tensor, device: Any = "cpu") -> dict[str, Any]:
        """Model kwargs for these pool rows: input_ids and base_model_outputs (float32)."""
        import torch

        parts: dict[str, list[torch.Tensor]] = {IDS: [], AUX: [], FINAL: []}
        for row in rows.tolist():
            shard, offset = divmod(row, self.shard_rows)
            handle = self._shard(shard)
            for name in parts:
                parts[name].append(handle.get_slice(name)[offset:offset + 1])
        ids = torch.cat(parts[IDS]).to(device)
        outputs = {name: torch.cat(parts[name]).to(device=device, dtype=torch.float32) for name in (AUX, FINAL)}
        return {"input_ids": ids, "base_model_outputs": outputs}


def batches(store: HiddenStore, device: Any = "cpu") -> Callable[[torch.Tensor], dict[str, Any]]:
    return lambda rows: store.batch(rows, device)
