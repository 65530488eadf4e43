"""The tile-shuffled FP8 weight layout, and applying it to a checkpoint's state dict.

A weight W [N, K] (float8_e4m3fn) is zero-padded to [NT*BN, KT*BK] and stored as
[NT, KT, BN, BK]: tile (n, k) is BN*BK contiguous bytes, and the KT tiles of one row block
follow each other. A program that owns row block n and a run of K tiles therefore streams one
contiguous byte range with 16-byte (or TMA) loads, and consecutive programs stream consecutive
ranges. Padding is zeros, so padded K columns add nothing; padded N rows are never stored.

In a state dict, `<p>.weight` becomes the 4-D tensor and `<p>.weight_layout` (int32 [4] =
N, K, BN, BK) records the original shape and the tiles, so the file alone can be undone.
"""

from __future__ import annotations

import torch

from . import LAYOUT_ID
from .errors import UserError

LAYOUT_SUFFIX = "_layout"  # "<prefix>.weight" -> "<prefix>.weight_layout"
FP8 = torch.float8_e4m3fn


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def shuffle(w: torch.Tensor, block_n: int, block_k: int) -> torch.Tensor:
    """[N, K] -> [NT, KT, BN, BK] (zero-padded, contiguous)."""
    if w.dim() != 2:
        raise ValueError(f"shuffle expects a 2-D weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    nt, kt = cdiv(n, block_n), cdiv(k, block_k)
    # Pad through a uint8 view: zero bytes are +0.0 in e4m3, and pad() has no fp8 kernels on CPU.
    raw = w.contiguous().view(torch.uint8)
    raw = torch.nn.functional.pad(raw, (0, kt * block_k - k, 0, nt * block_n - n))
    tiles = raw.view(nt, block_n, kt, block_k).permute(0, 2, 1, 3).contiguous()
    return tiles.view(w.dtype)


def unshuffle(w4: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """[NT, KT, BN, BK] -> [N, K] (drops the padding)."""
    if w4.dim() != 4:
        raise ValueError(f"unshuffle expects a 4-D tiled weight, got shape {tuple(w4.shape)}")
    nt, kt, bn, bk = w4.shape
    if nt * bn < n or kt * bk < k:
        raise ValueError(f"tiled weight {tuple(w4.shape)} is smaller than [{n}, {k}]")
    raw = w4.view(torch.uint8).permute(0, 2, 1, 3).reshape(nt * bn, kt * bk)
    return raw[:n, :k].contiguous().view(w4.dtype)


def tiles_of(w4: torch.Tensor) -> tuple[int, int]:
    """(BLOCK_N, BLOCK_K) of a shuffled weight."""
    return int(w4.shape[2]), int(w4.shape[3])


def is_fp8_linear(name: str, tensor: torch.Tensor, state_dict: dict[str, torch.Tensor]) -> bool:
    """A ModelOpt FP8 linear weight: 2-D e4m3 `<p>.weight` with a per-tensor `<p>.weight_scale`."""
    return (name.endswith(".weight") and tensor.dtype == FP8 and tensor.dim() == 2
            and name + "_scale" in state_dict)


def transform_state_dict(state_dict: dict[str, torch.Tensor], block_n: int, block_k: int,
                         plugin: str) -> dict[str, torch.Tensor]:
    """Shuffle every FP8 linear weight; leave every other tensor as it is (same objects).

    Idempotent for the same tiles (plugins sharing this layout may both ask for it).
    """
    out: dict[str, torch.Tensor] = {}
    found = 0
    for name, tensor in state_dict.items():
        if name.endswith(".weight" + LAYOUT_SUFFIX):
            have = tuple(int(v) for v in tensor.tolist()[2:])
            if have != (block_n, block_k):
                raise UserError(f"{name}: weights already shuffled with tiles {have[0]}x{have[1]}, "
                                f"{plugin} wants {block_n}x{block_k}",
                                fix="transform the unshuffled FP8 checkpoint once, for one arch")
            found += 1
            out[name] = tensor
            continue
        if name.endswith(".weight") and name + LAYOUT_SUFFIX in state_dict:
            out[name] = tensor  # already in this layout (checked above)
            continue
        if is_fp8_linear(name, tensor, state_dict):
            scale = state_dict[name + "_scale"]
            if scale.numel() != 1:
                raise UserError(f"{name}_scale has {scale.numel()} values; {plugin} needs per-tensor "
                                "FP8 scales", fix="quantize with ModelOpt FP8_DEFAULT_CFG (per-tensor)")
            n, k = tensor.shape
            out[name] = shuffle(tensor, block_n, block_k)
            out[name + LAYOUT_SUFFIX] = torch.tensor([n, k, block_n, block_k], dtype=torch.int32)
            found += 1
        else:
            out[name] = tensor
    if not found:
        raise UserError(f"{plugin} found no FP8 linear weights (float8_e4m3fn '.weight' with a "
                        "'.weight_scale') in the checkpoint",
                        fix="put a quantize stage with FP8 before the engine stage, or drop the plugin")
    return out


def untransform_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Undo transform_state_dict: 4-D weights back to [N, K], layout records dropped."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        if name.endswith(".weight" + LAYOUT_SUFFIX):
            continue
        record = state_dict.get(name + LAYOUT_SUFFIX)
        if record is not None:
            n, k = (int(v) for v in record.tolist()[:2])
            out[name] = unshuffle(tensor, n, k)
        else:
            out[name] = tensor
    return out


def header_metadata(arch: str, block_n: int, block_k: int, plugin: str) -> dict[str, str]:
    """Safetensors header entries (str -> str) describing the layout of the file's weights."""
    return {
        "trtbuild.weight_layout": LAYOUT_ID,
        "trtbuild.weight_layout.arch": arch,
        "trtbuild.weight_layout.block_n": str(block_n),
        "trtbuild.weight_layout.block_k": str(block_k),
        "trtbuild.weight_layout.plugin": plugin,
    }
