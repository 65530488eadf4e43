"""The FSDP2-sharded target of online draft training, built without any rank holding all of it.

Loading the whole checkpoint on every rank and sharding it afterwards puts one full copy per rank in
host memory (8 per node): for the models sharding exists for, more than a node has. Here the target
is built with its parameters on the meta device (no memory; buffers such as RoPE's inverse
frequencies are computed for real), converted to EAGLE-3 and sharded there (draft/sharding.py);
then each rank allocates its own shards and reads just those rows from the safetensors files
(`safe_open(...).get_slice`: a memory-mapped read of the rows asked for). Embeddings, final norm and
lm_head stay whole (see sharding.py) and are read whole. The draft starts from the stage's init
weights, as in the unsharded path.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trtbuild.draft.model import convert_to_eagle3
from trtbuild.draft.sharding import shard_target

# Checkpoints may hold a text model under the multimodal wrapper's prefix (Llama 4).
CHECKPOINT_PREFIXES = ("", "language_model.")


def build_sharded_target(target_dir: Path, dtype: torch.dtype, arch: Any, init: dict[str, torch.Tensor],
                         device: str) -> tuple[nn.Module, dict[str, int]]:
    """The converted model with its decoder layers FSDP2-sharded over the default process group,
    target weights read shard by shard, the draft loaded from `init`. Returns it and what this rank
    read (target_bytes_read_per_rank) next to the shard counts of sharding.shard_target."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(target_dir))
    with init_empty_weights():  # parameters on meta, buffers real
        target = AutoModelForCausalLM.from_config(config, dtype=dtype)
    target.eval()
    model = convert_to_eagle3(target, arch, init.get("d2t"))  # its copies from the meta target are no-ops
    stats = shard_target(model, torch.device(device).type)
    materialize(model, torch.device(device))
    model.tie_weights()  # materializing gave a tied head storage of its own; transformers re-ties it
    model.eagle_module.float()  # the draft trains in float32, as in the unsharded path
    model.eagle_module.load_state_dict(init)
    stats["target_bytes_read_per_rank"] = read_target_weights(model, target_dir)
    return model, stats


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
