"""A preallocated KV cache: one tensor for all layers, written in place, never reallocated."""

from __future__ import annotations

import torch


class KVCache:
    """[layers, 2 (k, v), batch, kv_heads, capacity, head_dim].

    Positions [0, length) are committed; a tree or draft forward writes past `length` and the
    caller either commits (`keep`) the accepted rows or simply overwrites them next time.
    """

    def __init__(self, num_layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str = "cpu") -> None:
        # Zeros, not empty: an unwritten row is never attended to, but NaN garbage times a zero
        # attention weight would still be NaN.
        self.data = torch.zeros(num_layers, 2, batch, kv_heads, capacity, head_dim, dtype=dtype,
                                device=device)
        self.capacity = capacity
        self.length = 0

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[index, 0], self.data[index, 1]

    def keep(self, start: int, rows: torch.Tensor) -> None:
        """Moves rows start+rows[i] to start+i (all layers at once); rows ascending."""
        n = rows.shape[0]
        picked = self.data.index_select(4, rows + start)
        self.data[:, :, :, :, start:start + n].copy_(picked)

    def ensure(self, needed: int) -> None:
        if needed > self.capacity:
            raise ValueError(f"KV cache of {self.capacity} positions cannot hold {needed}")
