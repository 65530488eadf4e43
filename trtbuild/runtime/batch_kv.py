"""A KV cache for a batch whose sequences come and go: one slot per sequence, compacted, growing.

[layers, 2 (k, v), slots, kv_heads, capacity, head_dim]. The sequences decoded together occupy
slots [0, n) so every batched forward reads a view of the cache, never a gathered copy; when a
sequence leaves, the last one moves into its slot. Each sequence has its own committed length
(kept by its owner); rows past it are scratch that the next forward overwrites before reading.
"""

from __future__ import annotations

import torch


class BatchKV:
    def __init__(self, num_layers: int, slots: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device | str = "cpu", capacity: int = 64) -> None:
        self.shape = (num_layers, 2, slots, kv_heads)
        self.head_dim = head_dim
        self.dtype = dtype
        self.device = torch.device(device)
        # Zeros, not empty: a masked row gets weight exactly 0, but 0 * NaN garbage would be NaN.
        self.data = torch.zeros(*self.shape, capacity, head_dim, dtype=dtype, device=device)

    @property
    def slots(self) -> int:
        return self.shape[2]

    @property
    def capacity(self) -> int:
        return self.data.shape[4]

    def ensure(self, needed: int) -> None:
        """Room for cache rows [0, needed) in every slot (doubling, so growth is amortized)."""
        if needed <= self.capacity:
            return
        capacity = max(needed, 2 * self.capacity)
        grown = torch.zeros(*self.shape, capacity, self.head_dim, dtype=self.dtype, device=self.device)
        grown[:, :, :, :, : self.capacity].copy_(self.data)
        self.data = grown

    def view(self, lo: int, hi: int) -> torch.Tensor:
        """Slots [lo, hi) of every layer: [layers, 2, hi-lo, kv_heads, capacity, head_dim] (a view)."""
        return self.data[:, :, lo:hi]

    def move(self, src: int, dst: int, length: int) -> None:
        """Copies the first `length` rows of slot `src` into slot `dst` (compaction)."""
        if src != dst and length:
            self.data[:, :, dst, :, :length].copy_(self.data[:, :, src, :, :length])
