"""FSDP2-sharded models built without any rank holding all of them.

Each rank holds 1/world of every decoder layer (`torch.distributed.fsdp.fully_shard` per layer, one
device mesh over all ranks); a layer's forward all-gathers its weights and frees them after
(reshard_after_forward). Embeddings, final norm and lm_head stay whole on every rank. The model is
built with its parameters on the meta device, sharded, then each rank allocates its own shards and reads
just those rows from the safetensors files (`safe_open(...).get_slice`: a memory-mapped read of the
rows asked for). Used by the draft stage's sharded target (trtbuild/draft/sharded_load.py) and the
quantize stage's calibration ranks (trtbuild/quantize/distributed.py).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn


def target_layers(model: nn.Module) -> nn.ModuleList:
    """The target's decoder layers: the first `layers` ModuleList outside the EAGLE module."""
    for name, module in model.named_modules():
        if name.split(".")[-1] == "layers" and isinstance(module, nn.ModuleList) and "eagle_module" not in name:
            return module
    raise ValueError("no decoder-layer list (`layers`) found in the target")


def shard_target(model: nn.Module, device_type: str) -> dict[str, int]:
    """fully_shard every target decoder layer over all ranks (each layer's shards move to this rank's
    device). Returns the target's decoder-layer parameter count, whole and held by this rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device_type, (dist.get_world_size(),))
    layers = target_layers(model)
    whole = sum(p.numel() for p in layers.parameters())
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    return {"target_layer_parameters": whole, "target_layer_parameters_per_rank": held(layers)}


def held(module: nn.Module) -> int:
    """Parameter elements this rank stores (a sharded DTensor counts its local shard)."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in module.parameters())


# Checkpoints may hold a text model under the multimodal wrapper's prefix (Llama 4).
CHECKPOINT_PREFIXES = ("", "language_model.")


def materialize(model: nn.Module, device: torch.device) -> None:
    """Storage for every meta parameter (a sharded one gets its local shard only); real buffers keep
    their values. A meta buffer outside the checkpoint could not be filled, so it is an error."""
    for name, module in model.named_modules():
        if not any(p.is_meta for p in module.parameters(recurse=False)):
            continue
        buffers = {n: b for n, b in module.named_buffers(recurse=False) if b is not None}
        module.to_empty(device=device, recurse=False)
        for buffer_name, value in buffers.items():
            if value.is_meta:
                raise RuntimeError(f"{name}.{buffer_name} has no value to restore after materializing")
            setattr(module, buffer_name, value.to(device))


def _shard_rows(param: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the local tensor to fill, its first row in the full tensor). FSDP2 shards dim 0 with
    torch.chunk's split: ceil(rows / world) rows per rank, the last ranks short or empty."""
    if not hasattr(param, "to_local"):
        return param.data, 0
    from torch.distributed.tensor import Shard

    local = param.to_local()
    placements = tuple(param.placements)
    if placements != (Shard(0),):
        raise RuntimeError(f"unexpected sharding {placements} (FSDP2 shards dim 0)")
    rank, world = param.device_mesh.get_local_rank(), param.device_mesh.size()
    per_rank = -(-param.shape[0] // world)
    start = min(rank * per_rank, param.shape[0])
    if local.shape[0] != min(per_rank, param.shape[0] - start):
        raise RuntimeError(f"local shard of {tuple(param.shape)} has {local.shape[0]} rows, expected "
                           f"{min(per_rank, param.shape[0] - start)} from row {start}")
    return local, start


def _tensor_files(target_dir: Path) -> dict[str, Path]:
    from safetensors import safe_open

    index = target_dir / "model.safetensors.index.json"
    if index.is_file():
        return {name: target_dir / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    where: dict[str, Path] = {}
    for path in sorted(target_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            where.update({name: path for name in f.keys()})  # noqa: SIM118 (safe_open has no __iter__)
    return where


def read_target_weights(model: nn.Module, target_dir: Path) -> int:
    """Fills every target parameter and persistent buffer (outside the draft) with its rows of the
    checkpoint; returns the bytes read. A tensor the checkpoint lacks is an error naming it."""
    from safetensors import safe_open

    where = _tensor_files(target_dir)
    wanted = dict(model.named_parameters())
    persistent = set(model.state_dict())
    wanted.update({n: b for n, b in model.named_buffers() if n in persistent})
    read = 0
    opened: dict[Path, Any] = {}
    with contextlib.ExitStack() as files, torch.no_grad():
        for name, tensor in wanted.items():
            if name.startswith("eagle_module."):
                continue
            key = next((p + name for p in CHECKPOINT_PREFIXES if p + name in where), None)
            if key is None:
                raise RuntimeError(f"the checkpoint in {target_dir} has no tensor {name!r}")
            file = where[key]
            if file not in opened:
                opened[file] = files.enter_context(safe_open(str(file), framework="pt"))
            local, start = _shard_rows(tensor)
            rows = (opened[file].get_slice(key)[start:start + local.shape[0]] if local.dim()
                    else opened[file].get_tensor(key))
            local.copy_(rows.to(local.dtype))
            read += rows.numel() * rows.element_size()
    return read
